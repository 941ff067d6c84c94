"""Batches made ahead of the training step: in a thread on a side CUDA stream (:mod:`.pipeline`, whose passes
:mod:`.batch_maker` makes), or in a process of its own (:mod:`.producer`, which runs :mod:`.producer_process`
and hands batches over in :mod:`.shared_ring`)."""
