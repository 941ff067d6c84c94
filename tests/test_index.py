"""Index normalisation and range checks (CPU)."""
import numpy as np
import pytest
import torch

from hmgstore.rows.ids import as_tensor, check_range, normalize

CPU = torch.device("cpu")


def test_kinds_of_index():
    assert as_tensor(5, 10)[1] == ()
    ids, shape = as_tensor(slice(2, 8, 3), 10)
    assert ids.tolist() == [2, 5] and shape == (2,)
    ids, _ = as_tensor(torch.tensor([True] + [False] * 8 + [True]), 10)
    assert ids.tolist() == [0, 9]
    ids, shape = as_tensor([], 10)
    assert ids.numel() == 0 and shape == (0,)
    ro = np.arange(3)
    ro.setflags(write=False)
    assert as_tensor(ro, 10)[0].tolist() == [0, 1, 2]
    assert as_tensor(torch.zeros(2, 3, dtype=torch.int32), 10)[1] == (2, 3)


@pytest.mark.parametrize("bad", [torch.tensor([1.0]), np.array([0.5]), torch.tensor([1 + 1j]), "3", 2.0, True])
def test_non_integer_index_is_a_type_error(bad):
    with pytest.raises(TypeError):
        as_tensor(bad, 10)


def test_mask_of_wrong_length():
    with pytest.raises(IndexError, match=r"shape \(10,\)"):
        as_tensor(torch.ones(9, dtype=torch.bool), 10)


@pytest.mark.parametrize("bad, pos", [([0, 10], 1), ([-1, 3], 0), ([3, 4, 2**40], 2)])
def test_check_range_names_value_and_position(bad, pos):
    with pytest.raises(IndexError, match=rf"index {bad[pos]} at position {pos} .* 10 rows"):
        check_range(torch.tensor(bad), 10)


def test_normalize_keeps_int32_and_widens_narrow_types():
    assert normalize(torch.tensor([1, 2], dtype=torch.int32), 5, CPU).ids.dtype == torch.int32
    assert normalize(torch.tensor([1, 2], dtype=torch.int16), 5, CPU).ids.dtype == torch.int64
    assert normalize(np.array([1, 2], dtype=np.uint8), 5, CPU).ids.tolist() == [1, 2]  # ids, as numpy reads them
    with pytest.raises(TypeError, match=r"torch.uint8 index is ambiguous.*index.bool\(\) for a mask"):
        normalize(torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8), 5, CPU)  # torch reads it as a mask
    idx = normalize(torch.tensor([[1], [2]]), 5, CPU)
    assert idx.ids.shape == (2,) and idx.shape == (2, 1)
    with pytest.raises(IndexError):
        normalize([7], 5, CPU)
