"""Contracts of the readers and adapters: OGB files that disagree, partition ids, PyG and DGL entry points.

Each case is a file or a call a user could make by mistake, and the
property is the documented error, naming the file or the function the user
called, or exact results.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
import hmgstore.data as datasets
from helpers import FAKE_PRODUCTS_NODES, write_fake_products
from hmgstore.distributed import PartitionBook, load_partition, partition
from hmgstore.distributed import parts as parts_module
from hmgstore.rows.file_identity import FileChangedError

NODES = 300


# ---- the OGB reader: lengths and ranges -----------------------------------------------------------------
def write_csv(path, array) -> None:
    import pandas as pd

    pd.DataFrame(np.asarray(array)).to_csv(path, header=False, index=False, compression="gzip")


def corruptions():
    n = FAKE_PRODUCTS_NODES
    return {
        "split id out of range": ("split/sales_ranking/train.csv.gz", np.array([[0], [n + 5]]), r"train split.*"),
        "negative split id": ("split/sales_ranking/valid.csv.gz", np.array([[-1], [2]]), r"valid split.*-1"),
        "float split id": ("split/sales_ranking/test.csv.gz", np.array([[1.5], [2.0]]), r"test split.*integers"),
        "more labels than nodes": ("raw/node-label.csv.gz", np.zeros((2 * n, 1), dtype=np.int64), r"labels.*"),
        "fewer labels than nodes": ("raw/node-label.csv.gz", np.zeros((n - 3, 1), dtype=np.int64), r"labels.*"),
        # every edge the count names, one of them to a node past the last
        "edges beyond the node count": ("raw/edge.csv.gz", lambda written: np.concatenate(
            [written["edges"][:-1], [[2, n + 40]]]), r"edges.*out of range"),
        "node count disagreeing": ("raw/num-node-list.csv.gz", np.array([[n + 7]]), r"node features|labels"),
    }


@pytest.mark.parametrize("case", sorted(corruptions()))
def test_the_ogb_reader_refuses_files_that_disagree(tmp_path, case):
    pytest.importorskip("ogb")
    from hmgstore.data import ogb

    written = write_fake_products(tmp_path)
    name, content, message = corruptions()[case]
    write_csv(tmp_path / "ogbn_products" / name, content(written) if callable(content) else content)
    with pytest.raises(ValueError, match=message) as err:
        ogb.load_node_dataset(tmp_path, "ogbn-products", progress=False)
    assert "ogbn_products" in str(err.value)


def test_the_ogb_reader_refuses_a_feature_file_short_of_rows(tmp_path):
    pytest.importorskip("ogb")
    from hmgstore.data import ogb

    written = write_fake_products(tmp_path)
    write_csv(tmp_path / "ogbn_products" / "raw" / "node-feat.csv.gz", written["feats"][:-4])
    with pytest.raises(ValueError, match=r"ogbn_products: raw/node-feat\.csv\.gz \(the node features\) holds 56 rows"):
        ogb.load_node_dataset(tmp_path, "ogbn-products", progress=False)


# ---- partitions: split ids and the files read back ------------------------------------------------------
@given(st.lists(st.one_of(st.integers(-3, NODES + 3), st.floats(0, 10)), max_size=6))
def test_partition_checks_split_ids_before_writing(tmp_path_factory, ids):
    out = tmp_path_factory.mktemp("p") / "parts"
    g = datasets.synthetic(NODES, 4, 4, seed=3)
    ok = all(isinstance(i, int) and 0 <= i < NODES for i in ids)
    args = ({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 2), out)
    if ok:
        partition(*args, split={"train": ids}, progress=False)
        assert np.load(out / "split" / "train.npy").tolist() == ids
    else:
        with pytest.raises((TypeError, IndexError), match="split 'train'"):
            partition(*args, split={"train": ids}, progress=False)
        assert not out.exists()


def test_a_part_file_replaced_while_it_is_read_is_refused(tmp_path, monkeypatch):
    g = datasets.synthetic(NODES, 4, 4, seed=3)
    partition({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 2), tmp_path / "p", progress=False)
    row = tmp_path / "p" / "part0" / "row.npy"
    real_read = parts_module.read

    def replaced_first(path, **kwargs):  # another writer swaps row.npy after its header was checked
        if path == row:
            np.save(tmp_path / "new.npy", np.load(row)[::-1].copy())  # valid ids, another graph's order
            (tmp_path / "new.npy").replace(row)
        return real_read(path, **kwargs)

    monkeypatch.setattr(parts_module, "read", replaced_first)
    with pytest.raises(FileChangedError,
                       match=r"row\.npy was replaced by another file \(another inode\) since load_partition checked"):
        load_partition(tmp_path / "p", 0, "cpu", progress=False)
    monkeypatch.setattr(parts_module, "read", real_read)
    values = np.load(row)
    values[3] = 10**6
    np.save(row, values)
    with pytest.raises(ValueError, match=r"row\.npy is not the file partition\(\) wrote.*--overwrite"):
        load_partition(tmp_path / "p", 0, "cpu", progress=False)
    meta_path = tmp_path / "p" / "part0" / "meta.json"  # a part without records: the sources are still checked
    (tmp_path / "p" / "partition.json").unlink()  # (written before runs and seals)
    meta_path.write_text(json.dumps({k: v for k, v in json.loads(meta_path.read_text()).items()
                                     if k not in ("files", "run", "seal")}))
    with pytest.warns(UserWarning, match="records no size and checksum"), \
            pytest.raises(ValueError, match=rf"row\.npy.*1000000 at position 3.*{NODES} nodes"):
        load_partition(tmp_path / "p", 0, "cpu", progress=False)


def test_a_part_naming_a_neighbour_beyond_the_graph_is_refused_before_sampling():
    from hmgstore.distributed import part_of
    from hmgstore.distributed.sampling import DistributedNeighborSampler

    g = datasets.synthetic(NODES, 4, 4, seed=3)
    part = part_of({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 2), 1, "cpu", progress=False)
    part.row[3] = 10**6  # the row of a part changed after it was read, or a Partition made by hand
    with pytest.raises(ValueError, match=rf"part 1's row names a neighbour outside the book.*1000000.*{NODES} nodes"):
        DistributedNeighborSampler(part, [5])
    part.row[3] = 0
    part.colptr = part.colptr[:-1]
    with pytest.raises(ValueError, match="part 1's colptr has 150 offsets"):
        DistributedNeighborSampler(part, [5])


# ---- PyG: the newcomer's surprises ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def pyg_data():
    from torch_geometric.data import Data

    g = datasets.synthetic(200, 4, 8, seed=1)
    return Data(x=g.x, y=g.y, edge_index=g.edge_index, edge_attr=torch.randn(g.edge_index.shape[1], 3))


def test_from_data_names_itself_for_a_misspelt_keyword(pyg_data):
    from hmgstore.plugins.pyg import from_data

    with pytest.raises(TypeError, match=r"^from_data\(\) got an unexpected keyword argument 'gpu_bugdet'; did "
                                        r"you mean 'gpu_budget'\?"):
        from_data(pyg_data, "cpu", gpu_bugdet="1GB")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU says")
def test_cuda_without_a_gpu_gives_one_clear_message_everywhere(pyg_data):
    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    stores = from_data(pyg_data, "cpu")
    for call in (lambda: from_data(pyg_data, "cuda"), lambda: HybridNeighborSampler(stores, [5], device="cuda"),
                 lambda: hmgstore.Pipeline([1], device="cuda"), lambda: hmgstore.HybridTensor(pyg_data.x, "cuda:0")):
        with pytest.raises(RuntimeError, match=r"torch sees no CUDA GPU.*device='cpu'"):
            call()


@given(st.integers(0, 250), st.booleans(), st.booleans())
def test_from_data_checks_hotness_on_every_device(pyg_data, length, nan, budget):
    from hmgstore.plugins.pyg import from_data

    score = torch.rand(length)
    if nan and length:
        score[0] = float("nan")
    kwargs = {"gpu_budget": 4096 if budget else None, "hotness": score}
    if length == pyg_data.num_nodes and not (nan and length):
        from_data(pyg_data, "cpu", **kwargs)[0].close()
    else:
        with pytest.raises(ValueError, match="hotness"):
            from_data(pyg_data, "cpu", **kwargs)


def test_edge_attributes_reach_the_batch_without_loader_arguments(pyg_data):
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, edge_features, from_data

    stores = from_data(pyg_data, "cpu")
    sampler = HybridNeighborSampler(stores, [4, 4], device="cpu")
    seen = []
    for extra in ({}, edge_features(stores), {"transform": lambda b: seen.append(1) or b}):
        loader = NeighborLoader(stores, [4, 4], input_nodes=torch.arange(30), batch_size=10,
                                neighbor_sampler=sampler, **extra)
        for batch in loader:
            assert torch.equal(batch.edge_attr, pyg_data.edge_attr[batch.e_id])
    assert seen == [1, 1, 1]  # the caller's own transform still runs, once a batch


# ---- DGL: the graph changed after attach ----------------------------------------------------------------
def test_a_graph_changed_after_attach_raises_at_the_next_fetch():
    hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    import dgl

    g = datasets.synthetic(100, 4, 8, seed=2)
    graph = dgl.graph((g.edge_index[0], g.edge_index[1]), num_nodes=100)
    hdgl.attach(graph, {"feat": hmgstore.HybridTensor(g.x, "cpu")},
                edata={"w": hmgstore.HybridTensor(torch.randn(graph.num_edges(), 2), "cpu")})
    assert graph.get_node_storage("feat").fetch(torch.arange(3), "cpu").wait().shape == (3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph.remove_nodes(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"98 nodes now.*node feature 'feat'.*100 rows.*attach"):
        graph.get_node_storage("feat")
    with pytest.raises(ValueError, match=r"edges now.*edge feature 'w'.*attach"):
        graph.get_edge_storage("w")
    hdgl.attach(graph, {"feat": hmgstore.HybridTensor(g.x[2:], "cpu")})  # attached again: served again
    assert torch.equal(graph.get_node_storage("feat").fetch(torch.arange(2), "cpu").wait(), g.x[2:4])


@given(st.one_of(st.integers(-2, 3), st.floats(0, 3), st.booleans()))
def test_cluster_loaders_check_batch_sizes_before_the_collective(batch_size):
    from hmgstore.plugins.pyg.cluster import EqualBatches, cluster_loader

    if type(batch_size) is int and batch_size >= 1:
        assert len(list(EqualBatches(5, batch_size, 5))) == 5  # enough batches for 5 positions at any size
        return
    for call in (lambda: EqualBatches(5, batch_size, 2), lambda: cluster_loader(None, None, [0, 1], batch_size)):
        with pytest.raises((ValueError, TypeError), match="batch_size"):
            call()
    with pytest.raises(TypeError, match="input_nodes.*integers"):
        cluster_loader(None, None, torch.tensor([0.5]), 2)


def test_from_tensors_names_itself_for_a_misspelt_keyword():
    from hmgstore.plugins.pyg import from_tensors

    g = datasets.synthetic(50, 4, 8, seed=1)
    with pytest.raises(TypeError, match=r"^from_tensors\(\).*'gpu_bugdet'; did you mean 'gpu_budget'"):
        from_tensors(edge_index=g.edge_index, x=g.x, device="cpu", gpu_bugdet="1GB")
    with pytest.raises(ValueError, match="feature 'label_count' is"):  # a graph-level value, not a misspelling
        from_tensors(edge_index=g.edge_index, x=g.x, device="cpu", label_count=4)
