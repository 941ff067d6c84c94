"""One GPU budget shared by several tables (hmgstore.rows.budget): the rule the PyG adapter's node and edge
tables follow. Byte budgets read no GPU, so the CUDA branch runs here on the CPU too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hmgstore.rows import budget, formats
from hmgstore.rows.budget import Cost, resident_rows


def test_rows_of_several_tables_of_a_group_cost_their_sum():
    hot = {"a": torch.tensor([1.0, 5.0, 3.0, 0.0]), "b": torch.tensor([4.0, 2.0])}
    costs = [Cost("a", 4, 10, name="x"), Cost("a", 4, 6, name="y"), Cost("b", 2, 100, name="x")]
    rows = resident_rows(costs, 16 + 100 + 16, "cuda", hot)  # a row of a: 16 B; of b: 100 B
    assert rows["a"].tolist() == [1, 2] and rows["b"].tolist() == [0]


def test_whole_tables_are_paid_for_first():
    hot = {None: torch.tensor([3.0, 2.0, 1.0])}
    costs = [Cost(None, 3, 100, name="x"), Cost(None, 3, 8, whole=True, name="y")]
    assert resident_rows(costs, 24 + 200, "cuda", hot)[None].tolist() == [0, 1]
    assert resident_rows([Cost(None, 3, 8, whole=True, name="y")], 24, "cuda", None) == {}  # nothing ranked
    with pytest.raises(ValueError, match=r"gpu_whole tables \['y'\] need 24 bytes"):
        resident_rows(costs, 23, "cuda", hot)


def test_no_rows_on_a_cpu_but_the_budget_is_read_there_too():
    costs = [Cost(None, 3, 8)]
    assert resident_rows(costs, "1KB", "cpu", None) == {}
    assert resident_rows(costs, None, "cuda", None) == {}
    with pytest.raises(ValueError, match="cannot read '16XB'"):
        resident_rows(costs, "16XB", "cpu", None)


def test_a_budget_needs_hotness_of_the_right_length():
    with pytest.raises(ValueError, match=r"hotness per edge type .* hotness=\{edge_type: score\}"):
        resident_rows([Cost(None, 3, 8)], 100, "cuda", None, what="edge type")
    with pytest.raises(ValueError, match="has 2 entries for 3 nodes"):
        resident_rows([Cost(None, 3, 8)], 100, "cuda", {None: torch.ones(2)})


def test_row_bytes_counts_the_stored_format():
    x = np.zeros((5, 100), dtype=np.float32)
    assert budget.row_bytes(x) == 400 == budget.row_bytes(torch.from_numpy(x))
    int8 = formats.get("int8")
    assert budget.row_bytes(x, int8) == int8.pitch(100) < 400
