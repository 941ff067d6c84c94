"""The PyG adapter's graph store (hmgstore.plugins.pyg.graph_store): CSCGraphStore.

Every check compares with what PyG builds from the plain ``Data``/``HeteroData``
(the same CSC, the same edge order); the framework-free conversion under it is
tested in test_graph.py. The ``data`` and ``hetero`` fixtures are in conftest.py.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch_geometric")

from torch_geometric.data import EdgeAttr  # noqa: E402
from torch_geometric.index import index2ptr  # noqa: E402
from torch_geometric.sampler.utils import to_csc as pyg_to_csc  # noqa: E402

from helpers import NUM_AUTHORS  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")


def test_csc_from_coo_is_what_pyg_builds_from_data(data):
    _, graph_store = hpyg.from_data(data, device="cpu")
    colptr, row, perm = pyg_to_csc(data, device="cpu")
    ours = graph_store.csc()
    assert torch.equal(ours[0], row) and torch.equal(ours[1], colptr) and torch.equal(ours[2], perm)
    (attr,) = graph_store.get_all_edge_attrs()
    assert attr.edge_type is None and attr.size == (data.num_nodes, data.num_nodes)
    attr.size = (1, 1)  # PyG may mutate what it gets: the store must not see it
    assert graph_store.get_all_edge_attrs()[0].size == (data.num_nodes, data.num_nodes)


def test_csc_and_csr_inputs(data):
    n, (src, dst) = data.num_nodes, data.edge_index
    reference = hpyg.to_csc(data.edge_index, "coo", (n, n))
    # CSC in: ids held as given (no copy), offsets copied (the sampler trusts them), no permutation
    store = hpyg.CSCGraphStore()
    store.put_edge_index((reference.row, reference.colptr), edge_type=None, layout="csc", size=(n, n))
    row, colptr, perm = store.csc()
    assert row.data_ptr() == reference.row.data_ptr() and torch.equal(colptr, reference.colptr)
    assert colptr.data_ptr() != reference.colptr.data_ptr() and perm is None
    # CSR in: same colptr; perm maps CSC edges back to CSR positions
    order = torch.sort(src, stable=True).indices
    rowptr, col = index2ptr(src[order], n), dst[order]
    store = hpyg.CSCGraphStore()
    store.put_edge_index((rowptr, col), edge_type=None, layout="csr", size=(n, n))
    row, colptr, perm = store.csc()
    assert torch.equal(colptr, reference.colptr)
    assert torch.equal(row, src[order][perm]) and torch.equal(index2ptr(col[perm], n), colptr)
    # COO sorted by destination: row kept as a view, no sort
    sorted_ei = data.edge_index[:, torch.sort(dst, stable=True).indices]
    csc = hpyg.to_csc(sorted_ei, "coo", (n, n), is_sorted=True)
    assert csc.perm is None and csc.row.data_ptr() == sorted_ei[0].data_ptr()
    # COO answers come back in the order the edges were put (CSR order here), so edge labels line up
    coo_row, coo_col = store.get_edge_index(EdgeAttr(None, "coo"))
    assert torch.equal(coo_row, src[order]) and torch.equal(coo_col, dst[order])
    store = hpyg.CSCGraphStore()
    store.put_edge_index(torch.tensor([[0, 1, 2], [2, 0, 1]]), edge_type=None, layout="coo", size=(3, 3))
    assert torch.equal(torch.stack(store.get_edge_index(EdgeAttr(None, "coo"))), torch.tensor([[0, 1, 2], [2, 0, 1]]))


def test_bad_edges_are_clear_errors(data):
    n = data.num_nodes
    with pytest.raises(IndexError, match="outside"):
        hpyg.to_csc(torch.tensor([[0, n], [1, 1]]), "coo", (n, n))
    with pytest.raises(TypeError, match="integer"):
        hpyg.to_csc(data.edge_index.float(), "coo", (n, n))
    with pytest.raises(ValueError, match=r"\[2, num_edges\]"):
        hpyg.to_csc(data.edge_index[:1], "coo", (n, n))
    with pytest.raises(ValueError, match="not sorted"):
        hpyg.to_csc(data.edge_index, "coo", (n, n), is_sorted=True)
    with pytest.raises(ValueError, match="colptr"):
        hpyg.to_csc((torch.tensor([0, 1]), torch.tensor([0, 3])), "csc", (2, 1))
    store = hpyg.CSCGraphStore()
    store.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(n, n))
    with pytest.raises(ValueError, match="not both"):
        store.put_edge_index(data.edge_index, edge_type=("a", "to", "a"), layout="coo", size=(n, n))
    assert store.remove_edge_index(edge_type=None, layout="csc") and store.get_all_edge_attrs() == []


def test_hetero_graph_store(hetero):
    _, graph_store = hpyg.from_data(hetero, device="cpu")
    rows, colptrs, perms = graph_store.csc()
    for edge_type in hetero.edge_types:
        colptr, row, perm = pyg_to_csc(hetero[edge_type], device="cpu")
        assert torch.equal(rows[edge_type], row) and torch.equal(colptrs[edge_type], colptr)
        assert torch.equal(perms[edge_type], perm)
    sizes = {a.edge_type: a.size for a in graph_store.get_all_edge_attrs()}
    assert sizes[("author", "writes", "paper")] == (NUM_AUTHORS, hetero["paper"].num_nodes)
    degree = graph_store.in_degree()
    assert torch.equal(degree["author"], torch.bincount(hetero["paper", "rev_writes", "author"].edge_index[1],
                                                        minlength=NUM_AUTHORS))


def _triples(layout: str, a, b, perm) -> list:
    """(source, destination, edge id) of every edge one layout lists."""
    from torch_geometric.index import ptr2index

    if layout == "csr":
        a = ptr2index(a)
    elif layout == "csc":
        b = ptr2index(b)
    ids = torch.arange(len(a)) if perm is None else perm
    return sorted(zip(a.tolist(), b.tolist(), ids.tolist()))


@settings(max_examples=max(1, settings.default.max_examples // 2), deadline=None)
@given(st.integers(1, 9), st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=30),
       st.sampled_from(["coo", "csr", "csc"]), st.booleans())
def test_every_layout_numbers_edges_as_they_were_put(num_nodes, edges, put_as, hetero):
    """``coo()``, ``csr()``, ``csc()`` and ``get_edge_index`` of every layout list each edge once with the id it was
    put with (its position in the COO given), as ``e_id`` and the edge tables number it: never a CSC position."""
    edges = [(u % num_nodes, v % num_nodes) for u, v in edges]
    ei = torch.tensor(edges, dtype=torch.int64).t().reshape(2, -1)
    want = sorted((u, v, e) for e, (u, v) in enumerate(edges))
    edge_type = ("a", "to", "a") if hetero else None
    store = hpyg.CSCGraphStore()
    if put_as == "coo":
        store.put_edge_index(ei, edge_type=edge_type, layout="coo", size=(num_nodes, num_nodes))
    else:  # sorted by the grouping end: the ids put are positions in that order
        key = ei[0] if put_as == "csr" else ei[1]
        order = torch.sort(key, stable=True).indices
        ei = ei[:, order]
        want = sorted((u, v, e) for e, (u, v) in enumerate(ei.t().tolist()))
        grouped = index2ptr(key[order], num_nodes)
        pair = (grouped, ei[1]) if put_as == "csr" else (ei[0], grouped)
        store.put_edge_index(pair, edge_type=edge_type, layout=put_as, size=(num_nodes, num_nodes))
    for layout in ("coo", "csr", "csc"):
        parts = getattr(store, layout)()
        if hetero:
            parts = tuple(p[edge_type] for p in parts)
        assert _triples(layout, *parts) == want, layout
        if layout != "csr":  # get_edge_index gives no perm: its CSR is checked against csr()'s
            got = store.get_edge_index(edge_type=edge_type, layout=layout)
            assert all(torch.equal(g, p) for g, p in zip(got, parts)), layout
        else:
            got = store.get_edge_index(edge_type=edge_type, layout="csr")
            assert torch.equal(got[0], parts[0]) and torch.equal(got[1], parts[1])


@pytest.mark.filterwarnings("ignore:Sparse")  # torch's notes on its sparse tensors
@pytest.mark.parametrize("layout", ["torch_sparse", "sparse_coo", "sparse_csr"])
def test_adj_t_of_every_sparse_kind_gives_the_graphs_edges(layout):
    """A Data's ``adj_t`` (the transposed adjacency) as a torch_sparse.SparseTensor or a torch sparse COO/CSR tensor:
    ``from_data``'s graph store holds the same edges as from ``edge_index``; the sampler over the Data itself,
    whose batches PyG's loaders cut with torch_sparse, refuses a torch one by name; a dense ``adj_t`` is refused."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    n, ei = 40, torch.randint(0, 40, (2, 200), generator=g)
    ei = torch.unique(ei, dim=1)  # sparse tensors merge repeated edges
    flipped = torch.stack([ei[1], ei[0]])
    if layout == "torch_sparse":
        torch_sparse = pytest.importorskip("torch_sparse")
        adj_t = torch_sparse.SparseTensor(row=flipped[0], col=flipped[1], sparse_sizes=(n, n))
    else:
        adj_t = torch.sparse_coo_tensor(flipped, torch.ones(ei.shape[1]), (n, n)).coalesce()
        adj_t = adj_t.to_sparse_csr() if layout == "sparse_csr" else adj_t
    data = Data(x=torch.randn(n, 2), adj_t=adj_t, num_nodes=n)
    _, store = hpyg.from_data(data, device="cpu", progress=False)
    row, col = store.get_edge_index(edge_type=None, layout="coo")
    assert sorted(zip(row.tolist(), col.tolist())) == sorted(zip(*ei.tolist()))
    if layout != "torch_sparse":
        with pytest.raises(TypeError, match="adj_t as a torch_sparse.SparseTensor only"):
            hpyg.HybridNeighborSampler(data, [2], device="cpu", progress=False)
    with pytest.raises(TypeError, match="adj_t is a Tensor"):
        hpyg.from_data(Data(x=torch.randn(n, 2), adj_t=torch.zeros(n, n), num_nodes=n), device="cpu", progress=False)
