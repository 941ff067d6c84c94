"""The arguments of :class:`~hmgstore.graph.NeighborSampler` that describe its graph, checked before any is used."""
from __future__ import annotations

import torch

from ..rows import checks
from .topology import Topology


def check_graph(topologies, num_nodes, generator, **flags) -> tuple[torch.device, dict]:
    """``(device, num_nodes)`` after checking what a sampler is given: ``topologies`` a non-empty dict of
    :class:`Topology` objects on one device, ``num_nodes`` a dict of integer counts >= 0 that covers every edge
    type's ends and agrees with its topology, ``generator`` None or a ``torch.Generator``, ``flags`` bools.
    Raises TypeError for the wrong kinds, ValueError for the wrong values (see the sampler's docstring)."""
    for what, value in (("topologies", topologies), ("num_nodes", num_nodes)):
        if not isinstance(value, dict):
            raise TypeError(f"{what} is a dict keyed by {'edge' if what == 'topologies' else 'node'} type (None when "
                            f"homogeneous), got {type(value).__name__}")
    if not topologies:
        raise ValueError("a sampler needs at least one edge type's topology")
    bad = [et for et, t in topologies.items() if not isinstance(t, Topology)]
    if bad:
        raise TypeError(f"topologies[{bad[0]!r}] is a hmgstore.graph.Topology, got {type(topologies[bad[0]]).__name__}")
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} is a bool, got {flag!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator is a torch.Generator or None, got {type(generator).__name__}")
    num_nodes = {nt: checks.count(n, f"num_nodes[{nt!r}]") for nt, n in num_nodes.items()}
    devices = {t.device for t in topologies.values()}
    if len(devices) != 1:
        raise ValueError(f"every topology of a sampler must be on one device, got {sorted(map(str, devices))}")
    hetero = None not in topologies
    if not hetero and len(topologies) > 1:
        raise ValueError(f"topologies mixes the homogeneous key None with edge types {[k for k in topologies if k]}: "
                         "key one edge type by None, or every one by its (src, relation, dst) triple")
    for et in topologies if hetero else ():  # ends read as et[0] and et[-1]: a string or pair would misread
        if not (isinstance(et, tuple) and len(et) == 3 and all(isinstance(part, str) for part in et)):
            raise TypeError(f"an edge type is a (src node type, relation, dst node type) triple of strings, as in "
                            f"PyG and DGL; got {et!r}")
    for et, topo in topologies.items():
        src, dst = (et[0], et[-1]) if hetero else (None, None)
        missing = [nt for nt in (src, dst) if nt not in num_nodes]
        if missing:
            raise ValueError(f"edge type {et!r} joins node type {missing[0]!r}, which num_nodes does not count; it "
                             f"counts {list(num_nodes)}")
        if (topo.num_src, topo.num_dst) != (num_nodes[src], num_nodes[dst]):
            raise ValueError(f"edge type {et!r} joins {topo.num_src} -> {topo.num_dst} nodes, but the node types have "
                             f"{num_nodes[src]} and {num_nodes[dst]}")
    return devices.pop(), num_nodes
