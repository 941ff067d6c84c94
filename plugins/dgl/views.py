"""``g.ndata`` and ``g.edata`` of an attached graph: DGL's views, plus the attached tables as whole tensors.

Full-graph code (layer-wise inference, as in DGL's GraphSAGE example:
``feat = g.ndata["feat"]`` then ``feat[input_nodes]`` per batch) reads
features from ``g.ndata``. :func:`~hmgstore.plugins.dgl.attach` serves
mini-batches from tables and does not copy them into the graph's frames, so
these views answer a key the frames lack with its table's rows, read
through the table (:meth:`HybridFeatureStorage.whole`): the host tier itself,
no copy, when it keeps rows as they read, else a decoded copy made once.
Writes are DGL's, and the last one wins: ``attach`` drops the frames' columns
of the keys it attaches, and ``g.ndata["feat"] = x`` (all nodes) or ``del
g.ndata["feat"]`` after it detaches ``feat`` (``HybridDGLGraph._set_n_repr``,
``_pop_n_repr``), so the views and DGL's DataLoader always read the same rows; a
decoded copy edited in place is refused at the next read or fetch
(:meth:`HybridFeatureStorage.whole`), its edit being lost to the table.
Only ``g.ndata``/``g.edata`` and ``g.srcdata``/``g.dstdata`` (all nodes or edges) read through;
``g.nodes[...].data``, message passing and blocks are DGL's alone (see
:class:`~hmgstore.plugins.dgl.HybridDGLGraph`).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._compat import import_dgl

import_dgl()
if TYPE_CHECKING:  # the classes themselves, for mypy
    from dgl.view import HeteroEdgeDataView, HeteroNodeDataView
else:
    # Imported by name, not read as dgl.view: after a failed plain `import dgl`, the package that import_dgl
    # recovers lacks its submodule attributes (test_dgl_compat.py::test_plugin_recovers_after_a_failed_import_dgl).
    _view = importlib.import_module("dgl.view")
    HeteroNodeDataView, HeteroEdgeDataView = _view.HeteroNodeDataView, _view.HeteroEdgeDataView


class _ReadsThrough:
    """The shared half of the two views: missing keys come from the graph's attached storages."""

    __slots__ = ()

    def _types(self) -> list:
        raise NotImplementedError

    def _attached(self) -> dict:
        raise NotImplementedError

    def _types_given(self):
        raise NotImplementedError

    def _ids(self) -> list:
        raise NotImplementedError

    def _pop(self, type_id, key):
        raise NotImplementedError

    def __getitem__(self, key):
        many = isinstance(self._types_given(), list)
        try:
            value = super().__getitem__(key)
        except KeyError:
            if many:
                raise
            storage = self._attached().get((key, self._types()[0]))
            if storage is None:
                raise
            return self._checked(key, self._types()[0]).whole(key)
        if many:
            for t in self._types():
                storage = self._attached().get((key, t))
                if t not in value and storage is not None:
                    value[t] = self._checked(key, t).whole(key)
        return value

    def _checked(self, key, type_):
        """The storage as the graph's ``get_*_storage`` serves it: refused (ValueError) once the graph's ids no
        longer name its rows (nodes removed or added after ``attach``), as DGL's fetches are."""
        raise NotImplementedError

    def __delitem__(self, key) -> None:
        """Detach an attached key (the graph's ``_pop_*_repr``) and drop the frames' column, as DGL's view does."""
        if isinstance(self._types_given(), list):  # DGL's view skips the types whose frames lack the key
            for type_, type_id in zip(self._types(), self._ids()):
                if (key, type_) in self._attached():
                    self._pop(type_id, key)
        super().__delitem__(key)  # type: ignore[misc]  # a mixin: super() is the DGL view it is mixed into

    def _keys(self) -> list:
        keys = list(super().keys())  # type: ignore[misc]  # a mixin: super() is the DGL view it is mixed into
        types = self._types()
        return keys + sorted({k for k, t in self._attached() if t in types and k not in keys})

    def __iter__(self):
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def keys(self):
        return self._keys()


class AttachedNodeDataView(_ReadsThrough, HeteroNodeDataView):
    """``g.ndata`` of a :class:`~hmgstore.plugins.dgl.HybridDGLGraph` (see the module docstring)."""

    __slots__ = ()

    def _types_given(self):
        return self._ntype

    def _types(self) -> list:
        return self._ntype if isinstance(self._ntype, list) else [self._ntype]

    def _attached(self) -> dict:
        return self._graph.__dict__.get("_hmgstore_storages", {})

    def _checked(self, key, type_):
        return self._graph.get_node_storage(key, type_)

    def _ids(self) -> list:
        return self._ntid

    def _pop(self, type_id, key):
        return self._graph._pop_n_repr(type_id, key)


class AttachedEdgeDataView(_ReadsThrough, HeteroEdgeDataView):
    """``g.edata`` of a :class:`~hmgstore.plugins.dgl.HybridDGLGraph` (see the module docstring)."""

    __slots__ = ()

    def _types_given(self):
        return self._etype

    def _types(self) -> list:
        if isinstance(self._etype, list):  # g.edata of several edge types: canonical ones
            return list(self._etype)
        return [self._graph.canonical_etypes[self._etid]]

    def _attached(self) -> dict:
        return self._graph.__dict__.get("_hmgstore_edge_storages", {})

    def _checked(self, key, type_):
        return self._graph.get_edge_storage(key, type_)

    def _ids(self) -> list:
        return self._etid

    def _pop(self, type_id, key):
        return self._graph._pop_e_repr(type_id, key)
