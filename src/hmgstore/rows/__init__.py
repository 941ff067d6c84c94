"""A table's rows before any gather: ids turned into checked flat tensors (:mod:`.ids`), the stored row formats
(:mod:`.formats`), how hot each row is and how many rows a GPU budget holds (:mod:`.hotness`), which row lives
in which tier (:mod:`.placement`), and the per-tier counters (:mod:`.stats`)."""
