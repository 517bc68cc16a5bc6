"""One pairing rule (fssl/pairing.py) for `feddb report`, `feddb claims` and the cause study: a pair
that fails it is left out with one line saying why; and a t-test that does not exist is NaN."""

import csv
import math

import numpy as np
from test_claims import fake_run

from feddb.stats import holm, p_text, paired_test
from fssl.pairing import pairable
from fssl.record import RoundMetrics, Scores
from studies import claims, factors


def run(seed=0, device="cpu", warm=(0.5, 0.6), warmup=2, delta=0.1, pool_order="index"):
    """A run record as read_run gives it: its configuration, rounds and provenance."""
    partition = {"mode": "dirichlet", "delta": delta, "min_size": 1}
    if pool_order is not None:  # None: a run from before partition.pool_order existed
        partition["pool_order"] = pool_order
    cfg = {
        "seed": seed,
        "dataset": {"name": "mnist10k", "num_labeled": 100, "val_size": 1000, "val_seed": 0},
        "partition": partition,
        "fl": {"num_clients": 20, "fraction_train": 0.5},
        "train": {"warmup_rounds": warmup},
    }
    rounds = [RoundMetrics(r + 1, Scores(test_accuracy=a)) for r, a in enumerate(warm[:warmup])]
    rounds.append(RoundMetrics(warmup + 1, Scores(test_accuracy=0.9)))
    return {"cfg": cfg, "rounds": rounds, "provenance": {"device": device, "hardware": "X, 2"}}


def test_two_runs_are_a_pair_only_on_one_seed_partition_device_and_warm_up():
    assert pairable(run(), run()) is None
    assert pairable(run(), run(seed=1)) == "seeds 0 and 1"
    assert pairable(run(), run(delta=0.3)) == "their partitions differ (partition.delta)"
    assert pairable(run(), run(device="cuda:0")) == (
        "they ran on two kinds of device (cpu (X); cuda (X))"
    )
    assert pairable(run(), run(warm=(0.5, 0.7))) == "their warm-ups differ"
    assert pairable(run(), run(warmup=1)) == "their warm-ups differ"
    # a key an older run lacks is not held against it; another value of it is
    assert pairable(run(), run(pool_order=None)) is None
    assert pairable(run(), run(pool_order="class")) == (
        "their partitions differ (partition.pool_order)"
    )
    # what a comparison flips may differ (the cause study's factors)
    assert pairable(run(), run(warmup=0), varied=("train.warmup_rounds",)) is None
    assert pairable(run(), run(device="cuda"), varied=("train.warmup_rounds",)) is not None


def test_the_cause_study_leaves_out_a_pair_whose_warm_ups_differ_with_a_line():
    """Against the exact point the flipped warm-up may differ; between FixMatch-FedDPL and
    FixMatch within that factor it may not."""
    exact = {s: run(s, warmup=0) for s in range(3)}
    flipped = {s: run(s) for s in range(3)}
    with_dpl = {s: run(s, warm=(0.5, 0.7) if s == 2 else (0.5, 0.6)) for s in range(3)}
    left_out = []
    assert factors.pairs(flipped, exact, factors.FACTORS, "warm-up 2, FixMatch", left_out) == [
        0,
        1,
        2,
    ]
    assert not left_out
    assert factors.pairs(with_dpl, flipped, (), "warm-up 2, DPL", left_out) == [0, 1]
    assert left_out == ["warm-up 2, DPL, seed 2: their warm-ups differ"]


def test_report_leaves_out_a_pair_on_two_kinds_of_device_with_a_line(tmp_path, capsys):
    from feddb import report

    for seed in range(3):
        fake_run(tmp_path, "fixmatch", seed, 0.85, 0.5, 0.14, device="cuda:0" if seed else "cpu")
        fake_run(tmp_path, "fixmatch-feddpl", seed, 0.86 + seed / 100, 0.5, 0.14)
    out = tmp_path / "out"
    assert report.main([str(tmp_path / "cpu"), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Pairs left out: "))
    assert (
        line.count("seed ") == 2 and "FixMatch-FedDPL − FixMatch, seed 1: they ran on two " in line
    )
    assert line in capsys.readouterr().out
    # the comparison rests on seed 0 alone
    row = next(x for x in md.splitlines() if "| FixMatch-FedDPL − FixMatch |" in x)
    assert row.split(" | ")[2:4] == ["1", "+1.00"]


def test_claims_leave_out_the_one_pair_whose_warm_ups_differ_and_test_the_rest(tmp_path, capsys):
    for seed in range(3):
        fake_run(tmp_path, "fedavg", seed, 0.80, 0.5, 0.14)
        warm = 0.4 if seed == 2 else None
        fake_run(tmp_path, "fixmatch", seed, 0.85 + seed / 100, 0.5, 0.14, warm_acc=warm)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    ssl = rows[("FixMatch, n_m", "FedAvg")]
    assert ssl["seeds"] == "0 1" and ssl["matched"] == "1"
    want = "Pairs left out: FixMatch, n_m − FedAvg, seed 2: their warm-ups differ."
    assert want in (out / "claims.md").read_text().splitlines()
    assert want in capsys.readouterr().err


def test_identical_non_zero_differences_have_no_t_test_and_print_cleanly():
    from feddb.report import paired_table

    test = paired_test([2.0, 2.0, 2.0])
    assert math.isnan(test["p"]) and test["signs"] == (3, 0) and test["p_sign"] == 0.25
    assert paired_test([0.0, 0.0, 0.0])["p"] == 1.0  # no difference at all
    assert p_text(test["p"]) == "–"
    adjusted = holm([test["p"], 0.01, 0.04])
    assert math.isnan(adjusted[0]) and adjusted[1:] == [0.02, 0.04]  # a family of two
    rows = [
        {"setting": "s", "a": a, "b": "FedAvg", "seeds": 3, "diffs": d, "mean": float(np.mean(d))}
        for a, d in (("FixMatch", [2.0, 2.0, 2.0]), ("FedDB", [1.0, 2.0, 3.0]))
    ]
    for r in rows:
        r.update(low=r["mean"] - 1, high=r["mean"] + 1)
    cells = {x.split(" | ")[1]: x.split(" | ")[6:9] for x in paired_table(rows, "it is")[2:]}
    assert cells["FixMatch − FedAvg"] == ["–", "–", "0.250"]
    assert cells["FedDB − FedAvg"][1] == cells["FedDB − FedAvg"][0]  # Holm over one p-value


def test_a_family_fixed_beforehand_keeps_its_size_in_holm():
    """A plan's family of three with one comparison missing and one without a p: each absent one
    counts as p = 1, so the one p is multiplied by three, never by one."""
    assert holm([0.01, math.nan], size=3) == [0.03, 1.0]
    assert [round(p, 12) for p in holm([0.01, 0.02], size=3)] == [0.03, 0.04]
    assert holm([0.01, math.nan])[0] == 0.01  # no size: the family is the p-values given
