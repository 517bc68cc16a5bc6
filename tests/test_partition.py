import numpy as np
import pytest

from fssl.partition import make_partition, save_partition, summary_table


@pytest.fixture(scope="module")
def labels():
    rng = np.random.default_rng(0)
    return rng.integers(0, 10, 6000)


def _part(y, mode="dirichlet", delta=0.3, seed=0, clients=20, labeled=1000, min_size=1):
    return make_partition(y, 10, labeled, clients, mode, delta, seed, min_size)


@pytest.mark.parametrize("mode,delta", [("iid", None), ("dirichlet", 0.3), ("dirichlet", 0.1)])
def test_sizes_balance_disjointness_and_own_labeled(labels, mode, delta):
    p = _part(labels, mode, delta)
    lab = np.concatenate(p.labeled)
    # balanced labeled split of exactly N_l, no index on two clients
    assert len(lab) == 1000 and len(np.unique(lab)) == 1000
    assert np.bincount(labels[lab], minlength=10).tolist() == [100] * 10
    own_unlabeled = [np.setdiff1d(u, l) for u, l in zip(p.unlabeled, p.labeled)]
    unl = np.concatenate(own_unlabeled)
    assert len(np.unique(unl)) == len(unl) == len(labels) - 1000
    assert not np.intersect1d(lab, unl).size
    for u, l in zip(p.unlabeled, p.labeled):
        assert np.isin(l, u).all()  # own labeled images are in U_m
        assert len(u) == len(l) + len(np.setdiff1d(u, l))
        assert len(l) >= 1 and len(u) >= 1


def test_iid_shares_are_equal(labels):
    p = _part(labels, "iid")
    sizes = [len(l) for l in p.labeled]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_is_skewed_and_smaller_delta_more_so(labels):
    def skew(part):
        hist = np.array(part.histograms(labels)["labeled"], dtype=float)
        frac = hist / hist.sum(1, keepdims=True)
        return frac.max(1).mean()

    iid, d3, d1 = _part(labels, "iid"), _part(labels, delta=0.3), _part(labels, delta=0.1)
    assert skew(iid) < 0.3 < skew(d3) < skew(d1)


def test_seeded_and_reproducible(labels):
    a, b, c = _part(labels, seed=1), _part(labels, seed=1), _part(labels, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.unlabeled, b.unlabeled))
    assert not all(np.array_equal(x, y) for x, y in zip(a.labeled, c.labeled))


def test_min_size_and_impossible_requests(labels):
    p = _part(labels, delta=0.1, min_size=5)
    assert min(len(l) for l in p.labeled) >= 5
    with pytest.raises(ValueError, match="cannot give"):
        _part(labels, clients=2000)
    with pytest.raises(ValueError, match="no labeled sample per class"):
        _part(labels, labeled=5)


def test_saved_and_summarised(labels, tmp_path):
    p = _part(labels)
    save_partition(p, labels, tmp_path)
    import json

    saved = json.loads((tmp_path / "partition.json").read_text())
    assert saved["labeled"][3] == p.labeled[3].tolist()
    summary = json.loads((tmp_path / "partition_summary.json").read_text())
    assert summary["num_labeled"] == [len(l) for l in p.labeled]
    assert summary["labeled"][0] == np.bincount(labels[p.labeled[0]], minlength=10).tolist()
    table = summary_table(p, labels)
    assert table.count("\n") == 2 + 20


@pytest.mark.parametrize("ratio", [10, 100])
def test_a_long_tailed_unlabeled_pool_keeps_the_labels_balanced(ratio):
    y = np.repeat(np.arange(10), 700)
    part = make_partition(y, 10, 100, 20, "iid", None, seed=1, imbalance_ratio=ratio)
    labeled = np.bincount(y[np.concatenate(part.labeled)], minlength=10)
    assert (labeled == 10).all()
    own = set(np.concatenate(part.labeled).tolist())
    pool = np.array([i for u in part.unlabeled for i in u if i not in own])
    counts = np.bincount(y[pool], minlength=10)
    assert counts[0] == 690 and counts[-1] == round(690 / ratio)  # head and tail
    assert (np.diff(counts) < 0).all()  # falling class by class
    assert len(np.unique(pool)) == len(pool)  # every image once


def _cfg(mode, delta, order, scenario="labels_at_clients"):
    return {
        "partition": {"mode": mode, "delta": delta, "min_size": 1, "pool_order": order},
        "scenario": {"name": scenario},
        "dataset": {"num_labeled": 1000},
        "fl": {"num_clients": 10},
        "seed": 0,
    }


def _pools(labels, mode, delta, order, scenario="labels_at_clients"):
    from fssl.partition import partition_from_cfg

    return partition_from_cfg(_cfg(mode, delta, order, scenario), labels, 10)


def test_class_order_groups_a_dirichlet_pool_by_class_and_keeps_its_images(labels):
    by_index = _pools(labels, "dirichlet", 0.1, "index")
    by_class = _pools(labels, "dirichlet", 0.1, "class")
    drawn = _part(labels, "dirichlet", 0.1, clients=10)
    for pool, drawn_pool in zip(by_index.unlabeled, drawn.unlabeled):
        assert np.array_equal(pool, drawn_pool)  # index: today's partition, unchanged
    mixes = []
    for lab, pool, grouped in zip(by_class.labeled, by_index.unlabeled, by_class.unlabeled):
        assert np.array_equal(np.sort(grouped), pool)  # the same images, reordered
        # own labeled images first, then the rest, each class by class in index order
        own, rest = grouped[: len(lab)], grouped[len(lab) :]
        assert np.array_equal(np.sort(own), lab)
        for part in (own, rest):
            assert np.all(np.diff(labels[part]) >= 0)
            for c in range(10):
                assert np.all(np.diff(part[labels[part] == c]) > 0)
        if len(pool) >= 500:
            mixes.append((len(set(labels[pool[:250]])), len(set(labels[rest[:250]]))))
    # the first batch of 250: every class present in index order, few grouped by class
    assert mixes and all(mixed > grouped for mixed, grouped in mixes)


def test_class_order_leaves_iid_and_server_label_pools_as_documented(labels):
    for p_idx, p_cls in zip(
        _pools(labels, "iid", None, "index").unlabeled,
        _pools(labels, "iid", None, "class").unlabeled,
    ):
        assert np.array_equal(p_idx, p_cls)  # the authors' iid order is random: index order kept
    # labels at the server: no own labeled image, the pool class by class
    for pool in _pools(labels, "dirichlet", 0.3, "class", "labels_at_server").unlabeled:
        assert np.all(np.diff(labels[pool]) >= 0)


@pytest.mark.parametrize(
    "preset", ["miniature_authors_exact", "miniature_authors_exact_800", "miniature"]
)
def test_the_exact_presets_take_the_authors_pool_order(preset):
    from server_app.config import compose

    order = compose([f"experiment={preset}"])["partition"]["pool_order"]
    assert order == ("index" if preset == "miniature" else "class")


def test_a_client_trains_on_its_pool_in_the_partitions_order():
    """The pseudo-label and APP-U pass chunks the client's tensors in their order: nothing between
    the partition and the client re-sorts them."""
    import torch

    from fssl.runtime import client_data_for, dataset_for, partition_for
    from server_app.config import compose

    cfg = compose(["experiment=miniature_authors_exact"])
    y, pool = dataset_for(cfg).y_train, partition_for(cfg).unlabeled[3]
    assert not np.array_equal(y[pool], y[np.sort(pool)])  # the preset's pool: class by class
    assert np.array_equal(client_data_for(cfg, 3, torch.device("cpu")).y_u.numpy(), y[pool])
