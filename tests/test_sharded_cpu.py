"""ShardedTensor's API on the CPU (the same calls as on several GPUs)."""
import pytest
import torch

import hmgstore
from helpers import random_table


def test_cpu_sharded_table_gathers_like_indexing():
    x = random_table(1000, (8,), torch.float32)
    with hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=320, hot_order=torch.randperm(1000), replicate=64) as t:
        idx = torch.randint(0, 1000, (300,))
        assert torch.equal(t[idx], x[idx]) and torch.equal(t.on("cpu")[idx], x[idx])
        assert t.placement.names == ("replica", "shard0", "host") and len(t) == 1000
        assert "ShardedTensor" in repr(t)
        with pytest.raises(IndexError):
            t[torch.tensor([1000])]


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu_budget": 100}, "hot_order"),
    ({"hot_order": torch.arange(10)}, "gpu_budget"),
    ({"gpu_budget": 10, "hot_order": torch.arange(10), "replicate": 20}, "must fit"),
])
def test_sharded_table_explains_missing_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hmgstore.ShardedTensor(torch.ones(10, 2), ["cpu"], **kwargs)


def test_sharded_table_refuses_odd_device_lists():
    x = torch.ones(10, 2)
    with pytest.raises(ValueError, match="empty"):
        hmgstore.ShardedTensor(x, [], gpu_budget=8, hot_order=torch.arange(10))
    with pytest.raises(ValueError, match="once"):
        hmgstore.ShardedTensor(x, ["cpu", "cpu"], gpu_budget=8, hot_order=torch.arange(10))


def test_sharded_table_does_not_pickle():
    import pickle

    t = hmgstore.ShardedTensor(torch.ones(10, 2), ["cpu"], gpu_budget=8, hot_order=torch.arange(10))
    with pytest.raises(TypeError, match="cannot be sent"):
        pickle.dumps(t)
