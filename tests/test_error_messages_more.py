"""Error messages of the sampler, the tables' numpy sources and uint64 ids: each names what went wrong, in the
caller's terms, and the fix."""
import numpy as np
import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.sampler import NodeSamplerInput  # noqa: E402

from hmgstore import HybridTensor  # noqa: E402
from hmgstore.graph.presample import presample  # noqa: E402
from hmgstore.plugins.pyg import CSCGraphStore, HybridNeighborSampler, from_data, from_tensors  # noqa: E402


def _graph(n=20, e=60):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, n, (2, e), generator=g)


def _sample(sampler, seeds, input_type=None):
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds, input_type=input_type))


def test_graph_store_without_size_says_pass_size():
    gs = CSCGraphStore()
    gs.put_edge_index(torch.tensor([[1, 2], [0, 0]]), edge_type=None, layout="coo")
    fs, _ = from_tensors(edge_index=torch.tensor([[0], [1]]), x=torch.randn(10, 2), progress=False)
    with pytest.raises(ValueError, match=r"3 source to 1 destination.*size=\(num_nodes, num_nodes\) to put_edge_index"):
        HybridNeighborSampler((fs, gs), [-1], progress=False)


def test_hetero_graph_store_sizes_disagree_says_pass_size():
    gs = CSCGraphStore()
    gs.put_edge_index(torch.tensor([[0, 1], [0, 1]]), edge_type=("a", "r", "b"), layout="coo", size=(5, 10))
    gs.put_edge_index(torch.tensor([[0, 1], [0, 1]]), edge_type=("b", "s", "a"), layout="coo", size=(3, 5))
    h = HeteroData()
    h["a"].x, h["b"].x = torch.randn(5, 1), torch.randn(10, 1)
    h["a", "r", "b"].edge_index = torch.tensor([[0], [0]])
    fs, _ = from_data(h, progress=False)
    with pytest.raises(ValueError, match=r"'b' nodes: .* gives 10 .* gives 3 .*size=\(num_src_nodes, num_dst_nodes\)"):
        HybridNeighborSampler((fs, gs), [1], progress=False)


def test_seeds_of_a_node_type_without_times_name_it():
    h = HeteroData()
    h["p"].x, h["a"].x, h["a"].time = torch.randn(20, 2), torch.randn(5, 2), torch.arange(5)
    h["p", "c", "p"].edge_index = _graph()
    h["a", "w", "p"].edge_index = torch.stack([torch.arange(5), torch.arange(5)])
    s = HybridNeighborSampler(h, [2], time_attr="time", progress=False)
    with pytest.raises(ValueError, match=r"node types \['p'\] have no node times.*\['a'\] only.*input_time"):
        _sample(s, torch.tensor([0, 1]), input_type="p")


def test_time_attr_of_neither_count_names_the_attribute():
    d = Data(x=torch.randn(20, 2), edge_index=_graph(), t=torch.arange(33), num_nodes=20)
    with pytest.raises(ValueError, match=r"time_attr 't' holds 33 values.*one per node \(20\).*one per edge \(60\)"):
        HybridNeighborSampler(d, [2], time_attr="t", progress=False)


def test_data_ids_past_num_nodes_say_set_num_nodes():
    d = Data(edge_index=torch.tensor([[0, 6], [1, 2]]), num_nodes=4)
    with pytest.raises(IndexError, match=r"node id 6, but data.num_nodes is 4: set data.num_nodes") as err:
        HybridNeighborSampler(d, [2], progress=False)
    assert "size=" not in str(err.value)


def test_adj_t_larger_than_num_nodes_says_so():
    torch_sparse = pytest.importorskip("torch_sparse")
    adj = torch_sparse.SparseTensor(row=torch.tensor([0, 20]), col=torch.tensor([1, 2]), sparse_sizes=(21, 21))
    with pytest.raises(ValueError, match=r"data.adj_t is 21 x 21, but data.num_nodes is 15"):
        HybridNeighborSampler(Data(adj_t=adj, num_nodes=15), [2], progress=False)


def test_presample_refuses_a_temporal_sampler():
    d = Data(x=torch.randn(20, 2), edge_index=_graph(), t=torch.arange(20), num_nodes=20)
    s = HybridNeighborSampler(d, [2], time_attr="t", progress=False)
    with pytest.raises(ValueError, match=r"presample takes no seed times.*without time_attr") as err:
        presample(s, torch.arange(20), progress=False)
    assert "seed_time" not in str(err.value)


def test_huge_fanout_with_replacement_is_refused():
    d = Data(x=torch.randn(20, 2), edge_index=_graph(), num_nodes=20)
    with pytest.raises(ValueError, match=r"num_neighbors\[0\] is 1000000000000: with replace=True.*at most"):
        HybridNeighborSampler(d, [10**12], replace=True, progress=False)


def test_dict_fanout_on_a_homogeneous_graph_says_pass_a_list():
    d = Data(x=torch.randn(20, 2), edge_index=_graph(), num_nodes=20)
    with pytest.raises(TypeError, match=r"dict fanout needs a heterogeneous graph; pass a list"):
        HybridNeighborSampler(d, {("a", "b", "c"): [2]}, progress=False)


def test_generator_fanout_is_read_once():
    d = Data(x=torch.randn(20, 2), edge_index=_graph(), num_nodes=20)
    s = HybridNeighborSampler(d, (k for k in [2, 2]), progress=False)
    assert len(_sample(s, torch.arange(3)).num_sampled_nodes) == 3


@pytest.mark.parametrize("array, words", [
    (np.arange(6, dtype=">f4").reshape(3, 2), r"byte order.*newbyteorder\('='\)"),
    (np.zeros((3, 2), np.longdouble), r"dtype.*astype\(np.float32\)"),
    (np.array([[1], [2]], dtype=object), r"dtype object.*astype\(np.float32\)"),
    (np.zeros((3, 2), "datetime64[s]"), r"datetime64.*astype\(np.int64\)"),
    (np.zeros(3, dtype=[("a", "f4"), ("b", "i4")]), r"structured records.*astype"),
    (np.array([["a"], ["b"]]), r"strings.*astype"),
])
def test_numpy_dtype_torch_lacks_is_refused_with_the_conversion(array, words):
    if array.dtype == np.longdouble and np.dtype(np.longdouble) == np.dtype(np.float64):
        pytest.skip("long double is float64 here")
    with pytest.raises((TypeError, ValueError), match=words):
        HybridTensor(array, "cpu")


def test_fortran_order_numpy_source_says_ascontiguousarray():
    with pytest.raises(ValueError, match=r"np.ascontiguousarray\(x\)") as err:
        HybridTensor(np.asfortranarray(np.zeros((4, 3), np.float32)), "cpu")
    assert "source.contiguous()" not in str(err.value)


@pytest.mark.parametrize("ids", [np.array([1, 2**64 - 1], dtype=np.uint64), np.array([[0], [2**63]], dtype=np.uint64)])
def test_uint64_id_is_reported_as_given(ids):
    t = HybridTensor(torch.randn(10, 2), "cpu")
    bad = int(ids.reshape(-1)[1])
    with pytest.raises(IndexError, match=rf"uint64 index {bad} at position 1 is out of range"):
        t[ids]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_ids_out_of_range_name_the_id(dtype):
    # torch compares no uint16/32/64 tensors: the range error must still name the id, not torch's missing kernel
    x = torch.randn(300, 4)
    table = HybridTensor(x)
    with pytest.raises(IndexError, match=r"index 301 at position 1 is out of range for a table of 300 rows"):
        table[torch.tensor([3, 301], dtype=dtype)]
    assert torch.equal(table[torch.tensor([3, 299], dtype=dtype)], x[[3, 299]])
