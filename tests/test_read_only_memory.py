"""Tables over read-only memory (a memmap opened with mode="r"), whatever wraps it, never hand out or write that
memory: a write is refused by name, ``dense()`` is a copy, ``source`` is the caller's read-only array. A write to
such memory would kill the process (SIGSEGV), so each case runs in a child process."""
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

import hmgstore

SETUP = """
import numpy as np, torch, hmgstore, warnings, sys
warnings.simplefilter("ignore")
path = sys.argv[1]
np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4) + 1)
def refused(write):
    try:
        write()
    except (TypeError, ValueError) as err:
        return str(err)
    raise AssertionError("the write was taken")
"""

CASES = {
    "torch tensor over a read-only memmap": """
t = hmgstore.HybridTensor(torch.from_numpy(np.load(path, mmap_mode="r")), "cpu")
assert t.read_only
assert "read-only" in refused(lambda: t.__setitem__([1], 0.0))
d = t.dense(); d[0] = -5
assert t[0][0].item() == 1.0
""",
    "ShardedTensor on the CPU over a read-only memmap": """
s = hmgstore.ShardedTensor(np.load(path, mmap_mode="r"), ["cpu"], gpu_budget=0)
d = s.dense(); d[0] = -5
view = s.on("cpu")
assert view.read_only and s.dense()[0, 0].item() == 1.0
assert "read-only" in refused(lambda: view.__setitem__([1], 0.0))
refused(lambda: view.source.__setitem__(0, 5))  # the caller's read-only array: numpy refuses
d = view.dense(); d[0] = -5
assert view[[0]][0, 0].item() == 1.0
""",
    "a writable torch tensor stays writable": """
t = hmgstore.HybridTensor(torch.arange(8.).view(4, 2), "cpu")
assert not t.read_only
t[[1]] = 7.0
assert t[1].tolist() == [7.0, 7.0]
""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_read_only_memory_is_never_written(case, tmp_path):
    script = textwrap.dedent(SETUP) + textwrap.dedent(CASES[case])
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.npy")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{case}: exit {done.returncode}\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("send", [pickle.dumps, lambda t: ForkingPickler.dumps(t)], ids=["pickle", "forking"])
def test_a_copy_of_a_read_only_table_sent_elsewhere_stays_read_only(send):
    """A read-only numpy source travels as its rows (a private, writable copy): the table rebuilt from them
    refuses writes as the one sent does, rather than taking them into a copy no one else sees."""
    rows = np.arange(20, dtype=np.float32).reshape(10, 2)
    rows.flags.writeable = False
    table = hmgstore.HybridTensor(rows, "cpu")
    copy = pickle.loads(send(table))
    assert copy.read_only and torch.equal(copy[[3]], torch.from_numpy(rows[[3]]))
    with pytest.raises(TypeError, match="read-only"):
        copy[[3]] = torch.zeros(1, 2)
    assert torch.equal(copy.dense(), torch.from_numpy(rows))
