"""A forked child (a DataLoader worker) never runs the destructors of CUDA objects its parent left in cycles."""
import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hmgstore.util import fork_guard

# Garbage in a cycle, holding a CUDA tensor marked used by a side stream, left uncollected at the fork; the child
# collects, and exits with 0 if it lived through it.
SCRIPT = textwrap.dedent("""
    import gc, os, sys
    import torch
    if sys.argv[1] == "hmgstore":
        import hmgstore  # noqa: F401
    gc.disable()
    side = torch.cuda.Stream()

    class Cycle:
        pass

    garbage = Cycle()
    garbage.me, garbage.rows = garbage, torch.arange(1000, device="cuda")
    garbage.rows.record_stream(side)
    del garbage
    torch.cuda.synchronize()
    pid = os.fork()
    if pid == 0:
        gc.enable()
        gc.collect()
        os._exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


def _child_exit(imports: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, imports], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.gpu
def test_a_forked_child_lives_through_collecting_its_parents_cuda_garbage():
    assert _child_exit("hmgstore") == 0
    # Why the fork hook exists: without hmgstore imported the same child dies in the tensor's destructor. If
    # this starts to pass, torch guards it itself and util.device's hook can go.
    assert _child_exit("torch only") == -6  # SIGABRT


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_the_child_freezes_what_it_inherited_only_where_the_parent_had_started_cuda(monkeypatch):
    for started, frozen in ((True, True), (False, False)):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda started=started: started)
        read, write = os.pipe()
        pid = os.fork()  # the registered hooks run around it
        if pid == 0:
            try:
                os.write(write, b"%d%d" % (gc.get_freeze_count() > 0, gc.isenabled()))
            finally:
                os._exit(0)
        os.close(write)
        got = os.read(read, 2)
        os.close(read)
        os.waitpid(pid, 0)
        assert got == (b"11" if frozen else b"01"), started  # and the child's collector is on
        assert gc.isenabled()  # the parent's too


def test_the_collector_is_off_from_the_first_hook_until_the_child_has_frozen(monkeypatch):
    """Other modules' fork hooks allocate (before ours in the child): a collection they set off would free
    inherited garbage before the freeze. So the collector is off from the parent's first hook (ours: the last
    registered runs first) until the freeze, and back on in the parent once no thread of it forks any more."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    try:
        fork_guard._before()
        assert not gc.isenabled()
        fork_guard._before()  # a second thread forking meanwhile
        fork_guard._after_in_parent()
        assert not gc.isenabled()  # the other thread's fork is still under way
        fork_guard._after_in_parent()
        assert gc.isenabled()
        gc.disable()  # a parent that had the collector off keeps it off
        fork_guard._before()
        fork_guard._after_in_parent()
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    fork_guard._before()  # no CUDA: the collector is left alone
    assert gc.isenabled()
    fork_guard._after_in_parent()
    assert gc.isenabled()
