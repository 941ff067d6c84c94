"""Helpers shared by tests (importable as ``helpers``: pytest puts tests/ on sys.path).

Nothing here imports a framework at module level: the PyG builders import
torch_geometric when called, so that tests without PyG can import this too.
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import torch
import torch.nn.functional as F


def random_table(num_rows: int, row_shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A table of random, non-zero-heavy values of any dtype (never all zeros)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_rows, *row_shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**31), min(info.max, 2**31 - 1), shape, generator=g,
                         dtype=torch.int64).to(dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``, row-major. (``contiguous()`` keeps the zero strides torch gives some empty
    results, such as ``x[empty_index]``, and those cannot be viewed as bytes.)"""
    t = torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)
    return t.view(torch.uint8)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same shape, dtype and bytes (so NaNs and -0.0 count too), wherever ``got`` lives."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(as_bytes(got.cpu()), as_bytes(want.cpu()))


@contextlib.contextmanager
def no_collection():
    """No garbage collection inside the block, and none owed at its start.

    Why. A timing test that asserts "this did not wait for a busy stream" fails when an earlier test's
    garbage is collected inside it: freeing that garbage's CUDA memory (cudaFree) or unregistering its host
    memory (cudaHostUnregister) synchronises the whole device. The H100's GPU suite failed
    test_cpu_ids_do_not_wait_for_the_stream that way (1.6 s for 20 gathers, only inside the full suite).
    """
    import gc

    gc.collect()
    torch.cuda.synchronize()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def cuda_devices() -> list[torch.device]:
    """Every CUDA GPU this process sees."""
    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]


# ---- a tiny OGB dataset on disk -------------------------------------------------------
FAKE_PRODUCTS_NODES, FAKE_PRODUCTS_EDGES, FAKE_PRODUCTS_FEAT_DIM = 60, 200, 8


def write_fake_products(root, seed: int = 0) -> dict:
    """A tiny ogbn-products in OGB's on-disk CSV layout; returns what was written."""
    import pandas as pd

    num_nodes, num_edges, feat_dim = FAKE_PRODUCTS_NODES, FAKE_PRODUCTS_EDGES, FAKE_PRODUCTS_FEAT_DIM
    rng = np.random.default_rng(seed)
    folder = root / "ogbn_products"
    (folder / "raw").mkdir(parents=True)
    split_dir = folder / "split" / "sales_ranking"
    split_dir.mkdir(parents=True)
    (folder / "RELEASE_v1.txt").write_text("fake release for tests\n")
    edges = rng.integers(0, num_nodes, size=(num_edges, 2))
    feats = rng.standard_normal((num_nodes, feat_dim)).astype(np.float32)
    labels = rng.integers(0, 47, size=(num_nodes, 1))

    def csv(array, path):
        pd.DataFrame(array).to_csv(path, header=False, index=False, compression="gzip")

    csv(edges, folder / "raw" / "edge.csv.gz")
    csv(feats, folder / "raw" / "node-feat.csv.gz")
    csv(labels, folder / "raw" / "node-label.csv.gz")
    csv(np.array([[num_nodes]]), folder / "raw" / "num-node-list.csv.gz")
    csv(np.array([[num_edges]]), folder / "raw" / "num-edge-list.csv.gz")
    perm = rng.permutation(num_nodes)
    split = {"train": np.sort(perm[:30]), "valid": np.sort(perm[30:45]), "test": np.sort(perm[45:])}
    for part, ids in split.items():
        csv(ids.reshape(-1, 1), split_dir / f"{part}.csv.gz")
    return {"edges": edges, "feats": feats, "labels": labels[:, 0], "split": split}


# ---- PyG: graphs, a model, and batch comparisons (the fixtures are in conftest.py) ----
NUM_AUTHORS = 500
#: small_graph: 16 float32 features and an int64 label per node
ROW_BYTES = 16 * 4 + 8


def as_data(graph):
    """A PyG Data over a NodeGraph's tensors (no copies)."""
    from torch_geometric.data import Data

    return Data(x=graph.x, y=graph.y, edge_index=graph.edge_index)


def as_hetero(graph, seed: int = 0):
    """Papers (the NodeGraph) citing papers and written by authors, with reverse edges."""
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x, data["paper"].y = graph.x, graph.y
    data["author"].x = torch.randn(NUM_AUTHORS, 8, generator=g)
    writes = torch.stack([torch.randint(0, NUM_AUTHORS, (4 * NUM_AUTHORS,), generator=g),
                          torch.randint(0, graph.num_nodes, (4 * NUM_AUTHORS,), generator=g)])
    data["paper", "cites", "paper"].edge_index = graph.edge_index
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return data


class SAGE(torch.nn.Module):
    """A two-layer PyG GraphSAGE."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.conv1, self.conv2 = SAGEConv(in_dim, hidden), SAGEConv(hidden, out_dim)

    def forward(self, x, edge_index):
        x = F.dropout(F.relu(self.conv1(x, edge_index)), p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def train_losses(source, graph, device, *, epochs: int = 2, seed: int = 0, **loader_kwargs) -> list[float]:
    """Per-batch losses of a GraphSAGE fed from ``source`` (a Data or a store pair) by PyG's NeighborLoader.

    Model init, shuffling, neighbour draws and dropout are all seeded from
    ``seed``: two sources holding the same graph must give the same losses.
    """
    from torch_geometric.loader import NeighborLoader

    torch.manual_seed(seed)
    model = SAGE(graph.x.shape[1], 32, int(graph.y.max()) + 1).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NeighborLoader(source, num_neighbors=[10, 5], input_nodes=graph.train_idx, batch_size=256,
                            shuffle=True, **loader_kwargs)
    losses = []
    for _ in range(epochs):
        model.train()
        for batch in loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def assert_batches_match(store_loader, data_loader, data, seed: int = 0) -> int:
    """Same seed, same batches; store batches hold data's rows. Returns the batch count."""
    torch.manual_seed(seed)
    ours = list(store_loader)
    torch.manual_seed(seed)
    theirs = list(data_loader)
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert torch.equal(a.e_id, b.e_id)
        assert torch.equal(a.x.cpu(), data.x[a.n_id]) and torch.equal(a.y.cpu(), data.y[a.n_id])
    return len(ours)


# ---- what a test left in /dev/shm, on a machine that other processes share --------------------
def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _in_this_tree(pid: int) -> bool:
    """Whether ``pid`` is this process or one of its descendants (False once it is gone)."""
    me = os.getpid()
    try:
        while pid > 1:
            if pid == me:
                return True
            pid = _parent(pid)
    except (OSError, ValueError, IndexError):
        pass
    return False


def shm_held_by_others(directory: str = "/dev/shm") -> set[int]:
    """Inodes of files in ``directory`` that a live process outside this process's tree maps or holds open:
    another program's (another test run's queues, say), not anything this test left behind. By inode, not
    name: a semaphore is mapped under the temporary name it was made with, then linked to its own. Processes
    whose /proc entries cannot be read hold nothing here, so the answer errs toward blaming the test."""
    dev = os.stat(directory).st_dev
    device = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    held = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or _in_this_tree(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 5 and fields[3] == device:
                        held.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{entry}/fd/{fd}")
                    if st.st_dev == dev:
                        held.add(st.st_ino)
        except OSError:
            continue
    return held


def _made_by_another_program(name: str, prefix: str) -> bool:
    """Whether a name that carries its maker's pid after ``prefix`` (hmgstore's segments do) was made by a live
    process outside this process's tree."""
    pid = name[len(prefix):].split("-")[0]
    if not prefix or not pid.isdigit() or _in_this_tree(int(pid)):
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shm_left_behind(before: set[str], directory: str = "/dev/shm", prefix: str = "",
                    pid_in_name: bool = False) -> set[str]:
    """Names under ``directory`` (starting with ``prefix``) that are new since ``before`` and that no other
    live program holds (nor made, with ``pid_in_name``: names ``{prefix}{pid}-...``): what this test's
    processes left behind, on a machine where other programs create and remove their own files meanwhile. A
    name must stay so for a second: one another program is about to remove, or has just made and not yet
    mapped, is not ours."""
    def candidates() -> set[str]:
        new = {n for n in os.listdir(directory) if n.startswith(prefix)} - set(before)
        if pid_in_name:
            new = {n for n in new if not _made_by_another_program(n, prefix)}
        if not new:
            return new
        held, left = shm_held_by_others(directory), set()
        for name in new:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: not left behind
                if os.stat(os.path.join(directory, name)).st_ino not in held:
                    left.add(name)
        return left

    left = candidates()
    if left:
        time.sleep(1)
        left &= candidates()
    return left


# ---- processes forked from a warm interpreter ----------------------------------------------------------------
#: Imported once by the warm interpreter, so that the processes it forks start with them (they cost a fresh
#: interpreter 1-2 s of CPU; a test that starts four ranks pays it four times).
WARM_MODULES = ("numpy", "torch", "torch.distributed", "hmgstore", "hmgstore.distributed", "hmgstore.graph",
                "hmgstore.data")
#: PyG too, in a second warm interpreter for the processes that use it (3 s of CPU each): not in the first,
#: as a process that has imported PyG takes 0.6 s longer to exit. Never DGL: it starts a thread at import,
#: which a fork does not copy.
PYG_MODULES = ("torch_geometric.data", "torch_geometric.loader", "hmgstore.plugins.pyg")


def _warm_main(pyg: bool = False) -> None:
    """The warm interpreter (``Warm``): imports WARM_MODULES (and PYG_MODULES), then reads one request a line on stdin,
    forks a process per script it names and answers with their pids, then with their exit codes once all have ended.
    Each forked process leaves this loop and runs its script as ``python SCRIPT ARGS`` would, in its own
    environment, with stdout and stderr in files: it ends as that interpreter would (atexit handlers, the exit
    code of sys.exit or of an uncaught exception, or the signal that killed it)."""
    import gc
    import importlib
    import json
    import runpy
    import sys

    for name in WARM_MODULES + (PYG_MODULES if pyg else ()):
        try:
            importlib.import_module(name)
        except ImportError:  # an optional framework missing: the processes import what they need themselves
            pass
    gc.freeze()  # the modules' objects out of the collector's sight: collections in the processes forked below
    # would otherwise touch, hence copy, the pages of every one of them
    run = None
    for line in sys.stdin:
        procs = json.loads(line)
        pids = []
        for proc in procs:
            pid = os.fork()
            if pid == 0:
                run = proc
                break
            pids.append(pid)
        if run is not None:
            break
        print(json.dumps({"pids": pids}), flush=True)
        print(json.dumps({"codes": [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]}), flush=True)
    if run is None:
        return  # stdin closed: the test run is over
    # the forked process: the script's own stdio, environment, arguments and path
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, run["stdout"]), (2, run["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(run["env"])
    if "OMP_NUM_THREADS" in os.environ:  # OpenMP read it when this interpreter loaded torch; a fresh one reads it
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = list(run["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(run["argv"][0]))
    runpy.run_path(run["argv"][0], run_name="__main__")


class Warm:
    """A warm interpreter that starts processes for a test, faster than ``subprocess.Popen`` of a fresh one.

    ``run(procs, timeout)`` starts one process per ``(argv, env)`` (argv[0]: a Python script), waits for all of
    them, and returns their exit codes, stdout and stderr, as Popen's ``returncode`` and ``communicate()``
    would. Past ``timeout`` seconds it kills them and raises ``TimeoutError``. The processes are the warm
    interpreter's children, hence this process's descendants (what the shared-memory checks look for).
    """

    def __init__(self, pyg: bool = False):
        import subprocess
        import sys
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="hmgstore-warm-")
        self.log = open(os.path.join(self.dir, "warm.log"), "w")
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", f"import sys; sys.path[0] = {here!r}; import helpers; "
                                         f"helpers._warm_main(pyg={pyg})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._runs = 0

    def _answer(self, deadline: float | None) -> dict | None:
        import json
        import select

        fd = self.proc.stdout.fileno()
        while not self._pending.endswith("\n"):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                with open(self.log.name) as f:
                    raise RuntimeError(f"the warm interpreter ended: {f.read()[-3000:]}")
            self._pending += chunk.decode()
        line, self._pending = self._pending, ""
        return json.loads(line)

    def run(self, procs: list[tuple[list[str], dict]], timeout: float) -> tuple[list[int], list[str], list[str]]:
        import json

        self._runs += 1
        files = [(os.path.join(self.dir, f"{self._runs}-{i}.out"), os.path.join(self.dir, f"{self._runs}-{i}.err"))
                 for i in range(len(procs))]
        request = [{"argv": [str(a) for a in argv], "env": dict(env), "stdout": out, "stderr": err}
                   for (argv, env), (out, err) in zip(procs, files)]
        self._pending = ""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        pids = self._answer(None)["pids"]
        answer = self._answer(deadline)
        if answer is None:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            self._answer(None)
        outputs = []
        for out, err in files:
            with open(out) as o, open(err) as e:
                outputs.append((o.read(), e.read()))
            os.unlink(out)
            os.unlink(err)
        if answer is None:
            raise TimeoutError(f"still running after {timeout} s (a hang?); stderr: {[e[-2000:] for _, e in outputs]}")
        return answer["codes"], [o for o, _ in outputs], [e for _, e in outputs]

    def close(self) -> None:
        import shutil

        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_warm: dict[bool, Warm] = {}


def warm(pyg: bool = False) -> Warm:
    """This test process's warm interpreter (with PyG imported, or not), started on first use and ended when the
    process exits."""
    if pyg not in _warm or _warm[pyg].proc.poll() is not None:
        import atexit

        _warm[pyg] = Warm(pyg)
        atexit.register(_warm[pyg].close)
    return _warm[pyg]


def check_no_progress_reaches_every_bar(run, module, attr: str, monkeypatch) -> None:
    """``run(flags)`` (a benchmark's command line) shows progress bars by default and none with ``--no-progress``:
    every call of ``module.attr`` it makes gets ``progress`` True, then False."""
    seen, real = [], getattr(module, attr)

    def spy(*args, **kwargs):
        seen.append(kwargs.get("progress"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, spy)
    for flag, bars in (([], True), (["--no-progress"], False)):
        seen.clear()
        run(flag)
        assert seen and all(p is bars for p in seen), (flag, seen)


def close_map_files(monkeypatch) -> None:
    """Make ``/proc/self/map_files`` refuse this process, as it does a process without CAP_SYS_ADMIN or
    CAP_CHECKPOINT_RESTORE (most users'): mapped files are then found by name."""
    real_open = os.open

    def no_map_files(path, *args, **kwargs):
        if str(path).startswith("/proc/self/map_files/"):
            raise PermissionError(1, "Operation not permitted", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_map_files)
