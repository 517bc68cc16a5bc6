"""The fast small-model path (issue 68) changes no result: on the CPU the exact regime's runs write
the same metrics.jsonl, timings aside, with it and with the code it replaced
(benchmarks/exact.py: reference_path); `feddb bench --preset exact` times both."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest
import torch
from localgrid import metrics_without_timing, run_in_process

from benchmarks.exact import flip_crop_reference, normalize_reference, quiet, reference_path
from fssl import augment

# 4 rounds of 2 clients of 70 images; one evaluation, at the end
TINY = (
    "partition=iid fl.num_clients=100 fl.fraction_train=0.02 dataset.val_size=0 eval.every=4 "
    "logging.tensorboard=false checkpoint.every=0"
)
# on the suite's 1,200 digits: 2 of 10 clients of 100 images, 200 test images; 2 rounds, both
# semi-supervised (the exact regime has no warm-up): what a method carries between rounds is used
SMALL = (
    "partition=iid fl.num_clients=10 fl.fraction_train=0.2 dataset.val_size=0 eval.every=2 "
    "logging.tensorboard=false checkpoint.every=0"
)
ROWS = {  # the rows of the exact regime's claims and competitors, by their run-config
    "fedavg": {"method": "fedavg"},
    "fixmatch": {"method": "fixmatch"},
    "fixmatch-feddpl": {"method": "fixmatch", "dpl": True},
    "feddb": {"method": "feddb"},
    "flexmatch": {"method": "flexmatch"},
    "softmatch": {"method": "softmatch"},
}


@pytest.mark.parametrize("shape", [(7, 1, 28, 28), (5, 3, 32, 32), (3, 2, 3, 5)])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_augmentation_and_normalisation_are_the_replaced_ones(shape, flip, channels_last):
    x = torch.randint(0, 256, shape, dtype=torch.uint8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    fast = augment.flip_crop(x, flip, torch.Generator().manual_seed(3))
    ref = flip_crop_reference(x, flip, torch.Generator().manual_seed(3))
    assert torch.equal(fast, ref) and fast.stride() == ref.stride()
    mean, std = (0.1, 0.2, 0.3)[: shape[1]], (0.3, 0.2, 0.1)[: shape[1]]
    assert torch.equal(augment.normalize(x, mean, std), normalize_reference(x, mean, std))


def test_the_exact_regime_writes_the_same_metrics_on_either_path(tmp_path, small_npz):
    for name, row in ROWS.items():
        written = []
        for path in ("fast", "reference"):
            run_dir = tmp_path / name / path
            rc = row | {
                "experiment": "miniature_authors_exact",
                "dataset": "npz",
                "data-path": str(small_npz),
                "num-server-rounds": 2,
                "output-dir": str(run_dir),
                "overrides": SMALL,
            }
            with reference_path() if path == "reference" else contextlib.nullcontext(), quiet():
                run_in_process(rc)
            written.append(metrics_without_timing(run_dir))
        assert len(written[0]) == 2 and written[0][-1]["test_accuracy"] is not None, name
        assert written[0] == written[1], name


def test_bench_exact_prints_a_round_alone_runs_at_once_and_the_floor(tmp_path, monkeypatch, capsys):
    from benchmarks.speed import main

    out = tmp_path / "exact.json"
    argv = ["feddb bench", "--preset", "exact", "--device", "cpu", "--rounds", "2"]
    argv += ["--repeats", "1", "--jobs", "1", "--overrides", TINY, "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert main() == 0
    printed = capsys.readouterr().out
    lines = ("alone, fast path", "paired by repeat", "the replaced code alone", "1 runs at once")
    for line in (*lines, "below the round"):
        assert line in printed
    results = json.loads(out.read_text())
    assert results["round_flops"] > 0 and results["over_floor"] > 0
    assert len(results["alone_round_seconds"]["fast"]) == 1
