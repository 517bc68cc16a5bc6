"""A user's method by path: loaded by file or module, checked before anything runs, trained by the
project's clients in the in-process engine and through a real `flwr run` started from a directory
outside the project (the worked example in docs/examples/)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY, flower_pids

from fssl.config import ConfigError, run_config_to_overrides
from fssl.methods import method_class
from fssl.methods.fixmatch import FixMatch
from fssl.runtime import client_data_for, data_meta, dataset_for
from server_app.config import compose

PROJECT = Path(__file__).resolve().parents[1]
EXAMPLE = PROJECT / "docs" / "examples" / "smoothed_fixmatch.py"
SPEC = f"{EXAMPLE}:SmoothedFixMatch"


def user_cfg(*extra: str) -> dict:
    overrides = run_config_to_overrides({"method": SPEC})
    cfg = compose(TINY + overrides + ["train.tau=0.3", *extra])
    cfg["data_meta"] = data_meta(dataset_for(cfg))
    return cfg


def test_a_user_method_loads_by_file_and_by_module_and_is_named_after_its_class(monkeypatch):
    by_file = method_class(SPEC)
    assert issubclass(by_file, FixMatch) and by_file.display == "FixMatch (label smoothing)"
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    by_module = method_class("smoothed_fixmatch:SmoothedFixMatch")
    assert by_module.__name__ == "SmoothedFixMatch"
    cfg = user_cfg()
    assert cfg["method"]["name"] == "SmoothedFixMatch" and cfg["method"]["trainer"] == SPEC
    assert cfg["train"]["lr"] == compose(TINY + ["method=fixmatch"])["train"]["lr"]  # its family's


def test_its_own_parameters_are_checked_and_its_hook_changes_training():
    with pytest.raises(ConfigError, match=r"`method.params.smoothing`: 2"):
        compose(
            run_config_to_overrides({"method": SPEC, "overrides": "+method.params.smoothing=2"})
        )

    def fit(cfg):
        from fssl.methods import make_model, make_trainer

        torch.manual_seed(0)
        model = make_model(cfg, 10, 1)
        t = make_trainer(
            cfg, cfg["data_meta"]["mean"], cfg["data_meta"]["std"], torch.device("cpu")
        )
        return t.fit(model, client_data_for(cfg, 1, torch.device("cpu")), 0.1, seed=7)

    plain = compose(TINY + ["method=fixmatch", "train.tau=0.1"])
    plain["data_meta"] = data_meta(dataset_for(plain))
    smoothed = fit(user_cfg("+method.params.smoothing=0.5", "train.tau=0.1"))  # all confident
    base = fit(plain)
    assert smoothed["pseudo_label_count"] == base["pseudo_label_count"] > 0  # same labels
    assert smoothed["loss_unsup"] > base["loss_unsup"]  # the smoothed loss on the same labels


def test_a_user_method_runs_in_the_in_process_engine(tmp_path, monkeypatch):
    from feddb.inprocess import main as local_main

    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    out = tmp_path / "run"
    rc = (
        "method='smoothed_fixmatch:SmoothedFixMatch' dpl=true dma=true num-server-rounds=2 "
        f"output-dir='{out}' overrides='{' '.join(TINY)} train.warmup_rounds=1'"
    )
    assert local_main(["--run-config", rc]) == 0
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and rounds[1]["dma"]  # DMA composes with it


@pytest.mark.slow
def test_a_user_method_trains_through_flwr_run_from_outside_the_project(tmp_path):
    from feddb.resources import free_port

    mine = tmp_path / "my_project"  # the user's own directory, not the project's
    mine.mkdir()
    shutil.copy(EXAMPLE, mine / "my_method.py")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env.update(
        FLWR_HOME=str(tmp_path / "home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
    )
    rc = (
        f"method='{mine / 'my_method.py'}:SmoothedFixMatch' num-server-rounds=1 "
        f"output-dir='{out}' overrides='fl.num_clients=2 fl.fraction_train=1.0 train.tau=0.1 "
        "dataset.num_labeled=200 train.warmup_rounds=0 +method.params.smoothing=0.2'"
    )
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        res = subprocess.run(
            [flwr, "run", str(PROJECT), "--stream", "--run-config", rc],
            cwd=mine,
            env=env,
            text=True,
            capture_output=True,
            timeout=400,
        )
    finally:
        for pid in flower_pids(tmp_path / "home"):
            os.kill(pid, 15)
    log = res.stdout[-3000:] + res.stderr[-3000:]
    assert (out / "metrics.jsonl").is_file(), log  # (`flwr run --stream` exits 0 on failure too)
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1] and len(rounds[0]["clients"]) == 2, log
    assert rounds[0]["clients"][0]["pseudo_label_ratio"] == 1.0  # tau 0.1: all confident
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())["method"]
    assert saved["name"] == "SmoothedFixMatch" and saved["params"] == {"smoothing": 0.2}


def test_a_deployed_node_runs_a_user_method_only_where_its_operator_allowed_it(tmp_path):
    """A method by path runs code from the node's disk that the installed app does not hold: a
    SuperNode with its own data refuses it unless its node_config allows that path."""
    from test_client_app import _run

    from fssl.data import write_client_files
    from fssl.runtime import partition_for

    cfg = compose(TINY + run_config_to_overrides({"method": SPEC}) + ["train.tau=0.1"])
    part = partition_for(cfg)
    files = write_client_files(dataset_for(cfg), part.labeled, part.unlabeled, tmp_path)
    own = {"data-path": str(files[1])}
    with pytest.raises(PermissionError, match="allow-methods"):  # Flower's runtime: an error reply
        _run(cfg, pid=1, node_config=own)
    _, allowed = _run(cfg, pid=1, node_config={**own, "allow-methods": SPEC})
    assert not allowed.has_error(), allowed.error.reason if allowed.has_error() else ""
    _, simulated = _run(cfg, pid=1)  # a simulation's nodes are the user's own processes
    assert not simulated.has_error()
