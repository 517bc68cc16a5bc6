"""The label-distribution figure: written with each run's partition, shown by `feddb report`."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sweep_and_report import fake_run

from feddb import report
from fssl.partition import (
    LABEL_FIGURE_DPI,
    Partition,
    label_counts,
    label_figure_size,
    make_partition,
    partition_name,
    save_partition,
)

PROJECT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# 12 images of 3 classes; two clients, each one's unlabeled set holding its own labeled images
LABELS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 0, 1, 2])


def hand_partition() -> Partition:
    return Partition(
        labeled=[np.array([0, 3]), np.array([5, 6, 9])],
        unlabeled=[np.array([0, 1, 2, 3, 4]), np.array([5, 6, 7, 8, 9, 10, 11])],
        num_classes=3,
    )


def test_label_counts_are_the_class_counts_of_each_clients_sets():
    labeled, unlabeled = label_counts(hand_partition(), LABELS, 3)
    # labeled: client 0 holds images 0 (class 0) and 3 (class 1); client 1 images 5, 6 (class 2)
    # and 9 (class 0)
    assert labeled.tolist() == [[1, 1, 0], [1, 0, 2]]
    # unlabeled: client 0 holds classes 0, 0, 0, 1, 1; client 1 classes 2, 2, 2, 2, 0, 1, 2
    assert unlabeled.tolist() == [[3, 2, 0], [1, 1, 5]]
    # a class no client holds is a column of zeros, not a missing column
    assert label_counts(hand_partition(), LABELS, 5)[0].tolist() == [
        [1, 1, 0, 0, 0],
        [1, 0, 2, 0, 0],
    ]
    with pytest.raises(ValueError, match="outside the 2 classes"):
        label_counts(hand_partition(), LABELS, 2)


def test_save_partition_writes_the_label_distribution_figure(tmp_path):
    cfg = {
        "dataset": {"name": "toy"},
        "partition": {"mode": "dirichlet", "delta": 0.3, "imbalance_ratio": None},
    }
    save_partition(hand_partition(), LABELS, tmp_path, cfg)
    png = tmp_path / "label_distribution.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    width, height = label_figure_size(2)
    assert img.shape == (round(height * LABEL_FIGURE_DPI), round(width * LABEL_FIGURE_DPI), 4)
    assert img.shape[1] > img.shape[0]  # wider than tall: clients run along the x axis
    assert img[..., :3].std() > 0.05  # not blank
    # each class's bars in its colour (tab10's first three), covering an area that follows the
    # counts: a count's height is its panel's height over the panel's tallest bar (3 labeled, 7
    # unlabeled images), the bars all equally wide
    import matplotlib

    rgb = np.round(img[..., :3] * 255)
    area = np.array(
        [
            (np.abs(rgb - np.round(np.array(colour) * 255)).max(-1) < 2).sum()
            for colour in matplotlib.colormaps["tab10"].colors[:3]
        ]
    )
    expected = np.array([1 + 1, 1 + 0, 0 + 2]) / 3 + np.array([3 + 1, 2 + 1, 0 + 5]) / 7
    assert area.min() > 2000  # far more than a legend patch
    assert area / area[0] == pytest.approx(expected / expected[0], rel=0.05)
    # the summary that the figure draws holds the same counts
    summary = json.loads((tmp_path / "partition_summary.json").read_text())
    assert summary["labeled"] == [[1, 1, 0], [1, 0, 2]]
    assert summary["unlabeled"] == [[3, 2, 0], [1, 1, 5]]


def test_the_figure_for_100_clients_and_100_classes(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 100, 20_000)
    part = make_partition(y, 100, 10_000, 100, "dirichlet", 0.3, seed=0)
    save_partition(part, y, tmp_path)
    import matplotlib.image as mpimg

    img = mpimg.imread(tmp_path / "label_distribution.png")
    width, height = label_figure_size(100)
    assert img.shape[:2] == (round(height * LABEL_FIGURE_DPI), round(width * LABEL_FIGURE_DPI))
    assert img[..., :3].std() > 0.05


def test_the_partition_is_named_in_the_titles():
    name = lambda mode, delta=None, ratio=None: partition_name(  # noqa: E731
        {"partition": {"mode": mode, "delta": delta, "imbalance_ratio": ratio}}
    )
    assert name("iid") == "IID" and name("dirichlet", 0.3) == "Dirichlet δ=0.3"
    assert name("iid", ratio=10) == "IID, unlabeled pool long-tailed 10:1"
    assert partition_name(None) == ""


def test_importing_the_partition_module_does_not_import_matplotlib():
    res = subprocess.run(
        [sys.executable, "-c", "import sys, fssl.partition; print('matplotlib' in sys.modules)"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_the_report_shows_each_settings_label_distribution(tmp_path):
    runs = tmp_path / "runs"
    # δ=0.3: two seeds with their figures; the report shows seed 0's, however the runs are named
    s0 = fake_run(runs, "z", "fixmatch", 0, [0.5, 0.7])
    s1 = fake_run(runs, "a", "fixmatch", 1, [0.4, 0.8])
    fake_run(runs, "b", "feddb", 0, [0.6, 0.9])  # no figure of its own: seed 0's is z's
    save_partition(hand_partition(), LABELS, s0)
    three = Partition(
        [np.array([0]), np.array([3]), np.array([5])],
        [np.array([0, 1]), np.array([3, 4]), np.array([5, 6])],
        3,
    )
    save_partition(three, LABELS, s1)
    assert (s0 / "label_distribution.png").read_bytes() != (
        s1 / "label_distribution.png"
    ).read_bytes()
    # δ=0.1: a run from before the figure, with its partition summary only: drawn from it
    old = fake_run(runs, "c", "fedavg", 0, [0.2, 0.3], delta=0.1)
    save_partition(hand_partition(), LABELS, old)
    (old / "label_distribution.png").unlink()
    # cifar10 IID: neither: no figure
    fake_run(runs, "d", "fedavg", 0, [0.5, 0.6], delta=None, dataset="cifar10")

    out = tmp_path / "rep"
    assert report.main([str(runs), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()

    copied = out / "label_distribution_mnist10k_dir0.3.png"
    assert copied.read_bytes() == (s0 / "label_distribution.png").read_bytes()
    caption = (
        "Class counts of each client's labeled and unlabeled data, mnist10k δ=0.3 "
        "(the partition of seed 0, shared by every method of that seed)"
    )
    assert f"{caption}:\n\n![{caption}](label_distribution_mnist10k_dir0.3.png)" in md

    drawn = out / "label_distribution_mnist10k_dir0.1.png"
    assert drawn.read_bytes()[:8] == PNG_SIGNATURE
    assert "](label_distribution_mnist10k_dir0.1.png)" in md
    assert "label_distribution_cifar10" not in md
    assert not list(out.glob("label_distribution_cifar10*"))
    # after the other figures, each embedded once
    assert md.index("](convergence.png)") < md.index("](label_distribution_mnist10k_dir0.3.png)")
    assert md.count("](label_distribution_") == 2
