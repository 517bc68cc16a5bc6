"""A run knows what it is (identity.json, fssl/identity.py): written before its first round,
checked by resume; its switch names for runs started by hand."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from feddb.inprocess import main as local_main
from feddb.inprocess import run_in_process
from fssl import checkpoint, identity
from server_app.config import compose

pytestmark = pytest.mark.usefixtures("task_identity")

OVERRIDES = (
    "fl.num_clients=4 fl.fraction_train=0.5 dataset.num_labeled=100 train.local_epochs=1 "
    "fl.node_wait=0 checkpoint.every=1 model.width=8"
)


class Crash(BaseException):
    pass


def crash_in_round_2(ins, ctx, reply):
    if "config" in ins.content and int(ins.content["config"]["server-round"]) == 2:
        raise Crash()
    return reply


def crashed_run(run_dir, data, seed=4, **extra):
    """A 3-round run stopped in round 2, its round-1 checkpoint on disk."""
    rc = {
        "dataset": "npz",
        "data-path": str(data),
        "num-server-rounds": 3,
        "seed": seed,
        "output-dir": str(run_dir),
        "overrides": OVERRIDES,
        **extra,
    }
    with pytest.raises(Crash):
        run_in_process(rc, 4, crash_in_round_2)
    return run_dir


def snapshot(run_dir):
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


def test_a_run_records_its_row_selection_regime_and_fingerprints_before_its_first_round(
    small_npz, tmp_path
):
    run = crashed_run(tmp_path / "run", small_npz, row="fixmatch-gn", selection="train.lr=0.1")
    ident = identity.read(run)
    assert ident["row"] == "fixmatch-gn" and ident["row_from"] == "table"
    assert ident["selection"] == {"key": "train.lr", "value": "0.1"}
    assert ident["regime"] == "quick" and ident["seed"] == 4
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert ident["config"] == identity.config_fingerprint(saved)
    # the seed and the directory are not the configuration; a setting is
    assert identity.config_fingerprint({**saved, "seed": 9, "output_dir": "x"}) == ident["config"]
    changed = {**saved, "train": {**saved["train"], "tau": 0.5}}
    assert identity.config_fingerprint(changed) != ident["config"]
    assert identity.differing_keys(saved, changed) == ["train.tau"]
    # by hand: named by its switches
    plain = crashed_run(tmp_path / "plain", small_npz, method="fixmatch", dpl=True)
    assert identity.read(plain)["row"] == "fixmatch+dpl"
    assert identity.read(plain)["row_from"] == "switches"
    with pytest.raises(identity.IdentityError, match="<key>=<value>"):
        identity.selection_of("0.1")


@pytest.mark.parametrize(
    "overrides, name",
    [
        (["method=feddb"], "feddb"),
        (["method=feddb", "dma.enabled=false"], "feddb-dma"),
        (["method=fixmatch", "dpl=true", "dpl_prior=global"], "fixmatch+dpl+global-prior"),
        (["method=fixmatch", "strategy=fedprox"], "fixmatch@fedprox"),
    ],
)
def test_a_run_by_hand_is_named_by_its_switches(overrides, name):
    assert identity.switches_name(compose(overrides)) == name


def test_a_run_by_path_is_named_by_its_class_and_a_hash_of_the_path():
    cfg = compose(["method=custom", "method.trainer='fssl.methods.fixmatch:FixMatch'"])
    assert identity.switches_name(cfg).startswith("FixMatch@")


def test_resume_after_the_data_changed_is_refused_and_changes_nothing(small_npz, tmp_path):
    data = tmp_path / "data.npz"
    shutil.copy(small_npz, data)
    run = crashed_run(tmp_path / "run", data)
    arrays = dict(np.load(data))
    arrays["y_train"] = np.roll(arrays["y_train"], 1)  # another labelling, same shapes
    np.savez(data, **arrays)
    before = snapshot(run)
    assert local_main(["--run-config", f"resume='{run}'"]) == 2
    assert snapshot(run) == before
    # an edited config.yaml is refused too
    text = (run / "config.yaml").read_text().replace("tau: 0.95", "tau: 0.5")
    (run / "config.yaml").write_text(text)
    shutil.copy(small_npz, data)
    with pytest.raises(identity.IdentityError, match="config.yaml no longer matches"):
        from feddb.launch import preflight

        preflight(f"resume='{run}'")


def test_resume_with_another_runs_checkpoint_is_refused(small_npz, tmp_path, capsys):
    mine = crashed_run(tmp_path / "mine", small_npz, seed=1)
    other = crashed_run(tmp_path / "other", small_npz, seed=0)
    files = (checkpoint.FILE, checkpoint.FILE + ".sha256")
    own = {name: (mine / name).read_bytes() for name in files}
    for name in files:
        shutil.copy(other / name, mine / name)
    before = snapshot(mine)
    assert local_main(["--run-config", f"resume='{mine}'"]) == 2
    assert "written by another run" in capsys.readouterr().err
    assert snapshot(mine) == before
    # its own checkpoint resumes
    for name in files:
        (mine / name).write_bytes(own[name])
    assert local_main(["--run-config", f"resume='{mine}'"]) == 0
    assert json.loads((mine / "summary.json").read_text())["rounds"] == 3
