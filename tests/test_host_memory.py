"""hmgstore.util.host_memory: sizes a user's argument sets are checked against the host memory available, so
that a fanout asking for terabytes raises MemoryError instead of the OOM killer ending the process."""
import pytest
import torch

from hmgstore.graph import NeighborSampler, Topology, sample_hop, to_csc
from hmgstore.util import host_memory


def test_available_bytes_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    assert host_memory.available_bytes(str(meminfo)) == 20_000_000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")  # an old kernel: no MemAvailable line
    assert host_memory.available_bytes(str(meminfo)) is None
    assert host_memory.available_bytes(str(tmp_path / "missing")) is None
    real = host_memory.available_bytes()
    assert real is None or real > 0


def test_check_room_says_what_to_lower():
    host_memory.check_room(2 * 10**9, "two GB", "fix it", available=2 * 10**9)  # exactly what is there: fine
    host_memory.check_room(10**6, "a small hop", "fix it", available=10)  # under CHECK_FROM: not looked at
    with pytest.raises(MemoryError, match=r"a hop needs about 2 GB of host memory, more than the 1 GB .*lower it"):
        host_memory.check_room(2 * 10**9, "a hop", "lower it", available=10**9)


def _topology(weighted=False):
    ei = torch.tensor([[1, 2, 3, 0, 2], [0, 0, 0, 1, 1]])
    csc = to_csc(ei, "coo", (4, 4))
    extra = {"weight": torch.tensor([1.0, 2.0, 3.0, 1.0, 1.0])} if weighted else {}
    return Topology(csc, "cpu", progress=False, **extra)


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
def test_a_replace_fanout_past_the_memory_available_raises_before_allocating(monkeypatch, weighted):
    monkeypatch.setattr(host_memory, "available_bytes", lambda path="": 10**9)  # 1 GB left on this "machine"
    topo = _topology(weighted)
    nbr, _, counts = sample_hop(topo, torch.tensor([0, 1]), 1000, True, key=3)  # 2,000 draws: fine
    assert counts.tolist() == [1000, 1000] and len(nbr) == 2000
    with pytest.raises(MemoryError, match=r"fanout of 100000000 .* more than the 1 GB available; lower the fanout"):
        sample_hop(topo, torch.tensor([0, 1]), 100_000_000, True, key=3)  # 2e8 draws: ~7-16 GB
    sampler = NeighborSampler({None: topo}, {None: 4}, [100_000_000], replace=True)
    with pytest.raises(MemoryError, match="lower the fanout"):
        sampler.sample({None: torch.tensor([0, 1])})
    assert len(NeighborSampler({None: topo}, {None: 4}, [1000], replace=True).sample({None: torch.tensor([0])})
               .node[None]) > 1  # the sampler still works below the limit
