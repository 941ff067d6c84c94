"""Command-line tools: the flags shared by the examples and ``python -m hmgstore.bench`` (:mod:`.flags`), and
``python -m hmgstore.cli.partition`` (:mod:`.partition`)."""
