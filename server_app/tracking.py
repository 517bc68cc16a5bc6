"""Experiment tracking besides TensorBoard, opt-in: MLflow (`logging.mlflow`: a tracking URI or a
directory) and Weights & Biases in offline mode only (`logging.wandb`), grouped by
`logging.group` (MLflow's experiment, W&B's group).

A tracked run is named as the run directory. It holds the resolved configuration as flat params
(`train.lr`, ...), the tags method, dataset, partition, seed and commit, the scalars of each
metrics.jsonl record with the round as the step (the same names: `test_accuracy`, nested ones as
`dma/weight_entropy`, `timing/evaluate`), the clients' mean losses (`train/loss_sup`), DMA's
weight of each client (`dma_weight/client_07`, by partition id: a curve per client that lines up
across runs, which a JSON file per round would not), and at the end summary.json's figures
(`summary/final_test_accuracy`, ...) with summary.json, config.yaml, provenance.json and any PNG
of the run directory as artifacts (W&B: the run's files).

The packages are imported only when enabled. metrics.jsonl stays the record: a tool that fails
during a run is reported once and left off, and the run goes on. A resumed run continues the same
tracked run (its ids are kept in run_dir/tracking.json).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fssl.checks import ConfigError
from fssl.partition import partition_label
from fssl.record import RoundMetrics

DEFAULT_GROUP = "feddb"  # MLflow's experiment without logging.group
WANDB_PROJECT = "feddb"
IDS_FILE = "tracking.json"
ARTIFACTS = ("summary.json", "config.yaml", "provenance.json")


class TrackingError(ConfigError):
    """A tracking tool is configured but cannot be used (not installed, store unreachable)."""


def missing(package: str, key: str, install: str) -> TrackingError:
    return TrackingError(
        f"`{key}` is on but the `{package}` package is not installed: `pip install {install}` "
        f"in the project's environment, or set {key} off"
    )


@dataclass
class RunInfo:
    """What a tracked run starts with."""

    name: str  # the run directory's name
    group: str  # logging.group, "" for none
    params: dict[str, Any]  # the resolved configuration, flat
    tags: dict[str, str]
    run_dir: Path
    resumed_from: int | None = None
    previous: dict[str, Any] = field(default_factory=dict)  # this tool's ids from tracking.json


class Tracker:
    """One tool's run: start, metrics by round, the summary and files, end."""

    tool = ""

    def start(self, info: RunInfo) -> dict[str, Any]:
        """Open the run; returns its ids (kept in run_dir/tracking.json to resume it)."""
        raise NotImplementedError

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_summary(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_files(self, paths: list[Path]) -> None:
        raise NotImplementedError

    def end(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        raise NotImplementedError

    def where(self) -> str:
        """Where the run is and how to open it, for the run's log."""
        return self.tool


# -- MLflow -------------------------------------------------------------------------------------


def mlflow_store(setting: str) -> tuple[str, Path | None]:
    """(tracking URI, local artifact root or None) of `logging.mlflow`. A directory holds an
    SQLite store (mlflow.db) and the artifacts (MLflow 3 refuses its old file store unless
    MLFLOW_ALLOW_FILE_STORE=true); a path ending in .db is that SQLite file. Relative paths are
    taken from the working directory (the project's under the launcher), as the run
    directories are. Other URIs (http://, postgresql://, file:) go to MLflow as they are."""
    scheme = urlparse(setting).scheme
    if scheme == "sqlite" and setting.startswith("sqlite:///"):
        rest = setting[len("sqlite:///") :]
        if rest in ("", ":memory:"):
            return setting, None
        db = Path(rest).expanduser().resolve()
        return f"sqlite:///{db}", db.with_name(db.stem + "-artifacts")
    if len(scheme) > 1:  # a URI (one letter: a Windows drive)
        return setting, None
    path = Path(setting).expanduser().resolve()
    if path.suffix == ".db":
        return f"sqlite:///{path}", path.with_name(path.stem + "-artifacts")
    return f"sqlite:///{path / 'mlflow.db'}", path / "artifacts"


@contextmanager
def store_lock(artifact_root: Path | None) -> Iterator[None]:
    """Runs side by side (`feddb sweep --jobs N`) create a local store and its experiment one at a
    time: two first connections would both create the SQLite tables."""
    if artifact_root is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    artifact_root.parent.mkdir(parents=True, exist_ok=True)
    with open(artifact_root.parent / ".mlflow.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class MLflowTracker(Tracker):
    """Through MlflowClient (no global active run): experiment = the group, run = the run."""

    tool = "mlflow"

    def __init__(self, setting: str, group: str) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise missing("mlflow", "logging.mlflow", "mlflow-skinny") from err
        self.uri, self.artifact_root = mlflow_store(setting)
        self.experiment = group or DEFAULT_GROUP
        try:
            with store_lock(self.artifact_root):
                self.client = MlflowClient(self.uri)
                self.experiment_id = self.experiment_id_of(self.experiment)
        except ImportError as err:  # the SQLite store needs SQLAlchemy and alembic
            raise TrackingError(
                f"logging.mlflow={setting}: the MLflow store {self.uri} needs {err.name}: "
                "`pip install mlflow-skinny sqlalchemy alembic`"
            ) from err
        except Exception as err:
            raise TrackingError(
                f"logging.mlflow={setting}: cannot open the MLflow store {self.uri}: {err}"
            ) from err
        self.run_id: str | None = None

    def experiment_id_of(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.artifact_root is not None:
            location = (self.artifact_root / re.sub(r"[^\w.-]", "_", name)).as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created meanwhile by another process (a remote store)
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def start(self, info: RunInfo) -> dict[str, Any]:
        from mlflow.entities import Param

        prev = info.previous
        if info.resumed_from is not None and prev.get("tracking_uri") == self.uri:
            try:
                run_id = self.client.get_run(prev["run_id"]).info.run_id
            except Exception:  # noqa: BLE001 - gone from the store: a new run
                run_id = None
            if run_id is not None:
                self.run_id = run_id
                self.client.update_run(run_id, status="RUNNING")
                self.client.set_tag(run_id, "resumed_from_round", str(info.resumed_from))
                return self.ids()
        tags = {**info.tags, "run_dir": str(info.run_dir)}
        if "commit" in tags:
            tags["mlflow.source.git.commit"] = tags["commit"]
        run = self.client.create_run(self.experiment_id, run_name=info.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k[:250], param_text(v)[:6000]) for k, v in info.params.items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        return self.ids()

    def ids(self) -> dict[str, Any]:
        return {"tracking_uri": self.uri, "experiment": self.experiment, "run_id": self.run_id}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    log_summary = log_metrics

    def log_files(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def end(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)

    def where(self) -> str:
        return (
            f"MLflow run {self.run_id} in experiment '{self.experiment}' "
            f"(mlflow ui --backend-store-uri {self.uri})"
        )


def param_text(value: Any) -> str:
    """A parameter as the configuration's YAML writes it: true, false, null, lists as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


# -- Weights & Biases ---------------------------------------------------------------------------


class WandbTracker(Tracker):
    """Offline only: the run is written under `directory`/wandb/offline-run-*; nothing is sent
    (mode="offline", no error reports, no system stats); `wandb sync` uploads it later."""

    tool = "wandb"

    def __init__(self, directory: Path, group: str) -> None:
        # before wandb reads its environment: offline whatever the user's, no telemetry
        os.environ["WANDB_MODE"] = "offline"
        os.environ["WANDB_ERROR_REPORTING"] = "false"
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except ImportError as err:
            raise missing("wandb", "logging.wandb", "wandb") from err
        self.wandb, self.directory, self.group = wandb, directory, group
        self.run: Any = None

    def settings(self) -> Any:
        wanted = {
            "mode": "offline",
            "silent": True,
            "console": "off",  # the progress lines stay in the run's log
            "x_disable_stats": True,
            "x_disable_meta": True,
            "x_disable_machine_info": True,
            "x_disable_viewer": True,
            "disable_git": True,
            "disable_code": True,
            "save_code": False,
            "disable_job_creation": True,
            "x_save_requirements": False,
        }
        known = getattr(self.wandb.Settings, "model_fields", wanted)  # this version's settings
        return self.wandb.Settings(**{k: v for k, v in wanted.items() if k in known})

    def start(self, info: RunInfo) -> dict[str, Any]:
        self.directory.mkdir(parents=True, exist_ok=True)
        resume = {}
        if info.resumed_from is not None and info.previous.get("id"):
            resume = {"id": info.previous["id"], "resume": "allow"}
        self.run = self.wandb.init(
            project=WANDB_PROJECT,
            group=info.group or None,
            name=info.name,
            dir=str(self.directory),
            config=info.params,
            tags=[f"{k}={v}"[:64] for k, v in info.tags.items()],
            settings=self.settings(),
            reinit="create_new",
            **resume,
        )
        return {"id": self.run.id, "dir": str(Path(self.run.dir).parent)}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_summary(self, metrics: dict[str, float], step: int) -> None:
        self.run.summary.update(metrics)

    def log_files(self, paths: list[Path]) -> None:
        files = Path(self.run.dir)
        for path in paths:  # copies: the offline run holds what `wandb sync` uploads
            shutil.copy2(path, files / path.name)
            self.run.save(str(files / path.name), base_path=str(files), policy="now")

    def end(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def where(self) -> str:
        return f"W&B offline run in {Path(self.run.dir).parent} (wandb sync it to upload)"


# -- what the recorder calls --------------------------------------------------------------------


class Tracking:
    """The enabled trackers of a run, driven by RoundRecorder: constructed with it (a missing
    package stops the run before it starts), a tracked run opened at the first round recorded,
    metrics each round, the summary and files at `finish`, the end at `close` on failure."""

    def __init__(self, cfg: dict[str, Any], run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        log = cfg.get("logging", {})
        self.group = str(log.get("group") or "")
        self.trackers: list[Tracker] = []
        self.started = self.ended = False
        try:
            if log.get("mlflow"):
                self.trackers.append(MLflowTracker(str(log["mlflow"]), self.group))
            if log.get("wandb"):
                wdir = log.get("wandb_dir")
                self.trackers.append(
                    WandbTracker(Path(wdir).expanduser().resolve() if wdir else run_dir, self.group)
                )
        except BaseException:
            self.end("FAILED")  # one opened before the other failed
            raise

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def call(self, tracker: Tracker, what: str, fn: Any, *args: Any) -> None:
        """One tool's call; a failure is reported and that tool left off (metrics.jsonl and
        TensorBoard go on)."""
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - tracking must not stop a run
            print(
                f"[feddb] WARNING: {tracker.tool} tracking failed ({what}: {err!r}); "
                "it is off for the rest of this run",
                flush=True,
            )
            self.trackers.remove(tracker)
            with suppress(Exception):
                tracker.end("FAILED")

    def start(self, resumed_from: int | None) -> None:
        self.started = True
        ids_file = self.run_dir / IDS_FILE
        previous = json.loads(ids_file.read_text()) if ids_file.is_file() else {}
        info = RunInfo(
            name=self.run_dir.name,
            group=self.group,
            params=flatten(self.cfg),
            tags=run_tags(self.cfg, self.run_dir),
            run_dir=self.run_dir,
            resumed_from=resumed_from,
        )
        ids = dict(previous) if resumed_from is not None else {}
        for tracker in list(self.trackers):
            info.previous = previous.get(tracker.tool, {})

            def start(t: Tracker = tracker) -> None:
                ids[t.tool] = t.start(info)
                print(f"[feddb] tracking: {t.where()}", flush=True)

            self.call(tracker, "start", start)
        if ids:
            ids_file.write_text(json.dumps(ids, indent=2))

    def log_round(self, record: RoundMetrics, resumed_from: int | None) -> None:
        if not self.trackers or self.ended:
            return
        if not self.started:
            self.start(resumed_from)
        metrics = round_metrics(record, self.cfg["fl"]["num_clients"])
        for tracker in list(self.trackers):
            self.call(tracker, "metrics", tracker.log_metrics, metrics, record.round)

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end: summary.json's figures, the files, status FINISHED."""
        if not self.started or self.ended:
            return
        metrics = {f"summary/{k}": v for k, v in scalars(summary).items()}
        files = [self.run_dir / name for name in ARTIFACTS if (self.run_dir / name).is_file()]
        files += sorted(self.run_dir.glob("*.png"))
        step = int(summary.get("rounds") or 0)
        for tracker in list(self.trackers):
            self.call(tracker, "summary", tracker.log_summary, metrics, step)
            if tracker in self.trackers:
                self.call(tracker, "files", tracker.log_files, files)
        self.end("FINISHED")

    def close(self, complete: bool) -> None:
        """RoundRecorder.close (in the ServerApp's `finally`): a run that stopped before its last
        round, or that an exception is leaving, ends now, FAILED (KILLED on Ctrl-C); a complete
        one waits for `finish` (the summary is written after), or ends FAILED at exit if that
        never comes."""
        if self.ended or not self.trackers:
            return
        error = sys.exc_info()[1]  # what the `finally` is passing on, if anything
        if complete and error is None and self.started:
            atexit.register(self.end, "FAILED")
            return
        self.end("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")

    def end(self, status: str) -> None:
        if self.ended:
            return
        self.ended = True
        atexit.unregister(self.end)
        for tracker in self.trackers:
            try:
                tracker.end(status)
            except Exception as err:  # noqa: BLE001 - the others still end
                print(f"[feddb] WARNING: {tracker.tool} did not end its run: {err!r}", flush=True)


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 0.1}} -> {"train.lr": 0.1}; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def scalars(obj: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers (booleans as 0/1) of a record, nested keys joined by '/'; lists and
    strings are left out."""
    out: dict[str, float] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, (bool, int, float)) and math.isfinite(value):
            out[name] = float(value)
    return out


def round_metrics(record: RoundMetrics, num_clients: int) -> dict[str, float]:
    """A metrics.jsonl record as tracked metrics (the round is the step)."""
    out = scalars({k: v for k, v in record.to_dict().items() if k not in ("round", "clients")})
    for key in ("loss_sup", "loss_unsup"):
        values = [c[key] for c in record.clients if isinstance(c.get(key), (int, float))]
        if values and all(math.isfinite(v) for v in values):
            out[f"train/{key}"] = float(sum(values) / len(values))
    weights = (record.dma or {}).get("weights") or []
    if len(weights) == len(record.clients):  # in the clients' order (by partition id)
        width = len(str(max(num_clients - 1, 0)))
        for c, w in zip(record.clients, weights):
            if math.isfinite(w):
                out[f"dma_weight/client_{c['partition_id']:0{width}d}"] = float(w)
    return out


def run_tags(cfg: dict[str, Any], run_dir: Path) -> dict[str, str]:
    """method, dataset, partition (as in run directory names: dirichlet0.3, or the Flower
    Datasets partitioner's name), seed, commit."""
    tags = {
        "method": str(cfg.get("method", {}).get("name", "")),
        "dataset": str(cfg.get("dataset", {}).get("name", "")),
        "partition": partition_label(cfg["partition"]),
        "seed": str(cfg.get("seed", "")),
    }
    try:
        commit = json.loads((run_dir / "provenance.json").read_text()).get("commit")
    except (OSError, ValueError):
        commit = None
    if commit:
        tags["commit"] = str(commit)
    return tags
