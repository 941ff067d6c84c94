"""hmgstore.graph.csc: framework-free CSC conversion (what samplers and the adapters' graph stores read).

No framework here: the PyG graph store, which converts with PyG's own edge
order and is compared with what PyG builds, is tested in
test_pyg_graph_store.py; the sampler over this CSC in test_graph_sampler.py.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hmgstore.graph import CSC, LAYOUTS, index2ptr, ptr2index, stable_sort, to_csc

# 4 sources, 3 destinations; edge k is (EDGES[0][k], EDGES[1][k])
EDGES = torch.tensor([[0, 1, 2, 2, 3], [2, 0, 1, 0, 2]])


def test_coo_to_csc_groups_edges_by_destination_in_input_order():
    csc = to_csc(EDGES, "coo", (4, 3))
    assert isinstance(csc, CSC) and csc.size == (4, 3) and csc.num_edges == 5
    assert csc.row.tolist() == [1, 2, 2, 0, 3]  # destination 0: edges 1, 3; 1: edge 2; 2: edges 0, 4
    assert csc.colptr.tolist() == [0, 2, 3, 5]
    assert csc.perm.tolist() == [1, 3, 2, 0, 4]
    assert csc.row.dtype == csc.colptr.dtype == csc.perm.dtype == torch.int64
    assert csc.in_degree().tolist() == [2, 1, 2] and csc.col().tolist() == [0, 0, 1, 2, 2]
    row, col = csc.coo_in_given_order()
    assert torch.equal(row, EDGES[0]) and torch.equal(col, EDGES[1])


def test_coo_inputs_of_every_kind_agree():
    reference = to_csc(EDGES, "coo", (4, 3))
    for given in (EDGES.numpy(), (EDGES[0], EDGES[1]), [EDGES[0].tolist(), EDGES[1].tolist()], EDGES.int(),
                  (EDGES[0].numpy().astype(np.int32), EDGES[1])):
        csc = to_csc(given, "coo", (4, 3))
        assert torch.equal(csc.row, reference.row) and torch.equal(csc.colptr, reference.colptr)
        assert torch.equal(csc.perm, reference.perm) and csc.row.dtype == torch.int64
    assert to_csc(EDGES, "coo").size == (4, 3)  # inferred from the largest ids
    assert to_csc(EDGES, "COO", (10, 5)).size == (10, 5)  # isolated nodes past the largest id
    assert to_csc(EDGES, "coo", (10, 5)).colptr.tolist() == [0, 2, 3, 5, 5, 5]


def test_csc_input_is_kept_as_given():
    row, colptr = torch.tensor([1, 2, 2, 0, 3]), torch.tensor([0, 2, 3, 5])
    csc = to_csc((row, colptr), "csc", (4, 3))
    assert csc.row.data_ptr() == row.data_ptr()  # the ids: no copy
    assert torch.equal(csc.colptr, colptr) and csc.colptr.data_ptr() != colptr.data_ptr()  # offsets: its own
    assert csc.perm is None and csc.size == (4, 3)
    assert to_csc((row, colptr), "csc").size == (4, 3)  # sources inferred, destinations from colptr
    converted = to_csc((row.int(), colptr.int()), "csc")
    assert converted.row.dtype == torch.int64 and torch.equal(converted.row, row)
    given_row, given_col = csc.coo_in_given_order()
    assert given_row.tolist() == [1, 2, 2, 0, 3] and given_col.tolist() == [0, 0, 1, 2, 2]


def test_csr_input_maps_csc_edges_back_to_csr_positions(small_graph):
    n, (src, dst) = small_graph.num_nodes, small_graph.edge_index
    reference = to_csc(small_graph.edge_index, "coo", (n, n))
    order = torch.sort(src, stable=True).indices
    rowptr, col = index2ptr(src[order], n), dst[order]
    csc = to_csc((rowptr, col), "csr", (n, n))
    assert torch.equal(csc.colptr, reference.colptr) and csc.size == (n, n)
    assert torch.equal(csc.row, src[order][csc.perm]) and torch.equal(index2ptr(col[csc.perm], n), csc.colptr)
    row, coo_col = csc.coo_in_given_order()  # in CSR order, so edge labels given in that order line up
    assert torch.equal(row, src[order]) and torch.equal(coo_col, dst[order])


def test_sorted_coo_is_kept_as_a_view(small_graph):
    n, dst = small_graph.num_nodes, small_graph.edge_index[1]
    sorted_ei = small_graph.edge_index[:, torch.sort(dst, stable=True).indices]
    csc = to_csc(sorted_ei, "coo", (n, n), is_sorted=True)
    assert csc.perm is None and csc.row.data_ptr() == sorted_ei[0].data_ptr()
    assert torch.equal(csc.colptr, to_csc(small_graph.edge_index, "coo", (n, n)).colptr)


def test_every_layout_gives_the_same_graph(small_graph):
    n, (src, dst) = small_graph.num_nodes, small_graph.edge_index
    coo = to_csc(small_graph.edge_index, "coo", (n, n))
    csc = to_csc((coo.row, coo.colptr), "csc", (n, n))
    order = torch.sort(src, stable=True).indices
    csr = to_csc((index2ptr(src[order], n), dst[order]), "csr", (n, n))
    edges = set(zip(src.tolist(), dst.tolist()))
    for made in (coo, csc, csr):
        assert made.num_edges == src.numel() and torch.equal(made.in_degree(), torch.bincount(dst, minlength=n))
        assert set(zip(made.row.tolist(), made.col().tolist())) == edges
    row, col = coo.coo_in_given_order()
    assert torch.equal(row, src) and torch.equal(col, dst)


def test_index2ptr_and_ptr2index_are_inverse():
    ids = torch.tensor([0, 0, 2, 2, 2, 5])
    ptr = index2ptr(ids, 7)
    assert ptr.tolist() == [0, 2, 2, 5, 5, 5, 6, 6] and ptr.dtype == torch.int64
    assert torch.equal(ptr2index(ptr), ids) and torch.equal(ptr2index(ptr, 6), ids)
    assert ptr2index(torch.tensor([0])).numel() == 0


def test_stable_sort_keeps_input_order_within_a_destination():
    col = torch.tensor([2, 0, 1, 0, 2, 0])
    sorted_col, perm = stable_sort(col, 3)
    assert sorted_col.tolist() == [0, 0, 0, 1, 2, 2] and perm.tolist() == [1, 3, 5, 2, 0, 4]
    col = torch.randint(0, 10, (5_000,), generator=torch.Generator().manual_seed(0))  # many ties
    sorted_col, perm = stable_sort(col, 10)
    assert torch.equal(col[perm], sorted_col) and torch.equal(sorted_col, col.sort().values)
    same_dst = sorted_col[1:] == sorted_col[:-1]
    assert bool((perm[1:][same_dst] > perm[:-1][same_dst]).all())  # ties in input order
    # to_csc sorts with it by default: each destination's sources come in the order the edges were given
    src = torch.arange(col.numel())
    csc = to_csc((src, col), "coo", (col.numel(), 10))
    for v in range(10):
        given = src[col == v]
        assert torch.equal(csc.row[csc.colptr[v]:csc.colptr[v + 1]], given)


def test_the_sort_can_be_the_callers():
    calls = []

    def backwards(col, num_dst):  # ties in reverse input order
        calls.append(num_dst)
        perm = torch.argsort(col * col.numel() - torch.arange(col.numel()))
        return col[perm], perm

    csc = to_csc(EDGES, "coo", (4, 3), sort=backwards)
    assert calls == [3]
    assert csc.row.tolist() == [2, 1, 2, 3, 0] and csc.perm.tolist() == [3, 1, 2, 4, 0]
    assert csc.colptr.tolist() == [0, 2, 3, 5]
    row, col = csc.coo_in_given_order()
    assert torch.equal(row, EDGES[0]) and torch.equal(col, EDGES[1])


def test_malformed_edges_are_clear_errors():
    with pytest.raises(IndexError, match="outside"):
        to_csc(torch.tensor([[0, 4], [1, 1]]), "coo", (4, 3))
    with pytest.raises(IndexError, match=r"edge_index\[1\] holds a node id outside \[0, 3\)"):
        to_csc(torch.tensor([[0, 1], [1, 3]]), "coo", (4, 3))
    with pytest.raises(IndexError, match="outside"):
        to_csc(torch.tensor([[0, -1], [1, 1]]), "coo")
    with pytest.raises(TypeError, match="integer"):
        to_csc(EDGES.float(), "coo", (4, 3))
    with pytest.raises(ValueError, match=r"\[2, num_edges\]"):
        to_csc(EDGES[:1], "coo", (4, 3))
    with pytest.raises(ValueError, match="differ in length"):
        to_csc((EDGES[0], EDGES[1][:3]), "coo", (4, 3))
    with pytest.raises(ValueError, match="1-D"):
        to_csc((EDGES, EDGES), "coo", (4, 3))
    with pytest.raises(ValueError, match="not sorted"):
        to_csc(EDGES, "coo", (4, 3), is_sorted=True)
    with pytest.raises(ValueError, match="colptr"):
        to_csc((torch.tensor([0, 1]), torch.tensor([0, 3])), "csc", (2, 1))
    with pytest.raises(ValueError, match="colptr has 4 entries for 2 destination nodes"):
        to_csc((torch.tensor([1, 2, 2, 0, 3]), torch.tensor([0, 2, 3, 5])), "csc", (4, 2))
    with pytest.raises(ValueError, match="rowptr"):
        to_csc((torch.tensor([0, 2, 1]), torch.tensor([0, 1])), "csr", (2, 2))
    with pytest.raises(ValueError, match="rowptr has 3 entries for 4 source nodes"):
        to_csc((torch.tensor([0, 1, 2]), torch.tensor([0, 1])), "csr", (4, 2))
    with pytest.raises(TypeError, match="pair of 1-D tensors"):
        to_csc(torch.tensor([0, 1, 2]), "csr")
    with pytest.raises(ValueError, match="layout must be one of"):
        to_csc(EDGES, "dense")
    assert LAYOUTS == ("coo", "csr", "csc")


def test_conversion_needs_no_framework():
    """hmgstore.graph converts every layout in a fresh process that never imports PyG or DGL."""
    script = textwrap.dedent("""
        import sys
        import torch
        from hmgstore.graph import to_csc

        ei = torch.tensor([[0, 1, 2, 2, 3], [2, 0, 1, 0, 2]])
        coo = to_csc(ei, "coo", (4, 3))
        assert coo.row.tolist() == [1, 2, 2, 0, 3] and coo.colptr.tolist() == [0, 2, 3, 5], coo
        csr = to_csc((torch.tensor([0, 1, 2, 4, 5]), ei[1]), "csr", (4, 3))
        assert csr.colptr.tolist() == [0, 2, 3, 5] and csr.row.tolist() == [1, 2, 2, 0, 3], csr
        csc = to_csc((coo.row, coo.colptr), "csc", (4, 3))
        assert csc.row is coo.row and csc.perm is None
        loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch_geometric", "dgl"))
        assert not loaded, loaded
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
