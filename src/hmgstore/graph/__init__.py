"""Framework-free graph topology: CSC conversion now; the topology tiers and the sampler build on it."""
from .csc import CSC, LAYOUTS, index2ptr, ptr2index, stable_sort, to_csc

__all__ = ["CSC", "LAYOUTS", "index2ptr", "ptr2index", "stable_sort", "to_csc"]
