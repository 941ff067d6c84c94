"""``weight_attr`` and ``time_attr`` read from a ``(FeatureStore, GraphStore)`` pair as from the graph itself.

A pair made by :func:`from_data` keeps node attributes as node tables and per-edge attributes as edge
tables; a :class:`HybridNeighborSampler` over it must hold the same weights and times as one over the
``Data``/``HeteroData``, so the same seeds and generator draw the same samples. Node times are not edge
times (group ``None`` names the node type and the edge type of a homogeneous graph alike), and an
attribute the graph lacks is refused naming it and how to store it.
"""
import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.sampler import NodeSamplerInput  # noqa: E402

from hmgstore.plugins.pyg import CSCGraphStore, HybridNeighborSampler, from_data  # noqa: E402

WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")


def homogeneous(n=60, m=600, seed=0, **extra) -> Data:
    g = torch.Generator().manual_seed(seed)
    data = Data(x=torch.randn(n, 4, generator=g), y=torch.randint(0, 3, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, m), generator=g))
    values = {"edge_weight": torch.rand(m, generator=g) + 0.01, "time": torch.randint(0, 50, (n,), generator=g),
              "edge_time": torch.randint(0, 50, (m,), generator=g)}
    for name in extra:
        data[name] = values[name]
    return data


def heterogeneous(attr: str, seed=1) -> HeteroData:
    """Papers and authors; ``attr`` on the writes edges (weights, edge times) or on both node types (times)."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(80, 4, generator=g), torch.randn(40, 4, generator=g)
    data[WRITES].edge_index = torch.stack([torch.randint(0, 40, (500,), generator=g),
                                           torch.randint(0, 80, (500,), generator=g)])
    data[CITES].edge_index = torch.randint(0, 80, (2, 600), generator=g)
    if attr == "time":
        data["paper"].time = torch.randint(0, 50, (80,), generator=g)
        data["author"].time = torch.randint(0, 50, (40,), generator=g)
    elif attr == "edge_weight":
        data[WRITES].edge_weight = torch.rand(500, generator=g) + 0.01
    else:
        data[WRITES][attr] = torch.randint(0, 50, (500,), generator=g)
    return data


def stores(data):
    return from_data(data, device="cpu", gpu_budget=None, progress=False)


def sampler(data, fanout, **options) -> HybridNeighborSampler:
    return HybridNeighborSampler(data, fanout, device="cpu", gpu_budget=None, progress=False,
                                 generator=torch.Generator().manual_seed(7), **options)


def batches(s: HybridNeighborSampler, seeds, node_type=None, with_time=False) -> list:
    """Three batches of ``s``' samples (as plain lists, dicts per type when heterogeneous)."""
    out = []
    for part in seeds.chunk(3):
        time = torch.randint(10, 50, (len(part),), generator=torch.Generator().manual_seed(3)) if with_time else None
        got = s.sample_from_nodes(NodeSamplerInput(input_id=None, node=part, time=time, input_type=node_type))
        out.append([_plain(getattr(got, f)) for f in ("node", "row", "col", "edge", "batch", "num_sampled_nodes")])
    return out


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.tolist() if isinstance(value, torch.Tensor) else value


CASES = [  # (name of the attribute, sampler option, seeds need times of their own)
    pytest.param("edge_weight", "weight_attr", False, id="weight"),
    pytest.param("time", "time_attr", False, id="node-time"),
    pytest.param("edge_time", "time_attr", True, id="edge-time"),
]


STRATEGIES = [({}, "uniform"), ({"temporal_strategy": "last"}, "last")]  # weights have no temporal strategy


@pytest.mark.parametrize("attr,option,with_time,extra", [
    pytest.param(*case.values, extra, id=f"{case.id}-{name}") for case in CASES for extra, name in STRATEGIES
    if case.values[1] == "time_attr" or not extra])
def test_homogeneous_pair_samples_as_the_data(attr, option, with_time, extra):
    data = homogeneous(**{attr: True})
    ours, theirs = (sampler(d, [3, 2], **{option: attr}, **extra) for d in (stores(data), data))
    pair_topology, data_topology = ours.topologies[None], theirs.topologies[None]
    assert (pair_topology.weighted, pair_topology.temporal) == (data_topology.weighted, data_topology.temporal)
    assert torch.equal(ours.edge_permutation, theirs.edge_permutation)
    seeds = torch.arange(0, 60, 2)
    assert batches(ours, seeds, with_time=with_time) == batches(theirs, seeds, with_time=with_time)
    if option == "time_attr":
        assert bool(ours.node_time) == (attr == "time")  # node times read as node times, edge times as edge times


@pytest.mark.parametrize("attr,option,with_time", CASES)
def test_heterogeneous_pair_samples_as_the_data(attr, option, with_time):
    data = heterogeneous(attr)
    ours, theirs = (sampler(d, [3, 2], **{option: attr}) for d in (stores(data), data))
    for et in (WRITES, CITES):
        pair_topology, data_topology = ours.topologies[et], theirs.topologies[et]
        assert (pair_topology.weighted, pair_topology.temporal) == (data_topology.weighted, data_topology.temporal)
    assert ours.topologies[WRITES].weighted or ours.topologies[WRITES].temporal  # the attribute was found
    seeds = torch.arange(0, 80, 2)
    assert batches(ours, seeds, "paper", with_time) == batches(theirs, seeds, "paper", with_time)


def test_last_takes_whole_lists_alike():
    """Every neighbour no later than the seed (``-1``, "last"): the same deterministic subgraph both ways."""
    for attr in ("time", "edge_time"):
        data = homogeneous(**{attr: True})
        ours, theirs = (HybridNeighborSampler(d, [-1, -1], device="cpu", gpu_budget=None, progress=False,
                                              time_attr=attr, temporal_strategy="last") for d in (stores(data), data))
        seeds = torch.arange(0, 60, 5)
        assert batches(ours, seeds, with_time=True) == batches(theirs, seeds, with_time=True)


def test_another_feature_store_tells_levels_by_rows():
    """A FeatureStore other than hmgstore's holds both levels under group None: rows per node are node times,
    rows per edge are weights."""
    from torch_geometric.testing import MyFeatureStore

    data = homogeneous(edge_weight=True, time=True)
    feature_store, graph_store = MyFeatureStore(), CSCGraphStore()
    graph_store.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(60, 60))
    for name in ("x", "time", "edge_weight"):
        feature_store.put_tensor(data[name], group_name=None, attr_name=name, index=None)
    pair = (feature_store, graph_store)
    seeds = torch.arange(0, 60, 2)
    assert batches(sampler(pair, [3], time_attr="time"), seeds) == batches(sampler(data, [3], time_attr="time"),
                                                                           seeds)
    ours, theirs = sampler(pair, [3], weight_attr="edge_weight"), sampler(data, [3], weight_attr="edge_weight")
    assert batches(ours, seeds) == batches(theirs, seeds)
    with pytest.raises(ValueError, match="edge attribute 'time'"):  # per node, not per edge
        sampler(pair, [3], weight_attr="time")


@pytest.mark.parametrize("hetero", [False, True], ids=["homogeneous", "heterogeneous"])
def test_missing_attributes_are_named_with_the_fix(hetero):
    data = heterogeneous("time") if hetero else homogeneous(time=True)
    pair = stores(data)
    with pytest.raises(ValueError, match=r"edge attribute 'nope' given as weight_attr.*put_edge_table"):
        sampler(pair, [3], weight_attr="nope")
    with pytest.raises(ValueError, match=r"time attribute 'nope' .*neither a node-level nor an edge-level.*"
                                         r"put_tensor.*put_edge_table"):
        sampler(pair, [3], time_attr="nope")
    with pytest.raises(ValueError, match=r"edge attribute 'time' given as weight_attr"):  # node times, not weights
        sampler(pair, [3], weight_attr="time")
    with pytest.raises(ValueError, match=r"edge attribute 'nope'.*data\[edge_type\]\.nope = "):
        sampler(data, [3], weight_attr="nope")


def test_an_edge_attribute_left_out_by_from_data_says_so():
    data = homogeneous(edge_weight=True)
    pair = from_data(data, device="cpu", gpu_budget=None, progress=False, edge_attrs=())  # logs what it leaves out
    with pytest.raises(ValueError, match="edge_attrs="):
        sampler(pair, [3], weight_attr="edge_weight")
