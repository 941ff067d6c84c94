"""Graphs to train on: synthetic community graphs (:mod:`.community`, the embedded default of the
examples), power-law topologies of any size made straight in CSC form (:mod:`.power_law`) and OGB node
datasets already on disk (:mod:`.ogb`)."""
from .community import NodeGraph, synthetic
from .power_law import power_law_csc

__all__ = ["NodeGraph", "power_law_csc", "synthetic"]
