"""Synthetic node-classification graphs, the embedded default of the examples.

The graph is built to behave like the real ones hmgstore is for, at any size:

- a skewed in-degree (a few hot nodes receive most edges), so that caching
  hot rows on the GPU matters, as on ogbn-products and ogbn-papers100M;
- labels that a GNN can learn: ``num_classes`` communities, most edges stay
  inside a community, and each node's features are its community's centroid
  plus noise (so neighbours' features carry signal beyond a node's own);
- node ids randomly permuted, so hot rows are scattered through the table as
  in real data (not a contiguous, cache-friendly prefix).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rows import checks


@dataclass
class NodeGraph:
    """A homogeneous graph with node features and labels (all CPU tensors).

    Args:
        edge_index: integer tensor [2, E], row 0 source, row 1 destination,
            each id in ``[0, N)``.
        x: [N, D] features (a tensor of two dimensions; N is the node count).
        y: integer tensor [N], each label in ``[0, num_classes)`` or -1 (an
            unlabelled node, as papers100M's).
        train_idx, val_idx, test_idx: 1-D integer node ids, each in
            ``[0, N)``.
        num_classes: an integer >= 1.

    Raises:
        TypeError: a field not a tensor, or of floats or bools where ids or
            labels go; ``num_classes`` not an integer.
        ValueError: ``edge_index`` not ``[2, E]``; ``x`` not 2-D; ``y`` or
            the splits not 1-D, ``y`` not one label per node or a label
            outside ``[-1, num_classes)``; ``num_classes`` under 1.
        IndexError: an edge's or a split's node id outside ``[0, N)``.
    """

    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int

    def __post_init__(self):
        self.num_classes = checks.count(self.num_classes, "num_classes", at_least=1)
        for name in ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(f"NodeGraph.{name} is a tensor, got {type(getattr(self, name)).__name__}")
        if self.x.dim() != 2:
            raise ValueError(f"NodeGraph.x is [num_nodes, feature_dim], got shape {tuple(self.x.shape)}")
        n = self.x.shape[0]
        if self.edge_index.dim() != 2 or self.edge_index.shape[0] != 2:
            raise ValueError(f"NodeGraph.edge_index is [2, num_edges], got shape {tuple(self.edge_index.shape)}")
        for k in range(2):
            checks.id_list(self.edge_index[k], f"edge_index[{k}]", n)
        y = checks.integers(self.y, "y")
        if len(y) != n:
            raise ValueError(f"NodeGraph.y holds {len(y)} labels for {n} nodes; one per node (-1: unlabelled)")
        if len(y) and (int(y.min()) < -1 or int(y.max()) >= self.num_classes):
            bad = int(y[(y < -1) | (y >= self.num_classes)][0])
            raise ValueError(f"NodeGraph.y holds the label {bad}; labels are in [0, {self.num_classes}) "
                             "(num_classes), or -1 for an unlabelled node")
        for name in ("train_idx", "val_idx", "test_idx"):
            checks.id_list(getattr(self, name), name, n)

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]


def synthetic(num_nodes: int = 100_000, avg_degree: int = 10, feat_dim: int = 128, num_classes: int = 16,
              *, intra: float = 0.8, noise: float = 2.0, skew: float = 3.0, communities: int | None = None,
              dtype=torch.float32, seed: int = 0) -> NodeGraph:
    """A random community graph (see the module docstring), reproducible from ``seed``.

    ``intra``: share of edges that stay inside a community; ``noise``: feature
    noise over centroid spread (higher is harder); ``skew``: exponent of the
    destination popularity (1 is uniform; 3 gives a heavy-tailed in-degree).
    ``communities``: how many communities edges stay inside (default
    ``num_classes``: one per class); more of them, each of one class, give
    the graph the fine-grained locality of real ones (papers cite within a
    subfield), which layouts by locality (:mod:`hmgstore.graph.locality`)
    find. Splits: 60% train, 20% val, 20% test. Memory: about ``16 * E + N * D *
    itemsize`` bytes.

    Accepted: ``num_nodes``, ``avg_degree``, ``feat_dim``, ``num_classes``,
    ``communities`` and ``seed`` integers (Python, numpy or 0-d tensors; not
    bools or floats such as 2.5) with ``num_nodes >= communities >=
    num_classes >= 2``, ``avg_degree >= 1``, ``feat_dim >= 1`` and ``seed`` in
    ``[-2**63, 2**64)``; ``intra`` a real number in ``[0, 1]``, ``noise`` one
    ``>= 0``, ``skew`` one ``> 0`` (0 would send every edge to the last member
    of its community), all finite; ``dtype`` a torch floating dtype.

    Raises:
        TypeError: an argument of the wrong kind (a float count, a bool, a
            string, a non-floating ``dtype``), naming the argument.
        ValueError: a value out of its range, or sizes that make no graph,
            naming the argument.
    """
    num_nodes, avg_degree, feat_dim, num_classes, k, seed = _counts(
        num_nodes, avg_degree, feat_dim, num_classes, communities, seed)
    intra, noise, skew = _shares(intra, noise, skew)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"synthetic(dtype=...) takes a torch floating dtype (torch.float32, ...), got {dtype!r}")
    g = torch.Generator().manual_seed(seed)
    n, c = num_nodes, num_classes
    num_edges = n * avg_degree
    member = torch.arange(n) % k  # before the final relabelling: community of node i is i % k
    label = member % c  # and its class
    src = torch.randint(0, n, (num_edges,), generator=g)
    # Destination: a popular member of the source's community (or of a random one).
    community = torch.where(torch.rand(num_edges, generator=g) < intra, member[src],
                            torch.randint(0, k, (num_edges,), generator=g))
    size = (n - community + k - 1) // k  # members of community j: j, j + k, j + 2k, ...
    rank = (torch.rand(num_edges, generator=g) ** skew * size).long().clamp_max(size - 1)
    dst = community + rank * k

    centroids = torch.randn(c, feat_dim, generator=g)
    x = centroids[label] + noise * torch.randn(n, feat_dim, generator=g)

    perm = torch.randperm(n, generator=g)  # new id of old node i is perm[i]
    edge_index = torch.stack([perm[src], perm[dst]])
    x_new = torch.empty_like(x)
    x_new[perm] = x
    y = torch.empty_like(label)
    y[perm] = label

    split = torch.randperm(n, generator=g)
    a, b = int(0.6 * n), int(0.8 * n)
    return NodeGraph(edge_index, x_new.to(dtype), y, split[:a].sort().values, split[a:b].sort().values,
                     split[b:].sort().values, c)


def _counts(num_nodes, avg_degree, feat_dim, num_classes, communities, seed) -> tuple[int, ...]:
    """The integer arguments of :func:`synthetic`, checked (``communities`` None becomes ``num_classes``)."""
    given = {"num_nodes": num_nodes, "avg_degree": avg_degree, "feat_dim": feat_dim, "num_classes": num_classes,
             "communities": num_classes if communities is None else communities, "seed": seed}
    # checks.count for the kind only (TypeError naming the argument); the ranges are said together below
    n, degree, dim, c, k, seed = (checks.count(value, f"synthetic({name}=...)", at_least=-(1 << 63))
                                  for name, value in given.items())
    bad = [name for name, wrong in (("num_classes", c < 2), ("avg_degree", degree < 1), ("feat_dim", dim < 1),
                                    ("communities", k < c), ("num_nodes", n < max(c, k))) if wrong]
    if bad:
        raise ValueError(f"synthetic({bad[0]}={given[bad[0]]!r}) makes no graph: need num_nodes >= num_classes >= "
                         "2 (and communities from num_classes to num_nodes), avg_degree >= 1 and feat_dim >= 1")
    if seed >= 1 << 64:
        raise ValueError(f"synthetic(seed={seed}) is past what torch.Generator takes: seeds are in [-2**63, 2**64)")
    return n, degree, dim, c, k, seed


def _shares(intra, noise, skew) -> tuple[float, float, float]:
    """``intra``, ``noise`` and ``skew`` of :func:`synthetic` as floats, checked (finite, in range)."""
    intra = checks.real(intra, "synthetic(intra=...)", at_least=0.0)
    if intra > 1:
        raise ValueError(f"synthetic(intra={intra}) is the share of edges inside a community, in [0, 1]")
    noise = checks.real(noise, "synthetic(noise=...)", at_least=0.0)
    skew = checks.real(skew, "synthetic(skew=...)")
    if skew <= 0:
        raise ValueError(f"synthetic(skew={skew}) must be above 0: it is the exponent of the destination "
                         "popularity (1 uniform, 3 heavy-tailed); 0 sends every edge to its community's last member")
    return intra, noise, skew
