"""A sampled batch, :class:`Sample`: what every sampler returns (one machine or several), checked for shape."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..rows import checks


@dataclass
class Sample:
    """A sampled batch; every field is keyed by node type or edge type (None when homogeneous).

    Args:
        node: node type -> 1-D tensor of global ids, seeds first, hop by hop.
        row: edge type -> 1-D tensor [M], local ids (into ``node`` of the
            source type) of each sampled edge's neighbour.
        col: edge type -> 1-D tensor [M], local ids (into ``node`` of the
            destination type) of each sampled edge's seed.
        edge: edge type -> 1-D tensor [M] (CSC positions of the sampled
            edges), or None where edge ids are not kept.
        batch: None, or (disjoint mode) node type -> 1-D tensor, the seed
            each node belongs to, as long as ``node``'s.
        num_sampled_nodes: node type -> nodes found per hop (the seeds
            first), summing to the length of ``node``'s.
        num_sampled_edges: edge type -> edges sampled per hop, summing to
            the length of ``row``'s.

    The constructor checks the batch's shape, never the values of its
    tensors (no read back from a GPU).

    Raises:
        TypeError: a field not a dict (``batch``: nor None), an entry not a
            1-D tensor (``edge``: nor None), per-hop counts not integers.
        ValueError: ``row``, ``col`` and ``edge`` not keyed alike, or
            ``node``, ``num_sampled_nodes`` (and ``batch``) not; entries of
            one key of different lengths; per-hop counts that do not sum to
            them.
    """

    node: dict
    row: dict
    col: dict
    edge: dict
    batch: dict | None
    num_sampled_nodes: dict
    num_sampled_edges: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("node", "row", "col", "edge", "batch", "num_sampled_nodes", "num_sampled_edges"):
            value = getattr(self, name)
            if not (isinstance(value, dict) or (name == "batch" and value is None)):
                raise TypeError(f"Sample's {name} is a dict keyed by {'edge' if name in _EDGE_FIELDS else 'node'} "
                                f"type (None when homogeneous), got {type(value).__name__}")
            for key, entry in (value or {}).items():
                if name.startswith("num_sampled"):
                    for hop, n in enumerate(entry):
                        checks.count(n, f"{name}[{key!r}][{hop}]")
                elif not (isinstance(entry, torch.Tensor) and entry.dim() == 1 or name == "edge" and entry is None):
                    got = tuple(entry.shape) if isinstance(entry, torch.Tensor) else type(entry).__name__
                    raise TypeError(f"Sample's {name}[{key!r}] is a 1-D tensor, got {got}")
        _same_keys(self, ("row", "col", "edge"))
        _same_keys(self, ("node", "num_sampled_nodes") + (() if self.batch is None else ("batch",)))
        for et, row in self.row.items():
            edge, counted = self.edge[et], self.num_sampled_edges.get(et)
            if len(self.col[et]) != len(row) or (edge is not None and len(edge) != len(row)):
                raise ValueError(f"edge type {et!r}: row, col and edge differ in length ({len(row)}, "
                                 f"{len(self.col[et])}, {None if edge is None else len(edge)})")
            if counted is not None and sum(counted) != len(row):
                raise ValueError(f"edge type {et!r}: num_sampled_edges sums to {sum(counted)} for {len(row)} edges")
        for nt, node in self.node.items():
            if sum(self.num_sampled_nodes[nt]) != len(node):
                raise ValueError(f"node type {nt!r}: num_sampled_nodes sums to {sum(self.num_sampled_nodes[nt])} "
                                 f"for {len(node)} nodes")
            if self.batch is not None and len(self.batch[nt]) != len(node):
                raise ValueError(f"node type {nt!r}: batch holds {len(self.batch[nt])} entries for {len(node)} nodes")


_EDGE_FIELDS = ("row", "col", "edge", "num_sampled_edges")


def _same_keys(sample: Sample, names: tuple) -> None:
    keys = [set(getattr(sample, n)) for n in names]
    if any(k != keys[0] for k in keys):
        raise ValueError(f"Sample's {', '.join(names)} must have the same keys, got "
                         f"{', '.join(f'{n}: {sorted(map(repr, k))}' for n, k in zip(names, keys))}")
