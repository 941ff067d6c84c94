"""Parts know the partition() run that wrote them: parts of two runs over the same nodes (equal books, equal
file sizes) are never mixed, a hand-edited meta.json is refused, and a ClusterTensor refuses another machine's
part."""
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from hmgstore.distributed import PartitionBook, load_partition, partition
from hmgstore.distributed.cluster import _check_agreement

NODES = 400


def write(out, shift: float = 0.0):
    g = torch.Generator().manual_seed(5)
    x = torch.rand(NODES, 8, generator=g) + 1 + shift  # two runs: same sizes, different rows
    edges = torch.randint(0, NODES, (2, 3 * NODES), generator=g)
    partition({"x": x}, edges, PartitionBook.range(NODES, 2), out, progress=False)
    return x


def test_a_part_of_another_run_is_refused(tmp_path):
    write(tmp_path / "a")
    write(tmp_path / "b", shift=1.0)
    shutil.rmtree(tmp_path / "a" / "part1")
    shutil.copytree(tmp_path / "b" / "part1", tmp_path / "a" / "part1")
    load_partition(tmp_path / "a", 0, "cpu", progress=False).close()  # part 0 is still the folder's own
    with pytest.raises(ValueError, match=r"part1.*another partition\(\) run than .*partition\.json.*--overwrite"):
        load_partition(tmp_path / "a", 1, "cpu", progress=False)


def test_a_part_copied_over_another_with_its_meta_edited_is_refused(tmp_path):
    write(tmp_path / "p")
    shutil.rmtree(tmp_path / "p" / "part0")
    shutil.copytree(tmp_path / "p" / "part1", tmp_path / "p" / "part0")
    meta_path = tmp_path / "p" / "part0" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "machine": 0}))
    with pytest.raises(ValueError, match=r"part0/meta\.json was edited since partition\(\) wrote it.*--overwrite"):
        load_partition(tmp_path / "p", 0, "cpu", progress=False)


@pytest.mark.parametrize("text", ["{", "[]", '{"runs": 1}', '{"run": 5}'])
def test_a_damaged_run_file_is_refused(tmp_path, text):
    write(tmp_path / "p")
    (tmp_path / "p" / "partition.json").write_text(text)
    with pytest.raises(ValueError, match=r"partition\.json is not the JSON partition\(\) writes"):
        load_partition(tmp_path / "p", 0, "cpu", progress=False)


def test_loaded_books_carry_their_run_and_still_equal_the_same_assignment(tmp_path):
    x = write(tmp_path / "p")
    parts = [load_partition(tmp_path / "p", m, "cpu", progress=False) for m in range(2)]
    run = json.loads((tmp_path / "p" / "partition.json").read_text())["run"]
    assert [p.book.run for p in parts] == [run, run] and PartitionBook.range(NODES, 2).run is None
    assert parts[0].book == PartitionBook.range(NODES, 2)  # equality is the assignment's; the run is checked apart
    for m, part in enumerate(parts):
        assert part.features["x"]._partition_machine == m
        assert torch.equal(part.features["x"][torch.arange(len(part.nodes))], x[part.nodes])
        part.close()


def agreement(everyone, machines=((0,), (1,))):
    cluster = SimpleNamespace(machines=[list(r) for r in machines], num_machines=len(machines))
    _check_agreement(everyone, cluster, PartitionBook.range(NODES, 2))


def rank(run="r1", part=None, rows=200):
    return {"book": PartitionBook.range(NODES, 2).signature(), "run": run, "dtype": "torch.float32",
            "row shape": (8,), "device type": "cpu", "serial": 0, "rows": rows, "part": part}


def test_cluster_tensors_refuse_parts_of_two_runs_and_another_machines_part():
    agreement([rank(part=0), rank(part=1)])
    agreement([rank(run=None), rank(run=None)])  # books built in memory on every rank
    with pytest.raises(ValueError, match=r"rank 1 has a different run than rank 0: r2 vs r1"):
        agreement([rank(), rank(run="r2")])
    with pytest.raises(ValueError, match=r"rank 0 runs on machine 0 but its table holds part 1.*load_partition"):
        agreement([rank(part=1), rank(part=0)])  # equal part sizes: the row counts alone would agree


def test_a_part_copied_alone_is_still_held_to_its_seal(tmp_path):
    # each machine may hold only its own part folder, without partition.json: its meta.json stays sealed
    write(tmp_path / "p")
    (tmp_path / "p" / "partition.json").unlink()
    load_partition(tmp_path / "p", 1, "cpu", progress=False).close()
    meta_path = tmp_path / "p" / "part1" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "run": "0" * 32}))
    with pytest.raises(ValueError, match=r"part1/meta\.json was edited since partition\(\) wrote it"):
        load_partition(tmp_path / "p", 1, "cpu", progress=False)


def test_a_table_hands_out_a_copy_of_its_layout(tmp_path):
    from hmgstore import HybridTensor

    x, perm = torch.rand(50, 3) + 0.5, torch.randperm(50)
    table = HybridTensor(x, "cpu", layout=perm, progress=False)
    table.layout[:] = table.layout.flip(0)
    assert torch.equal(table[torch.arange(50)], x) and torch.equal(table.layout, perm)
