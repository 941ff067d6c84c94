"""Edge-weighted sampling (``weight=`` on a Topology): the distribution PyG defines, on the CPU and a GPU.

Each test samples one hop for many seeds that are all the same tiny
neighbourhood (every seed draws with its own index, so the draws are
independent) and compares the sets drawn with the exact distribution of
successive weighted sampling (:mod:`stats_helpers`), by a chi-square test
at a fixed seed. ``test_check_rejects_a_wrong_sampler`` shows the check
fails a sampler that is off. Lists longer than ``REJECT_RATIO`` times the
fanout with balanced weights are drawn by rejection (:mod:`hmgstore.graph.weighted`):
their tests compare the slots in draw order (ordered tuples) with the exact
probabilities, and ``test_rejection_check_can_fail`` breaks the acceptance
test on purpose to show those checks fail then.
"""
import itertools
from collections import Counter

import pytest
import torch
from stats_helpers import chi2_critical, chi2_statistic, passes, sets_of, successive_set_probabilities

from hmgstore.graph import NeighborSampler, Topology, sample_hop, to_csc, weighted
from hmgstore.graph.draws import _draw_mixed, _seed_hash, unit_closed_open
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


# ---- rejection sampling of long balanced lists -----------------------------------------------------------
#: 25 edges: longer than REJECT_RATIO * k for k <= 3, weights balanced (deg * max / sum <= MAX_SKEW) but for "huge"
HUB_CASES = {"graded": [1 + i / 8 for i in range(25)],  # skew 1.6
             "zeros": [0.0 if i % 2 else 1.0 + i % 5 for i in range(25)],  # 12 zeros, skew 3.2
             "bounded": [5.0, 5.0] + [1.0] * 23,  # skew 3.8, just under MAX_SKEW: most trials rejected
             "equal": [2.5] * 25,
             "huge": [100.0] + [1.0] * 24}  # skew 20: scanned
HUB_DRAWS = 20000


def successive_sequence_probabilities(weights: list[float], k: int) -> dict[tuple, float]:
    """Ordered position tuple -> probability that successive weighted sampling draws it in that order (every
    list here has at least k positive weights)."""
    out = {}
    for seq in itertools.permutations([i for i, w in enumerate(weights) if w > 0], k):
        p, left = 1.0, sum(weights)
        for i in seq:
            p *= weights[i] / left
            left -= weights[i]
        out[seq] = p
    return out


def pooled_passes(observed: Counter, expected: dict[tuple, float], n: int, alpha: float = 1e-4) -> bool:
    """The chi-square check of :func:`stats_helpers.passes`, with the cells expected fewer than 5 times pooled
    into one (the statistic's chi-square law needs that); a draw outside the support fails."""
    if any(key not in expected for key in observed):
        return False
    small = [key for key, p in expected.items() if n * p < 5]
    pooled_obs = Counter({key: observed.get(key, 0) for key in expected if key not in small})
    pooled_exp = {key: p for key, p in expected.items() if key not in small}
    if small:
        pooled_obs[("pooled",)] = sum(observed.get(key, 0) for key in small)
        pooled_exp[("pooled",)] = sum(expected[key] for key in small)
    return passes(pooled_obs, pooled_exp, n, alpha)


def sequences_of(pos: torch.Tensor, k: int) -> Counter:
    return Counter(map(tuple, pos.view(-1, k).tolist()))


def hub_draws(case: str, placement, k: int, draws: int = HUB_DRAWS) -> tuple[Counter, Topology]:
    """Slots drawn for ``draws`` seeds on copies of the 25-edge list ``case``: ordered tuples for k <= 2, sets
    above (ordered triples of 25 positions are too many cells for the draws)."""
    topo = topology(HUB_CASES[case], placement)
    pos, counts = draw_sets(topo, k, draws=draws)
    assert bool((counts == k).all())
    return (sequences_of(pos, k) if k <= 2 else sets_of(pos, counts)), topo


def expected_hub(case: str, k: int) -> dict[tuple, float]:
    weights = HUB_CASES[case]
    return successive_sequence_probabilities(weights, k) if k <= 2 else successive_set_probabilities(weights, k)


@pytest.mark.parametrize("placement", DEVICES)
@pytest.mark.parametrize("case,k", [("graded", 1), ("graded", 2), ("graded", 3), ("zeros", 2), ("zeros", 3),
                                    ("bounded", 1), ("bounded", 2), ("equal", 2), ("equal", 3)])
def test_rejection_matches_successive_sampling(placement, case, k):
    """Long balanced lists go to rejection, and its slots, in draw order, follow successive sampling."""
    observed, topo = hub_draws(case, placement, k)
    assert len(HUB_CASES[case]) > weighted.REJECT_RATIO * k and float(topo.rejection_wmax[0]) == max(HUB_CASES[case])
    assert pooled_passes(observed, expected_hub(case, k), HUB_DRAWS), (case, k)


def test_rejection_check_can_fail(monkeypatch):
    """The checks above fail rejection with a wrong acceptance: ``sqrt(u)`` for ``u`` (accepts with probability
    (w / wmax)^2, squaring the weights), or every trial accepted (uniform over the positive weights)."""
    expected = expected_hub("graded", 2)
    assert pooled_passes(hub_draws("graded", ("cpu", None), 2)[0], expected, HUB_DRAWS)
    for wrong in (lambda h, t: unit_closed_open(h, t).sqrt(), lambda h, t: torch.zeros(torch.broadcast_shapes(
            h.shape, torch.as_tensor(t).shape), dtype=torch.float64)):
        monkeypatch.setattr(weighted, "unit_closed_open", wrong)
        assert not pooled_passes(hub_draws("graded", ("cpu", None), 2)[0], expected, HUB_DRAWS)
        monkeypatch.undo()


@pytest.mark.parametrize("placement", DEVICES)
def test_skewed_and_sparse_lists_are_scanned_exactly(placement):
    """One weight far above the rest (skew over MAX_SKEW), or fewer positive weights than the fanout: such lists
    are not drawn by rejection (``rejection_wmax`` 0), and the scan draws them exactly."""
    observed, topo = hub_draws("huge", placement, 2)
    assert float(topo.rejection_wmax[0]) == 0.0
    assert pooled_passes(observed, expected_hub("huge", 2), HUB_DRAWS)
    sparse = [0.0] * 40
    sparse[5], sparse[17], sparse[30] = 1.0, 2.0, 3.0  # three positive weights, fanout 4, 40 > REJECT_RATIO * 4
    topo = topology(sparse, placement)
    assert float(topo.rejection_wmax[0]) == 0.0
    pos, counts = draw_sets(topo, 4, draws=4000)
    slots = pos.view(-1, 4)
    assert bool((slots[:, :3].sort(1).values == torch.tensor([5, 17, 30])).all())  # the positive ones first
    zero = Counter((p,) for p in slots[:, 3].tolist())
    assert passes(zero, {(p,): 1 / 37 for p in range(40) if p not in (5, 17, 30)}, 4000)  # then a zero, uniformly


def test_which_lists_qualify_for_rejection(monkeypatch):
    """``rejection_wmax``: the largest weight where ``deg * wmax <= MAX_SKEW * sum(w)``, else 0, the same when
    computed in passes of a few edges."""
    lists = [[], [0.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [7.5]]
    dst = torch.cat([torch.full((len(w),), v) for v, w in enumerate(lists)])
    csc = to_csc(torch.stack([torch.arange(len(dst)), dst]), "coo", (len(dst), len(lists)))
    weight = torch.tensor([w for ws in lists for w in ws])
    want = torch.tensor([0.0, 0.0, 4.0, 0.0, 3.0, 7.5])  # skew: -, -, 4 (at the bound), 5, 1.5, 1
    assert torch.equal(Topology(csc, "cpu", weight=weight, progress=False).rejection_wmax, want)
    monkeypatch.setattr(weighted, "_WMAX_STEP", 2)
    assert torch.equal(weighted.rejection_wmax(weight, csc.colptr), want)


def naive_rejection(topo: Topology, v: int, i: int, c: int, key: int, bound: int) -> list[int] | None:
    """Rejection as the module docstring states it, one trial at a time: the first ``c`` distinct accepted
    positions of node ``v`` drawn as seed ``i``, or None when ``bound`` trials do not find them."""
    lo, deg = int(topo.colptr[v]), int(topo.colptr[v + 1] - topo.colptr[v])
    h, wmax, taken = _seed_hash(key, torch.tensor([i])), float(topo.rejection_wmax[v]), []
    for t in range(bound):
        counter = weighted.REJECT_COUNTER + 2 * t
        p = int(_draw_mixed(h, counter, torch.tensor([deg])))
        if float(unit_closed_open(h, counter + 1)) * wmax < float(topo.weight[lo + p]) and p not in taken:
            taken.append(p)
            if len(taken) == c:
                return taken
    return None


def test_rejection_takes_the_first_distinct_accepted_trials(monkeypatch):
    """The vectorised rejection is the one-trial-at-a-time definition, whatever its round size; a list that
    runs out of trials is scanned, as the kernels do."""
    topo = topology(HUB_CASES["zeros"], ("cpu", None), copies=3)
    seeds = torch.arange(300) % 3
    first, degree = topo.colptr[seeds], topo.degree(seeds)
    counts = torch.full((300,), 3)
    h = _seed_hash(5, torch.arange(300))
    runs = [weighted.rejection_positions(topo.weight, first, degree, counts, topo.rejection_wmax[seeds], h, trials)
            for trials in (1, 7, None, 500)]
    for slots, done in runs[1:]:
        assert torch.equal(slots, runs[0][0]) and bool(done.all())
    for i in range(0, 300, 29):
        assert runs[0][0][i].tolist() == naive_rejection(topo, int(seeds[i]), i, 3, 5, 10**4)
    scanned = draw_sets(topo, 3, draws=300, key=5, copies=3)[0].view(-1, 3)
    monkeypatch.setattr(weighted, "REJECT_RATIO", 2**40)
    assert not torch.equal(scanned, draw_sets(topo, 3, draws=300, key=5, copies=3)[0].view(-1, 3))
    monkeypatch.setattr(weighted, "REJECT_RATIO", 8)
    monkeypatch.setattr(weighted, "TRIALS_PER_SLOT", 0)
    monkeypatch.setattr(weighted, "TRIALS_EXTRA", 9)  # often too few: those lists fall back to the scan
    bounded = draw_sets(topo, 3, draws=300, key=5, copies=3)[0].view(-1, 3)
    monkeypatch.setattr(weighted, "REJECT_RATIO", 2**40)
    scan = draw_sets(topo, 3, draws=300, key=5, copies=3)[0].view(-1, 3)
    found = [naive_rejection(topo, i % 3, i, 3, 5, 9) for i in range(300)]
    assert 10 < sum(f is None for f in found) < 290  # both ways taken
    for i, f in enumerate(found):
        assert bounded[i].tolist() == (scan[i].tolist() if f is None else f)


def hub_graph(seed: int = 4):
    """Hubs among small nodes: node 0 a star of 5,000 edges (uniform weights), node 1 of 3,000 with one huge
    weight (scanned), node 2 of 2,000 with half its weights 0; 500 nodes, 6,000 more random edges."""
    g = torch.Generator().manual_seed(seed)
    n = 500
    dst = torch.cat([torch.zeros(5000), torch.ones(3000), torch.full((2000,), 2), torch.randint(0, n, (6000,),
                                                                                               generator=g)]).long()
    src = torch.randint(0, n, (len(dst),), generator=g)
    weight = torch.rand(len(dst), generator=g) * 0.5 + 0.5
    weight[5000] = 1e4
    weight[8000:10000] *= torch.rand(2000, generator=g) < 0.5
    weight[10000:] *= torch.rand(6000, generator=g) < 0.8
    return to_csc(torch.stack([src, dst]), "coo", (n, n)), weight, n


@pytest.mark.gpu
@pytest.mark.parametrize("share", [None, 0.5, 1.0], ids=["host", "mixed", "gpu"])
@pytest.mark.parametrize("warp", [True, False], ids=["warp", "thread"])
def test_gpu_rejection_draws_as_the_cpu(share, warp, monkeypatch):
    """Rejection takes the same slots on a GPU as on the CPU, bit for bit, with the topology in every tier and
    both kernels (fanouts up to 32 by a warp, above by a thread); scanned lists agree but for keys that differ
    in their last bits."""
    from hmgstore.cuda import sample as kernels

    csc, weight, n = hub_graph()
    cpu = Topology(csc, "cpu", progress=False, weight=weight)
    budget = None if share is None else int(share * csc.num_edges * 8)
    gpu = Topology(csc, "cuda", gpu_budget=budget, progress=False, weight=weight)
    assert torch.equal(gpu.rejection_wmax.cpu(), cpu.rejection_wmax)
    assert float(cpu.rejection_wmax[0]) > 0 and float(cpu.rejection_wmax[1]) == 0 and float(cpu.rejection_wmax[2]) > 0
    monkeypatch.setattr(kernels, "WEIGHTED_WARP", warp)
    seeds = torch.arange(n).repeat(4)
    degree = cpu.degree(seeds)
    for k in (1, 5, 15, 32, 40):
        want, counts = sample_hop(cpu, seeds, k, False, 91)[1:]
        got = sample_hop(gpu, seeds.cuda(), k, False, 91)[1].cpu()
        rejected = (degree > weighted.REJECT_RATIO * counts) & (cpu.rejection_wmax[seeds] > 0)
        rejected = rejected.repeat_interleave(counts)
        assert bool(rejected.any()) and torch.equal(got[rejected], want[rejected]), k
        assert float((got == want).double().mean()) > 0.999, k


@pytest.mark.gpu
def test_gpu_sampler_with_hubs_draws_the_cpu_samples_bit_for_bit():
    """A graph whose lists are either hubs drawn by rejection or no longer than the fanout: every hop the same
    on both devices, so the multi-hop sampler's batches (queued in CUDA graphs on the GPU) are equal."""
    g = torch.Generator().manual_seed(6)
    n, hubs = 1000, 10
    hub_dst = torch.arange(hubs).repeat_interleave(torch.tensor([5000, 3000, 2000, 1000, 700, 500, 400, 300, 200, 100]))
    small_dst = torch.arange(hubs, n).repeat_interleave(2)
    dst = torch.cat([hub_dst, small_dst])
    src = torch.cat([torch.randint(0, n, (len(hub_dst),), generator=g), torch.randint(0, hubs, (len(small_dst),),
                                                                                       generator=g)])
    weight = torch.rand(len(dst), generator=g) + 0.2
    csc = to_csc(torch.stack([src, dst]), "coo", (n, n))
    for share in (None, 1.0):
        budget = None if share is None else int(share * csc.num_edges * 8)
        samplers = [NeighborSampler({None: Topology(csc, device, gpu_budget=budget if device == "cuda" else None,
                                                    progress=False, weight=weight)}, {None: n}, [3, 2])
                    for device in ("cpu", "cuda")]
        assert bool((samplers[0].topologies[None].rejection_wmax[:hubs] > 0).all())
        seeds = torch.randperm(n, generator=g)[:200]
        for _ in range(3):
            torch.manual_seed(8)
            a = samplers[0].sample({None: seeds})
            torch.manual_seed(8)
            b = samplers[1].sample({None: seeds.cuda()})
            for field in ("node", "row", "col", "edge"):
                assert torch.equal(getattr(a, field)[None], getattr(b, field)[None].cpu()), field


@pytest.mark.parametrize("placement", DEVICES)
def test_with_replacement_a_list_is_drawn_alone_beside_heavier_ones(placement):
    """Each seed's draws follow its own list's weights, whatever the other seeds of the batch weigh: a light
    list beside lists 1e16 times heavier keeps its 1:3 and never draws its zero weight."""
    device, share = placement
    heavy, light = 2, 2  # nodes 0-1: two edges of weight 1e16; nodes 2-3: weights 1, 3, 0
    dst = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    src = 4 + torch.arange(len(dst))
    weight = torch.tensor([1e16] * 4 + [1.0, 3.0, 0.0] * 2)
    csc = to_csc(torch.stack([src, dst]), "coo", (14, 14))
    budget = None if share is None else int(share * csc.num_edges * 8)
    topo = Topology(csc, device, gpu_budget=budget, progress=False, weight=weight)
    seeds = (torch.arange(DRAWS) % (heavy + light)).to(topo.device)
    nbr, eid, counts = sample_hop(topo, seeds, 3, True, 777)
    first = topo.colptr.index_select(0, seeds).repeat_interleave(counts)
    pos, of_light = (eid - first).cpu(), (seeds >= heavy).repeat_interleave(counts).cpu()
    drawn = pos[of_light]
    assert 2 not in drawn.tolist()
    assert passes(Counter((p,) for p in drawn.tolist()), {(0,): 0.25, (1,): 0.75}, len(drawn))
