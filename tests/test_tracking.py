"""Experiment tracking (server_app/tracking.py): a real two-round run in process, tracked by MLflow
(into an SQLite store under tmp_path) and by Weights & Biases offline, read back through each
tool's own reader; the configuration keys; a failed run's status; the sweep's grouping."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from localgrid import run_in_process

from fssl.checks import ConfigError
from fssl.record import RoundMetrics, Scores
from server_app.config import compose, resolve
from server_app.tracking import Tracker, Tracking, TrackingError, mlflow_store

pytestmark = pytest.mark.usefixtures("task_identity")

OVERRIDES = (
    "fl.num_clients=4 fl.fraction_train=1 dataset.num_labeled=100 train.local_epochs=1 "
    "train.tau=0.6 fl.node_wait=0 train.warmup_rounds=0 logging.tensorboard=false model.width=8"
)


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """W&B never reaches the network and writes nothing outside tmp_path."""
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_API_KEY": "",
    }.items():
        monkeypatch.setenv(key, value)
    yield
    # W&B's service process (wandb-core) outlives a finished run in this process; stop it, or a
    # later test in this worker finds it among its own leftovers
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def run(tmp_path, data, logging, method="feddb", rounds=2):
    run_dir = tmp_path / "run-feddb-s3"
    run_in_process(
        {
            "method": method,
            "dataset": "npz",
            "data-path": str(data),
            "num-server-rounds": rounds,
            "seed": 3,
            "output-dir": str(run_dir),
            "overrides": f"{OVERRIDES} {logging}",
        }
    )
    return run_dir, [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]


def test_mlflow_run_holds_the_configuration_each_rounds_metrics_and_the_summary(
    tmp_path, small_npz
):
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlflow"
    run_dir, records = run(tmp_path, small_npz, f"logging.mlflow={store} logging.group=mysweep")
    uri = f"sqlite:///{store / 'mlflow.db'}"  # a directory holds an SQLite store
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["tracking_uri"] == uri
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mysweep")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == run_dir.name
    assert found.info.status == "FINISHED"
    params, tags = found.data.params, found.data.tags
    assert params["method.name"] == "feddb" and params["seed"] == "3"
    assert params["fl.num_clients"] == "4" and params["dma.enabled"] == "true"
    assert tags["method"] == "feddb" and tags["seed"] == "3" and tags["dataset"] == "npz"
    assert tags["partition"].startswith("dirichlet")
    commit = json.loads((run_dir / "provenance.json").read_text()).get("commit")
    assert tags.get("commit") == commit

    def history(key):
        return [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, key)]

    assert [r["round"] for r in records] == [1, 2]
    for key in ("test_accuracy", "test_loss", "top_class_share", "lr", "round_seconds"):
        assert sorted(history(key)) == [(r["round"], r[key]) for r in records], key
    # DMA's weight of each client (all 4 take part), a curve per partition id
    assert all([c["partition_id"] for c in r["clients"]] == [0, 1, 2, 3] for r in records)
    for pid in range(4):
        assert sorted(history(f"dma_weight/client_{pid}")) == [
            (r["round"], r["dma"]["weights"][pid]) for r in records
        ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert found.data.metrics["summary/final_test_accuracy"] == summary["final_test_accuracy"]
    names = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"summary.json", "config.yaml", "provenance.json"} <= names
    copy = client.download_artifacts(found.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(copy).read_text()) == summary


def wandb_records(path):
    """The records of an offline run's .wandb transaction log, as W&B's own reader prints them
    (`wandb leet inspect --json`, wandb-core)."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WANDB_MODE": "offline"},
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_wandb_offline_run_holds_the_configuration_each_rounds_metrics_and_the_summary(
    tmp_path, small_npz
):
    run_dir, records = run(tmp_path, small_npz, "logging.wandb=true logging.group=mysweep")
    (offline,) = (run_dir / "wandb").glob("offline-run-*")  # under the run directory
    assert json.loads((run_dir / "tracking.json").read_text())["wandb"]["dir"] == str(offline)
    log = wandb_records(offline)
    (start,) = [r["run"] for r in log if r["type"] == "run"]
    assert start["display_name"] == run_dir.name and start["run_group"] == "mysweep"
    assert start["telemetry"]["feature"]["offline"] is True
    assert {"method=feddb", "seed=3", "dataset=npz"} <= set(start["tags"])
    config = start["config"]["update"]
    assert config["method.name"] == "feddb" and config["seed"] == 3
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in log if "history" in r}
    assert sorted(history) == [r["round"] for r in records] == [1, 2]
    for r in records:
        item = history[r["round"]]
        for key in ("test_accuracy", "test_loss", "pseudo_label_ratio", "lr"):
            assert item[key] == r[key], key
        assert [item[f"dma_weight/client_{pid}"] for pid in range(4)] == r["dma"]["weights"]
    summary = json.loads((run_dir / "summary.json").read_text())
    updates = {}
    for r in log:
        if r["type"] == "summary":
            updates.update(r["summary"]["update"])
    assert updates["summary/final_test_accuracy"] == summary["final_test_accuracy"]
    saved = {f["path"] for r in log if r["type"] == "files" for f in r["files"]["files"]}
    assert "summary.json" in saved
    assert json.loads((offline / "files" / "summary.json").read_text()) == summary
    (exit_record,) = [r for r in log if r["type"] == "exit"]
    assert exit_record["exit"].get("exit_code", 0) == 0


def test_a_run_that_fails_ends_its_tracked_run_as_failed(tmp_path, small_npz, monkeypatch):
    from mlflow.tracking import MlflowClient

    import server_app.app

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(server_app.app, "save_checkpoint", boom)
    store = tmp_path / "store.db"
    with pytest.raises(RuntimeError, match="disk full"):
        run(tmp_path, small_npz, f"logging.mlflow={store} checkpoint.every=1", rounds=3)
    client = MlflowClient(f"sqlite:///{store}")
    (found,) = client.search_runs([client.get_experiment_by_name("feddb").experiment_id])
    assert found.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(found.info.run_id, "test_accuracy")] == [1]


def test_a_resumed_run_continues_its_tracked_run(tmp_path, small_npz, monkeypatch):
    from mlflow.tracking import MlflowClient

    import server_app.app

    save = server_app.app.save_checkpoint

    def crash_after_round_2(run_dir, server_round, *args):
        if server_round == 2:
            raise RuntimeError("killed")
        save(run_dir, server_round, *args)

    store = tmp_path / "mlflow"
    logging = f"logging.mlflow={store} logging.wandb=true checkpoint.every=1"
    with monkeypatch.context() as m:
        m.setattr(server_app.app, "save_checkpoint", crash_after_round_2)
        with pytest.raises(RuntimeError, match="killed"):
            run(tmp_path, small_npz, logging, rounds=3)
    run_dir = tmp_path / "run-feddb-s3"
    first = json.loads((run_dir / "tracking.json").read_text())
    run_in_process({"resume": str(run_dir)})
    ids = json.loads((run_dir / "tracking.json").read_text())
    assert ids["mlflow"]["run_id"] == first["mlflow"]["run_id"]
    assert ids["wandb"]["id"] == first["wandb"]["id"]
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("feddb").experiment_id])
    assert found.info.status == "FINISHED" and found.data.tags["resumed_from_round"] == "1"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steps = {m.step: m.value for m in client.get_metric_history(found.info.run_id, "test_loss")}
    assert steps == {r["round"]: r["test_loss"] for r in records}  # round 2 twice, the same
    # W&B: a second offline run directory with the same run id (`wandb sync` continues it)
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']['id']}"))) == 2


class Fake(Tracker):
    tool = "fake"

    def __init__(self):
        self.calls = []

    def start(self, info):
        self.calls.append(("start", info.name))
        return {}

    def log_metrics(self, metrics, step):
        self.calls.append(("metrics", step))

    def log_summary(self, metrics, step):
        self.calls.append(("summary", step))

    def log_files(self, paths):
        self.calls.append(("files", sorted(p.name for p in paths)))

    def end(self, status):
        self.calls.append(("end", status))


@pytest.mark.parametrize("fails", [False, True])
def test_a_complete_run_ends_at_its_summary_unless_an_exception_is_on_its_way(
    tmp_path, tiny_cfg, fails
):
    tracking = Tracking(tiny_cfg, tmp_path)
    fake = Fake()
    tracking.trackers.append(fake)
    (tmp_path / "summary.json").write_text("{}")
    tracking.log_round(RoundMetrics(2, Scores(test_accuracy=0.5)), None)
    try:
        try:
            if fails:
                raise ValueError
        finally:
            tracking.close(complete=True)
    except ValueError:
        pass
    tracking.finish({"rounds": 2, "final_test_accuracy": 0.5})
    done = [("start", tmp_path.name), ("metrics", 2)]
    if fails:
        assert fake.calls == [*done, ("end", "FAILED")]
    else:
        assert fake.calls == [
            *done,
            ("summary", 2),
            ("files", ["summary.json"]),
            ("end", "FINISHED"),
        ]


def test_tracking_is_off_by_default_and_a_missing_package_is_named(tmp_path, tiny_cfg, monkeypatch):
    assert not Tracking(tiny_cfg, tmp_path)
    for key, module, install in (
        ("mlflow", "mlflow.tracking", "pip install mlflow-skinny"),
        ("wandb", "wandb", "pip install wandb"),
    ):
        cfg = {**tiny_cfg, "logging": {"mlflow": key == "mlflow" and "x", "wandb": key == "wandb"}}
        with monkeypatch.context() as m:
            m.setitem(sys.modules, module, None)  # import fails
            with pytest.raises(TrackingError, match=f"`logging.{key}`.*{install}"):
                Tracking(cfg, tmp_path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("logging.wandb=maybe", "`logging.wandb`: 'maybe'; allowed: true or false"),
        ("logging.mlflow=3", "`logging.mlflow`: 3; allowed: a path string"),
        ("logging.wandb_dir=true", "`logging.wandb_dir`: True"),
        ("logging.group=[a]", "`logging.group`: ['a']"),
    ],
)
def test_bad_tracking_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        compose([override])
    with pytest.raises(ConfigError, match="logging"):
        resolve({"overrides": override})


def test_defaults_and_saved_configurations_without_the_keys():
    log = compose([])["logging"]
    assert log == {
        "tensorboard": True,
        "mlflow": None,
        "wandb": False,
        "wandb_dir": None,
        "group": "",
    }
    cfg = compose([])
    cfg["logging"] = {"tensorboard": True}  # a run saved before the keys
    from fssl.config import validate

    validate(cfg)


def test_mlflow_settings_become_tracking_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert mlflow_store("runs/mlflow") == (
        f"sqlite:///{tmp_path / 'runs/mlflow/mlflow.db'}",
        tmp_path / "runs/mlflow/artifacts",
    )
    assert mlflow_store("sqlite:///runs/m.db") == (
        f"sqlite:///{tmp_path / 'runs/m.db'}",
        tmp_path / "runs/m-artifacts",
    )
    assert mlflow_store(f"{tmp_path}/x.db")[0] == f"sqlite:///{tmp_path}/x.db"
    assert mlflow_store("http://localhost:5000") == ("http://localhost:5000", None)


def test_a_sweep_row_with_overrides_keeps_them_beside_the_sweeps(tmp_path):
    from feddb.launch import parse_run_config
    from feddb.sweep import join_overrides

    row, extra = join_overrides(
        "method='fixmatch' overrides='server.weighting=uniform'",
        "num-server-rounds=3 overrides='logging.mlflow=runs/mlflow logging.group=mine'",
    )
    rc = parse_run_config(f"{row} seed=0 {extra}")
    assert (
        rc["overrides"] == "server.weighting=uniform logging.mlflow=runs/mlflow logging.group=mine"
    )
    assert rc["method"] == "fixmatch" and rc["num-server-rounds"] == 3
    assert join_overrides("method='feddb'", "seed=1") == ("method='feddb'", "seed=1")
