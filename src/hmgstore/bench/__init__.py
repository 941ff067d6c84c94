"""Benchmarks a user runs on their own machine: ``python -m hmgstore.bench {gather,sample,train,peer,scale}``.

Every benchmark times with :mod:`hmgstore.bench.timing` (CUDA events for GPU
work, a synchronised wall clock for work that involves the CPU; warm-up, then
the median of repeats), measures its physical limit and its baselines in the
same run, and reports each figure as a ratio to them. Results are printed as
a table and written as JSON and a PNG plot (:mod:`hmgstore.bench.report`).
The research benchmarks and probes that chose hmgstore's defaults live in
the repository's ``benchmarks/`` and reuse this command line and reports.
"""
