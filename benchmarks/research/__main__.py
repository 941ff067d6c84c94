"""``python benchmarks/research NAME [options]``: runs a research benchmark (see ``__init__.py``) from the
repository's root. ``--help`` lists them; ``NAME --help`` gives a benchmark's options."""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a folder: import the package `research` from benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hmgstore.bench.__main__ import Suite, main  # noqa: E402
from research import PROG, hotness, reach, remote  # noqa: E402

# argparse %-formats these help texts: a percent sign is written %%
RESEARCH = Suite(PROG, {"hotness": hotness, "reach": reach, "remote": remote}, {
    "hotness": "cache hit ratios: pre-sampled hotness against degree order, at 1-20%% of the nodes",
    "reach": "gather rates against the distinct 2 MiB host pages a batch touches: the knee and the cost "
             "per page, kernel and CPU path",
    "remote": "rows fetched from other machines (torch.distributed), against all_to_all; launches "
              "simulated machines on this host unless run under torchrun",
}, "Research benchmarks of hmgstore (the user-facing ones: python -m hmgstore.bench).")

if __name__ == "__main__":
    main(suite=RESEARCH)
