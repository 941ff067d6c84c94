"""Research benchmarks: ``python benchmarks/research {hotness,reach,remote} [options]``.

What a maintainer measures to choose a default or explain a limit, kept out
of the wheel's ``python -m hmgstore.bench`` (the benchmarks a user runs on
their own machine), with the same command line (:class:`hmgstore.bench.__main__.Suite`:
the shared flags, ``--quick``, the CPU sizes) and the same reports
(:mod:`hmgstore.bench.report`). Each module calls hmgstore's public or
documented functions only:

- :mod:`.hotness`: cache hit ratios of pre-sampled hotness against degree order;
- :mod:`.reach`: gather rates against the distinct 2 MiB host pages a batch touches
  (:mod:`hmgstore.table.host_pages`);
- :mod:`.remote` and :mod:`.remote_train`: rows fetched from other machines against
  ``all_to_all``, and GraphSAGE on a partitioned graph against one machine.
"""

#: The command line as typed from the repository's root (reports record it with their arguments).
PROG = "python benchmarks/research"
