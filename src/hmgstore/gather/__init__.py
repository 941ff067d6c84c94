"""One gather of rows from a table's tiers: the plan and its single kernel launch (:mod:`.plan`), the share of
host rows the CPU reads beside the kernel (:mod:`.cpu_share`), and several batches' gathers fused into one
launch (:mod:`.fusion`)."""
