"""Graphs to train on: synthetic community graphs (:mod:`.community`, the embedded default of the
examples) and OGB node datasets already on disk (:mod:`.ogb`)."""
from .community import NodeGraph, synthetic

__all__ = ["NodeGraph", "synthetic"]
