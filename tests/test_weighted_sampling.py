"""Edge-weighted sampling (``weight=`` on a Topology): the distribution PyG defines, on the CPU and a GPU.

Each test samples one hop for many seeds that are all the same tiny
neighbourhood (every seed draws with its own index, so the draws are
independent) and compares the sets drawn with the exact distribution of
successive weighted sampling (:mod:`stats_helpers`), by a chi-square test
at a fixed seed. ``test_check_rejects_a_wrong_sampler`` shows the check
fails a sampler that is off.
"""
from collections import Counter

import pytest
import torch
from stats_helpers import chi2_critical, chi2_statistic, passes, sets_of, successive_set_probabilities

from hmgstore.graph import NeighborSampler, Topology, sample_hop, to_csc
from hmgstore.graph.weighted import exponential_keys

DEVICES = [pytest.param(("cpu", None), id="cpu"),
           pytest.param(("cuda", None), id="cuda-host", marks=pytest.mark.gpu),
           pytest.param(("cuda", 0.5), id="cuda-mixed", marks=pytest.mark.gpu),
           pytest.param(("cuda", 1.0), id="cuda-gpu", marks=pytest.mark.gpu)]
DRAWS = 6000
CASES = {"skewed": [8.0, 4.0, 2.0, 1.0, 0.5], "zeros": [3.0, 0.0, 1.0, 0.0, 2.0],
         "equal": [1.0, 1.0, 1.0, 1.0, 1.0], "one": [0.0, 0.0, 5.0, 0.0, 0.0]}


def neighbourhoods(weights: list[float], copies: int = 4):
    """``copies`` destination nodes (0..copies-1), each with the same len(weights) in-edges and weights, from
    distinct sources; COO in an order that is not CSC order, to exercise the permutation."""
    d = len(weights)
    dst = torch.arange(copies).repeat_interleave(d)
    src = copies + torch.arange(copies * d)
    flip = torch.arange(len(dst)).flip(0)  # given in reverse: CSC order differs from the given order
    weight = torch.tensor(weights[::-1] * copies)  # reversed with the edges: position p of a node has weights[p]
    return torch.stack([src[flip], dst[flip]]), weight[flip], copies + copies * d


def topology(weights, placement, copies: int = 4) -> Topology:
    device, share = placement
    edge_index, weight, n = neighbourhoods(weights, copies)
    csc = to_csc(edge_index, "coo", (n, n))
    budget = None if share is None else int(share * csc.num_edges * 8)
    return Topology(csc, device, gpu_budget=budget, progress=False, weight=weight)


def draw_sets(topo: Topology, k: int, replace: bool = False, draws: int = DRAWS, key: int = 12345, copies: int = 4):
    """Sampled positions (within each node's list) of ``draws`` seeds spread over the ``copies`` nodes."""
    seeds = (torch.arange(draws) % copies).to(topo.device)
    nbr, eid, counts = sample_hop(topo, seeds, k, replace, key)
    first = topo.colptr.index_select(0, seeds).repeat_interleave(counts)
    return (eid - first).cpu(), counts.cpu()


@pytest.mark.parametrize("placement", DEVICES)
@pytest.mark.parametrize("case,k", [("skewed", 2), ("skewed", 3), ("zeros", 2), ("zeros", 4), ("equal", 2),
                                    ("one", 1), ("one", 2)])
def test_without_replacement_matches_successive_sampling(placement, case, k):
    weights = CASES[case]
    pos, counts = draw_sets(topology(weights, placement), k)
    assert bool((counts == k).all())  # PyG's count: min(k, degree), weights or not
    observed = sets_of(pos, counts)
    expected = successive_set_probabilities(weights, k)
    stat, dof = chi2_statistic(observed, expected, DRAWS)
    assert stat < chi2_critical(dof), (case, k, stat, dof, observed)


@pytest.mark.parametrize("placement", DEVICES)
def test_equal_weights_are_uniform_sampling(placement):
    """All-equal weights: every k-subset equally likely, as the uniform sampler draws them."""
    pos, counts = draw_sets(topology([2.5] * 6, placement), 3)
    observed = sets_of(pos, counts)
    assert len(observed) == 20
    uniform = {s: 1 / 20 for s in observed}
    assert passes(observed, uniform, DRAWS)


@pytest.mark.parametrize("placement", DEVICES)
def test_zero_weights_are_drawn_only_to_fill_the_fanout(placement):
    pos, counts = draw_sets(topology(CASES["zeros"], placement), 3)
    assert not bool(((pos == 1) | (pos == 3)).any())  # three positive weights: a fanout of 3 takes exactly those
    pos, counts = draw_sets(topology(CASES["zeros"], placement), 5)
    assert sets_of(pos, counts) == Counter({(0, 1, 2, 3, 4): DRAWS})  # degree <= k: every edge, as PyG


@pytest.mark.parametrize("placement", DEVICES)
def test_with_replacement_draws_in_proportion_to_weight(placement):
    weights = CASES["zeros"]
    pos, counts = draw_sets(topology(weights, placement), 3, replace=True)
    assert bool((counts == 3).all())
    observed = Counter((p,) for p in pos.tolist())
    total = sum(weights)
    expected = {(i,): w / total for i, w in enumerate(weights) if w > 0}
    assert passes(observed, expected, len(pos))


@pytest.mark.parametrize("placement", DEVICES)
def test_every_neighbour_for_minus_one_and_the_draw_order(placement):
    topo = topology(CASES["skewed"], placement)
    pos, counts = draw_sets(topo, -1, draws=8)
    assert pos.tolist() == list(range(5)) * 8
    pos, counts = draw_sets(topo, 5, draws=8)  # degree <= k
    assert pos.tolist() == list(range(5)) * 8
    # the heaviest edge comes first more often than any other: slots are in draw order
    pos, counts = draw_sets(topo, 2, draws=2000)
    firsts = Counter(pos[0::2].tolist())
    assert firsts.most_common(1)[0][0] == 0 and 0.48 < firsts[0] / 2000 < 0.56  # exactly 8 / 15.5 = 0.516


def test_check_rejects_a_wrong_sampler():
    """The chi-square check can fail: draws from uniform sampling, and from keys u / w (a common slip for
    -log(u) / w), both fail against skewed weights."""
    weights = CASES["skewed"]
    expected = successive_set_probabilities(weights, 2)
    uniform, _ = draw_sets(topology([1.0] * 5, ("cpu", None)), 2)
    assert not passes(sets_of(uniform, torch.full((DRAWS,), 2)), expected, DRAWS)
    g = torch.Generator().manual_seed(0)
    u = torch.rand(DRAWS, 5, generator=g, dtype=torch.float64)
    wrong = torch.argsort(u / torch.tensor(weights, dtype=torch.float64), dim=1)[:, :2]
    assert not passes(sets_of(wrong.reshape(-1), torch.full((DRAWS,), 2)), expected, DRAWS)
    right = torch.argsort(exponential_keys(torch.tensor(weights).expand(DRAWS, 5), u), dim=1)[:, :2]
    assert passes(sets_of(right.reshape(-1), torch.full((DRAWS,), 2)), expected, DRAWS)


@pytest.mark.parametrize("bad,error", [([1.0, -1.0, 1.0, 1.0, 1.0], "edge weight 1 is -1.0"),
                                       ([1.0, float("nan"), 1.0, 1.0, 1.0], "finite"),
                                       ([1.0, 2.0], "one number per edge")])
def test_bad_weights_are_refused(bad, error):
    csc = to_csc(torch.tensor([[1, 2, 3, 4, 5], [0, 0, 0, 0, 0]]), "coo", (6, 6))
    with pytest.raises(ValueError, match=error):
        Topology(csc, "cpu", weight=bad, progress=False)


@pytest.mark.gpu
def test_gpu_draws_as_the_cpu_reference():
    """Same keys, same algorithm: the GPU kernel picks the same positions as the torch version, but where
    two keys differ in their last bits (log in double rounds differently on the two devices)."""
    cpu = draw_sets(topology(CASES["skewed"], ("cpu", None)), 3)[0]
    for share in (None, 0.5, 1.0):
        gpu = draw_sets(topology(CASES["skewed"], ("cuda", share)), 3)[0]
        assert float((gpu == cpu).double().mean()) > 0.999


@pytest.mark.parametrize("placement", DEVICES)
def test_multi_hop_sampler_with_weights(placement):
    """The sampler runs weighted hops (queued with CUDA graphs on a GPU): zero-weight edges stay out."""
    device, share = placement
    g = torch.Generator().manual_seed(3)
    n = 400
    src, dst = torch.randint(0, n, (6000,), generator=g), torch.randint(0, n, (6000,), generator=g)
    weight = torch.where(torch.rand(6000, generator=g) < 0.5, 0.0, torch.rand(6000, generator=g) + 0.1)
    csc = to_csc(torch.stack([src, dst]), "coo", (n, n))
    budget = None if share is None else int(share * csc.num_edges * 8)
    topo = Topology(csc, device, gpu_budget=budget, progress=False, weight=weight)
    sampler = NeighborSampler({None: topo}, {None: n}, [3, 2], generator=torch.Generator().manual_seed(1))
    positive = (topo.weight > 0).to(device)
    degree_pos = torch.zeros(n, dtype=torch.int64).index_add_(0, csc.col(), (topo.weight > 0).long()).to(device)
    for _ in range(3):
        out = sampler.sample({None: torch.arange(0, n, 7, device=device)})
        eid = out.edge[None]
        seeds = out.node[None][out.col[None]]
        # a zero-weight edge only where its node has fewer than the fanout of positive ones
        zero = ~positive[eid]
        assert bool((degree_pos[seeds[zero]] < 3).all())


@pytest.mark.gpu
@pytest.mark.parametrize("share", [None, 0.5, 1.0], ids=["host", "mixed", "gpu"])
def test_warp_kernel_draws_as_the_thread_kernel(share, monkeypatch):
    """hmg_sample_weighted_warp (fanouts up to 32) and hmg_sample_weighted give the same slots, key for key,
    on lists longer and shorter than a warp, weights 0 included."""
    from hmgstore.cuda import sample as kernels

    g = torch.Generator().manual_seed(2)
    n = 300
    src, dst = torch.randint(0, n, (9000,), generator=g), (torch.rand(9000, generator=g) ** 2 * n).long()
    weight = torch.where(torch.rand(9000, generator=g) < 0.2, 0.0, torch.rand(9000, generator=g))
    csc = to_csc(torch.stack([src, dst]), "coo", (n, n))
    budget = None if share is None else int(share * csc.num_edges * 8)
    topo = Topology(csc, "cuda", gpu_budget=budget, progress=False, weight=weight)
    seeds = torch.arange(n, device="cuda").repeat(3)
    for k in (1, 5, 32):
        warp = sample_hop(topo, seeds, k, False, 77)[1]
        monkeypatch.setattr(kernels, "WEIGHTED_WARP", False)
        thread = sample_hop(topo, seeds, k, False, 77)[1]
        monkeypatch.setattr(kernels, "WEIGHTED_WARP", True)
        assert torch.equal(warp, thread), k
