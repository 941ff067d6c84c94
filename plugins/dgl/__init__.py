"""DGL adapter: an unchanged DGL DataLoader feeds node features from hmgstore tables.

A stock DGL training script changes one line::

    from hmgstore.plugins.dgl import attach
    attach(g, {"feat": table, "label": labels})   # the only change
    sampler = dgl.dataloading.NeighborSampler(
        [15, 10, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, train_ids, sampler, device=device, batch_size=1024)

How DGL 2.1's classic DataLoader fetches features (``dgl/dataloading/
dataloader.py``, ``_prefetch``): for each batch it first calls
``graph.get_node_storage(key, ntype).fetch(ids, device, pin_prefetcher)`` for
every prefetched key of every node type (``ids``: the block's ``dgl.NID``,
int32 or int64 like the graph, on the CPU unless sampling runs on the GPU;
``ntype`` is ``"_N"`` on homogeneous graphs; ``pin_prefetcher`` is True, False
or None), then calls ``.wait()`` on every returned object that has one. With
CPU sampling and a CUDA ``device`` this runs in DGL's prefetch thread.

:func:`attach` re-classes ``g`` in place to :class:`HybridDGLGraph`, a
``DGLGraph`` whose ``get_node_storage`` returns a :class:`HybridFeatureStorage`
for the attached keys and DGL's own ``ndata`` column for every other key.
``fetch`` only records the request; the first ``wait()`` gathers every request
that the same thread recorded for the same table device and stream, in one
:func:`hmgstore.gather_many` call (one kernel launch on CUDA), on the stream
that was current when they were recorded. So a batch's features and labels
cost one gather, and the results are ready on the caller's stream.

Import it before DGL: ``import dgl`` first fails on such a torch, inside DGL,
with ``ModuleNotFoundError: No module named 'torchdata.datapipes'`` (or
``Cannot find DGL C++ graphbolt library``), before hmgstore can step in.
Importing this package imports DGL, first replacing ``dgl.graphbolt`` by a
stub when GraphBolt cannot load on this torch (DGL 2.1 on torch > 2.2; see
:mod:`._compat`). A plain ``import dgl`` on such a torch fails (``No module
named 'torchdata.datapipes'``, or a missing GraphBolt library), so import
this package before ``dgl``, always (spawned DataLoader workers re-import the
script and need the same order).

Files: :mod:`.storage` (the ``FeatureStorage`` and the fused fetches),
:mod:`.graph` (``attach`` and the graph class), :mod:`.views` (``g.ndata``
and ``g.edata`` reading through tables), :mod:`.renumber` (which edge
features a removal renumbered), :mod:`._compat` (DGL import).

Which DGL build does what:

- a CUDA build of DGL (DGL's own wheel index, not the package registry;
  untested here): GPU training. ``DataLoader(g, ids, sampler, device="cuda")``
  samples on the CPU (or on the GPU with ``use_uva=True``) and hmgstore
  gathers features straight into the GPU.
- a CPU build (the package registry's DGL 2.1.0): CPU sampling and CPU
  blocks, so CPU training. hmgstore tables may live on a GPU and
  ``fetch(ids, "cuda")`` works, but DGL cannot move blocks to CUDA.
  :func:`dgl_supports_cuda` tells the two apart.

Limits: DGL's ``gpu_cache`` option cannot serve attached keys (it needs
``fetch`` to return a tensor; give the table GPU-resident hot rows instead).
Edge features: ``attach(g, {...}, edata={"w": table})`` and the sampler's
``prefetch_edge_feats=["w"]``: blocks' ``edata["w"]`` come from the table by
their ``dgl.EID``, in the same gather as the node features. Full-graph
code keeps reading ``g.ndata[key]``/``g.edata[key]`` (and ``g.srcdata``/
``g.dstdata``): a key the graph's frames lack reads the whole table
(:mod:`.views`); message passing, ``dgl.to_half`` and ``dgl.save_graphs``
see the graph's frames only (:class:`HybridDGLGraph` says what to do).
"""
from ._compat import dgl_supports_cuda, import_dgl

dgl = import_dgl()

from .graph import HybridDGLGraph, attach  # noqa: E402  (DGL must be imported through import_dgl first)
from .storage import HybridFeatureStorage, PendingFetch  # noqa: E402

__all__ = ["attach", "HybridDGLGraph", "HybridFeatureStorage", "PendingFetch", "dgl_supports_cuda"]
