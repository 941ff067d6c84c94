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
    with pytest.raises(ValueError, match="has 2 entries for 3 rows"):
        resident_rows([Cost(None, 3, 8)], 100, "cuda", {None: torch.ones(2)})


def test_row_bytes_counts_the_stored_format():
    x = np.zeros((5, 100), dtype=np.float32)
    assert budget.row_bytes(x) == 400 == budget.row_bytes(torch.from_numpy(x))
    int8 = formats.get("int8")
    assert budget.row_bytes(x, int8) == int8.pitch(100) < 400


def test_auto_keeps_narrow_tables_whole_where_they_fit_a_quarter_of_the_budget():
    x, y, mask = Cost(None, 1000, 512, name="x"), Cost(None, 1000, 8, name="y"), Cost(None, 1000, 1, name="mask")
    assert budget.small_tables([x, y, mask], 4 * 9000, "cuda") == {"y", "mask"}  # 9,000 B: exactly a quarter
    assert budget.small_tables([x, y, mask], 4 * 9000 - 1, "cuda") == set()  # a byte short: none of them
    assert budget.small_tables([x], "1MB", "cuda") == set()  # no narrow table
    assert budget.small_tables([x, y], None, "cuda") == set()  # no budget: nothing on the GPU
    assert budget.small_tables([x, y], "1MB", "cpu") == set()  # no GPU tier on a CPU
    with pytest.raises(ValueError):
        budget.small_tables([x, y], "lots", "cuda")


@pytest.mark.gpu
def test_from_data_keeps_the_labels_whole_by_default():
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import from_data

    n = 4000
    data = Data(x=torch.randn(n, 64), y=torch.randint(0, 5, (n,)), edge_index=torch.randint(0, n, (2, 4 * n)))
    features, _ = from_data(data, device="cuda", gpu_budget=n * 64 * 4 // 4, progress=False)
    assert features.table(None, "y").num_gpu_rows == n
    assert 0 < features.table(None, "x").num_gpu_rows < n
    features, _ = from_data(data, device="cuda", gpu_budget=n * 64 * 4 // 4, gpu_whole=(), progress=False)
    assert features.table(None, "y").num_gpu_rows < n


def test_a_budget_is_resolved_once_into_bytes_the_policy_reads_as_they_are(monkeypatch):
    costs = [Cost(None, 100, 100, name="x"), Cost(None, 100, 8, name="y")]
    calls = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: calls.append(device) or (10_000, 20_000))
    total = budget.resolve(costs, "auto", "cuda")
    assert total == 5_000 and len(calls) == 1  # the lesser of the tables (10,800 B) and half the free memory
    assert budget.small_tables(costs, total, "cuda") == {"y"}  # 800 B: within a quarter of 5,000
    rows = resident_rows(costs, total, "cuda", {None: torch.arange(100)})[None]
    assert rows.tolist() == list(range(99, 99 - 5_000 // 108, -1)) and len(calls) == 1  # bytes: no second reading
    assert budget.resolve(costs, "8GB", "cpu") is None and budget.resolve(costs, None, "cuda") is None
    with pytest.raises(ValueError, match="cannot read"):
        budget.resolve(costs, "16XB", "cpu")
