"""Importing classic DGL on a torch that its GraphBolt library was not built for.

DGL 2.1.0 (the newest DGL on the package registry) imports ``dgl.graphbolt``
from ``import dgl`` (through ``dgl.distributed``), and GraphBolt loads a C++
library built for one exact torch version (``libgraphbolt_pytorch_<ver>.so``,
2.0.0 to 2.2.1 in the 2.1.0 wheels) and needs ``torchdata.datapipes`` (gone
from torchdata 0.10). On any newer torch, ``import dgl`` therefore fails,
although classic DGL (``DGLGraph``, ``dgl.dataloading``, ``dgl.nn``,
``dgl.sampling``) never touches GraphBolt.

:func:`import_dgl` imports DGL and, only when GraphBolt cannot load, first puts
a stub module in ``sys.modules["dgl.graphbolt"]``. Nothing else in DGL is
changed. The stub answers every attribute with an AttributeError that says
why GraphBolt is missing, except ``FusedCSCSamplingGraph``, a class nothing is
an instance of, so that ``dgl.distributed``'s ``isinstance`` checks keep
classic (non-GraphBolt) partitions working. If ``dgl`` is already imported,
or GraphBolt loads, nothing is replaced.

What each DGL build supports with the stub:

- CPU build (the registry's 2.1.0 wheel; tests/test_dgl_*.py check it on
  torch 2.13 CPU, and their gpu-marked tests on torch 2.11 CUDA): CPU sampling, CPU blocks, CPU training.
  hmgstore tables may still gather onto a GPU, but blocks cannot move to CUDA
  (``DataLoader(device="cuda")`` fails in DGL: "Device API cuda is not
  enabled"), so message passing stays on the CPU.
- CUDA build of DGL (DGL's own wheel index; not checked here): GPU training
  as usual, blocks on the GPU, features gathered straight into the GPU by
  hmgstore.

:func:`dgl_supports_cuda` tells the two apart at run time.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import multiprocessing
import os
import sys
import types
from typing import Any

import torch

log = logging.getLogger("hmgstore.plugins.dgl")


class GraphboltUnavailable(types.ModuleType):
    """Stands in for ``dgl.graphbolt`` when its C++ library cannot load."""

    class FusedCSCSamplingGraph:
        """Placeholder: no object is a GraphBolt graph when GraphBolt is absent."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError("dgl.graphbolt is unavailable; see dgl.graphbolt.reason")

    def __init__(self, reason: str):
        super().__init__("dgl.graphbolt", "Stub installed by hmgstore: GraphBolt cannot load here.")
        self.reason = reason

    def __getattr__(self, name: str):
        if name.startswith("__"):  # import machinery probes __path__, __spec__, ...
            raise AttributeError(name)
        raise AttributeError(
            f"dgl.graphbolt.{name} is unavailable: {self.reason}. hmgstore replaced dgl.graphbolt by a "
            f"stub so that classic DGL imports; install a DGL build made for torch {torch.__version__} "
            "to use GraphBolt")


def graphbolt_unavailable_reason() -> str | None:
    """Why ``dgl.graphbolt`` would fail to import here, or None if it should load.

    Looks at the installed files only (does not import dgl): the GraphBolt
    library for this torch version, and ``torchdata.datapipes``.
    """
    spec = importlib.util.find_spec("dgl")
    if spec is None or not spec.submodule_search_locations:
        return None  # no dgl: the import itself will say so
    version = torch.__version__.split("+", maxsplit=1)[0]
    if sys.platform.startswith("linux"):  # the names dgl/graphbolt/__init__.py loads
        library = f"libgraphbolt_pytorch_{version}.so"
    elif sys.platform.startswith("darwin"):
        library = f"libgraphbolt_pytorch_{version}.dylib"
    else:
        library = f"graphbolt_pytorch_{version}.dll"
    folder = os.path.join(list(spec.submodule_search_locations)[0], "graphbolt")
    if not os.path.exists(os.path.join(folder, library)):
        return f"this DGL build has no GraphBolt library for torch {version} ({library})"
    try:
        if importlib.util.find_spec("torchdata.datapipes") is None:
            raise ModuleNotFoundError
    except ModuleNotFoundError:
        return "torchdata.datapipes is missing (GraphBolt needs torchdata < 0.10)"
    return None


def _raised_in_graphbolt(err: BaseException) -> bool:
    marker = os.sep + os.path.join("dgl", "graphbolt") + os.sep
    tb = err.__traceback__
    while tb is not None:
        if marker in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _install_stub(reason: str) -> GraphboltUnavailable:
    stub = GraphboltUnavailable(reason)
    sys.modules["dgl.graphbolt"] = stub
    # Said once, by the main process (spawned DataLoader workers repeat the import every epoch), and at INFO:
    # classic DGL works, so a user of it has nothing to do.
    level = logging.INFO if multiprocessing.current_process().name == "MainProcess" else logging.DEBUG
    log.log(level, "hmgstore replaced dgl.graphbolt by a stub: %s. Classic DGL (DGLGraph, dgl.dataloading, "
            "dgl.nn, dgl.sampling) is unaffected; only GraphBolt is unavailable.", reason)
    return stub


def import_dgl() -> types.ModuleType:
    """Import and return ``dgl``, stubbing ``dgl.graphbolt`` only if it cannot load.

    Does nothing but return the module if ``dgl`` is already imported. Raises
    ImportError (with the install command) if DGL is not installed, and DGL's
    own error if DGL fails for a reason other than GraphBolt.
    """
    if "dgl" in sys.modules:
        return sys.modules["dgl"]
    stub = None
    if "dgl.graphbolt" not in sys.modules:
        reason = graphbolt_unavailable_reason()
        if reason is not None:
            stub = _install_stub(reason)
    try:
        dgl: Any = importlib.import_module("dgl")  # a stub is set on it as dgl.graphbolt
    except (ImportError, OSError) as err:
        if getattr(err, "name", None) == "dgl":
            raise ImportError("hmgstore.plugins.dgl needs DGL: pip install 'dgl==2.1.0' (or hmgstore[dgl])") from err
        if stub is None and _raised_in_graphbolt(err):
            return _retry_with_stub(err)
        raise
    if stub is not None:
        dgl.graphbolt = stub  # so that dgl.graphbolt.X explains itself instead of "no attribute"
    return dgl


def _retry_with_stub(err: BaseException) -> types.ModuleType:
    # GraphBolt's files looked fine but it failed to load (e.g. an ABI mismatch).
    # Submodules imported before the failure stay in sys.modules and are reused.
    sys.modules.pop("dgl", None)
    stub = _install_stub(f"dgl.graphbolt failed to import ({type(err).__name__}: {err})")
    dgl: Any = importlib.import_module("dgl")
    dgl.graphbolt = stub
    return dgl


def dgl_supports_cuda() -> bool:
    """Whether this DGL build can put graphs and blocks on a CUDA GPU here.

    Returns:
        False for CPU builds of DGL (whatever torch can do) and where torch sees no GPU; True for a CUDA build
        of DGL that sees GPU 0.

    It raises nothing once DGL imports (it does wherever :mod:`hmgstore.plugins.dgl` imported): DGL is
    imported through :func:`import_dgl` here if it was not yet.
    """
    if not torch.cuda.is_available():
        return False
    dgl = sys.modules.get("dgl") or import_dgl()  # not KeyError when called before the package imported DGL
    return bool(dgl.ndarray.gpu(0).exist)
