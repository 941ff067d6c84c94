"""Framework-free graph topology and neighbour sampling.

- :mod:`.csc`: CSC conversion from COO, CSR or CSC input;
- :mod:`.fanout`: the one check of neighbours per hop;
- :mod:`.topology`: one edge type's CSC held for sampling, its neighbour ids in tiers (GPU, pinned host);
- :mod:`.sampler`: multi-hop uniform neighbour sampling with relabelling, on a GPU or the CPU (its graph's
  arguments checked in :mod:`.arguments`), returning a :class:`~.sample.Sample`;
- :mod:`.hop`: one hop of it, and the draws (the same on both devices);
- :mod:`.relabel`: sampled node keys to local ids (sort, or a GPU hash table);
- :mod:`.presample`: node hotness from an epoch of real sampling, or predicted from the topology;
- :mod:`.locality`: host-tier layouts that keep neighbours together, and batches from few parts.
"""
from . import locality
from .csc import CSC, LAYOUTS, index2ptr, ptr2index, stable_sort, to_csc
from .fanout import check_fanout, parse_fanout
from .hop import sample_hop
from .locality import LocalityBatchSampler
from .presample import Hotness, expected_draws, hit_ratio, presample
from .sampler import NeighborSampler, Sample
from .topology import Topology

__all__ = ["CSC", "LAYOUTS", "index2ptr", "ptr2index", "stable_sort", "to_csc", "NeighborSampler", "Sample",
           "sample_hop", "Topology", "Hotness", "expected_draws", "hit_ratio", "presample", "check_fanout",
           "parse_fanout", "locality", "LocalityBatchSampler"]
