"""An OGB node dataset's split: read through ogb (``split/<name>/*.csv.gz`` or ``split_dict.pt``), then checked
against the node count, so that no id is truncated, dropped or shared between splits in silence."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..rows import checks

PARTS = ("train", "valid", "test")


def read_split(dataset, folder: Path) -> dict:
    """``dataset.get_idx_split()`` (an ogb ``NodePropPredDataset``), with a damaged ``split_dict.pt`` named:
    ogb unpickles it with no word of which file it read. Raises ValueError naming the file."""
    try:
        return dataset.get_idx_split()
    except Exception as err:  # noqa: BLE001 - unpickling damaged bytes raises any kind (MemoryError, KeyError, ...)
        held = sorted(str(p.relative_to(folder)) for p in (folder / "split").glob("*/split_dict.pt"))
        if not held:
            raise
        raise ValueError(f"{folder}: {', '.join(held)} could not be read ({type(err).__name__}: {err}): the file is "
                         "cut short or damaged; delete it to read the split from split/<name>/*.csv.gz, or "
                         "regenerate it") from None


def checked_split(split: dict, n: int, where: str) -> dict[str, torch.Tensor]:
    """The train, valid and test ids of ``split`` as int64 tensors, each an integer node id below ``n``
    (floats refused, never truncated), 1-D (a table of ids is refused, never flattened), listed once in one
    split only. Raises ValueError naming ``where``."""
    ids = {}
    for part in PARTS:
        if part not in split:
            raise ValueError(f"{where}: the split has no {part!r} ids (split/<name>/{part}.csv.gz)")
        given = np.asarray(split[part])
        if given.ndim > 1 and sum(s > 1 for s in given.shape) > 1:
            raise ValueError(f"{where}: the {part} split holds a table of shape {tuple(given.shape)}, not a list "
                             "of node ids; the split file is damaged or belongs to another dataset")
        ids[part] = checks.id_list(given.reshape(-1), f"the {part} split", n, source=where)
    # a node listed twice weighs twice in training; one in train and test leaks the test labels into training
    times = torch.bincount(torch.cat(list(ids.values())), minlength=n) if n else torch.zeros(0, dtype=torch.int64)
    if bool((times > 1).any()):
        node = int((times > 1).nonzero()[0, 0])
        parts = [part for part, part_ids in ids.items() if bool((part_ids == node).any())]
        count = sum(int((ids[part] == node).sum()) for part in parts)
        raise ValueError(f"{where}: node {node} is listed {count} times in the split ({', '.join(parts)}); each node "
                         "is in one split, once. The split files are damaged or belong to another dataset")
    return ids
