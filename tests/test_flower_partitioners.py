"""Flower Datasets' partitioners as a partition choice (partition.mode: flwr), composed with the
paper's labeled split, on the embedded MNIST-10k."""

import json

import numpy as np
import pytest

from fssl.checks import ConfigError
from fssl.data import embedded_candidates
from fssl.partition import FLOWER_PARTITIONERS, balanced_labeled_split, flower_partition
from server_app.config import resolve

PARAMS = {
    "DirichletPartitioner": {"alpha": 0.5, "min_partition_size": 50},
    "InnerDirichletPartitioner": {"alpha": 0.5},
    "PathologicalPartitioner": {"num_classes_per_partition": 2},
    "ShardPartitioner": {"num_shards_per_partition": 2},
}


@pytest.fixture(scope="module")
def labels():
    return np.load(next(p for p in embedded_candidates() if p.is_file()))["y_train"].astype(
        np.int64
    )


@pytest.mark.parametrize("name", [n for n in FLOWER_PARTITIONERS if n != "ExponentialPartitioner"])
def test_each_partitioner_composes_with_the_labeled_split(labels, name):
    part = flower_partition(labels, 10, 1000, 10, name, PARAMS.get(name, {}), seed=3)
    everyone = np.concatenate(part.unlabeled)
    assert len(everyone) == len(np.unique(everyone))  # no image on two clients
    pool, _ = balanced_labeled_split(labels, 1000, 10, np.random.default_rng([3, 2024]))
    for lab, own in zip(part.labeled, part.unlabeled):
        assert len(lab) > 0 and set(lab) <= set(own) and set(lab) <= set(pool)
    # every image is used, each labeled image once; a random class assignment may leave a
    # class to no client (Flower Datasets' PathologicalPartitioner does)
    used = set(everyone) if name == "PathologicalPartitioner" else set(range(len(labels)))
    assert set(everyone) == used
    assert sorted(np.concatenate(part.labeled)) == sorted(set(pool) & used)
    again = flower_partition(labels, 10, 1000, 10, name, PARAMS.get(name, {}), seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(part.unlabeled, again.unlabeled))
    if name == "PathologicalPartitioner":
        assert all(len(np.unique(labels[own])) == 2 for own in part.unlabeled)


def test_exponential_sizes_fall_by_half_from_client_to_client(labels):
    part = flower_partition(labels, 10, 1000, 4, "ExponentialPartitioner", {}, seed=0)
    sizes = [len(u) for u in part.unlabeled]
    assert sizes == sorted(sizes) and sizes[-1] > 4 * sizes[0]


@pytest.mark.parametrize(
    "overrides,match",
    [
        ("partition.partitioner=NaturalIdPartitioner", "`partition.partitioner`: 'NaturalIdPart"),
        ("+partition.params.num_classes=2", r"partition.params \['num_classes'\] are not"),
        ("partition.params.num_classes_per_partition=-1", "PathologicalPartitioner"),
    ],
)
def test_a_bad_partitioner_or_parameter_is_refused_before_training(overrides, match):
    with pytest.raises(ConfigError, match=match):
        resolve({"partition": "pathological2", "overrides": overrides})


@pytest.mark.parametrize("name", FLOWER_PARTITIONERS)
def test_a_run_with_each_partitioner_completes(tmp_path, name):
    """The whole app on each partitioner's split, its clients on the null trainer (local_epochs=0:
    the partition, the clients' data, the replies, DMA and the evaluation, no training)."""
    from localgrid import run_in_process

    out = tmp_path / "run"
    params = " ".join(f"+partition.params.{k}={v}" for k, v in PARAMS.get(name, {}).items())
    run_in_process(
        {
            "num-server-rounds": 1,
            "output-dir": str(out),
            "overrides": f"partition.mode=flwr +partition.partitioner={name} {params} "
            "fl.num_clients=4 fl.fraction_train=0.5 train.local_epochs=0 dataset.num_labeled=200 "
            "dataset.val_size=0 logging.tensorboard=false",
        },
        4,
    )
    record = json.loads((out / "metrics.jsonl").read_text())
    assert record["round"] == 1 and len(record["clients"]) == 2
    assert 0 <= record["test_accuracy"] <= 1
    hist = json.loads((out / "partition_summary.json").read_text())
    saved = json.loads((out / "partition.json").read_text())
    sizes = [len(u) for u in saved["unlabeled"]]
    assert [sum(h) for h in hist["unlabeled"]] == sizes
    assert all(c["num_unlabeled"] == sizes[c["partition_id"]] for c in record["clients"])
    assert (out / "label_distribution.png").stat().st_size > 0
