"""Sweeps on Hydra multirun: each combination of row (method + switches) x dataset x partition x seed
is one Flower simulation through the launcher (conf/sweeps/config.yaml says how; presets in
conf/sweeps/sweep/). The sweep has its own config root so that `dataset=`, `partition=` and
`experiment=` are plain values here, not the training configuration's groups.

    feddb sweep -m sweep=mnist_miniature
    feddb sweep --jobs auto -m sweep=mnist_miniature     # runs side by side, one per core
    feddb sweep -m row=fedavg,feddb seed=0,1,2 out=runs/mine run_config="num-server-rounds=20"

A complete run (summary.json with every round) is skipped, an interrupted one resumed from its
checkpoint (started again where its clients' kept state cannot be given back: `resumable`), a
failed one recorded in <out>/sweep_status.jsonl; at the end the sweep lists what it
ran, skipped and failed (with each failure's log) and exits 1 if anything failed. `--jobs N` runs
N at once (Hydra's joblib launcher, each with cores / N CPU threads; the results do not depend on
N, tested); `--mps` shares a GPU under NVIDIA's MPS (docs/speed.md: the fastest paper sweep).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from feddb.launch import parse_run_config
from feddb.rows import table
from fssl.config import sweep_warmup_note
from fssl.methods import lost_client_state
from fssl.profiling import interruptible, marked, stop
from fssl.runtime import cores
from server_app.rounds import FAILURE, SKIPPED_EXIT

PROJECT = Path(__file__).resolve().parents[1]
STATUS = "sweep_status.jsonl"


def rows() -> dict[str, str]:
    """Row name -> run-config, from the one table of runs (feddb/rows.py): every method of
    conf/method/ by its name, then every row of conf/comparison/*.yaml."""
    return {name: row.run_config() for name, row in table().items()}


def section_rows(section: str) -> str:
    """`row: ${rows:<section>}` in a preset: the rows of that section of conf/comparison/."""
    names = [name for name, row in table().items() if row.section == section]
    if not names:
        raise ValueError(f"no section '{section}' in conf/comparison/*.yaml")
    return ",".join(names)


OmegaConf.register_new_resolver("rows", section_rows, replace=True)


def is_method_path(row: str) -> bool:
    """A row that is a user's method by path (`/abs/file.py:Class`, `pkg.module:Class`)."""
    return ":" in row


def row_config(row: str) -> str | None:
    """A row's run-config: a named row's, or a method by path's; None for an unknown row."""
    return f"method='{row}'" if is_method_path(row) else rows().get(row)


def row_dir(row: str) -> str:
    """A row's directory name: its own, or for a method by path its class name and a short hash
    of the path (two files may hold classes of one name)."""
    if not is_method_path(row):
        return row
    digest = hashlib.sha1(row.encode()).hexdigest()[:6]
    return f"{row.rpartition(':')[2]}-{digest}"


def run_dir_of(cfg: Any, asked: dict[str, Any] | None = None) -> Path:
    """<out>/<dataset>_<partition>/<row>[@<key>=<value>]/s<seed>; with mismatch=beside, a run asked
    with other settings than the one there goes beside it, named by a hash of its request."""
    value = cfg.get("value")
    tuned = "" if value is None else f"@{str(cfg.tune).rpartition('.')[2]}={value}"
    seed = f"s{cfg.seed}"
    if asked is not None:
        seed += "+" + hashlib.sha1(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:8]
    return (
        Path(str(cfg.out)).resolve()
        / f"{cfg.dataset}_{cfg.partition}"
        / (row_dir(str(cfg.row)) + tuned)
        / seed
    )


def complete(run_dir: Path) -> bool:
    """summary.json written, every configured round in metrics.jsonl, and no round that
    trained no client (failure.json)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        rounds = yaml.safe_load((run_dir / "config.yaml").read_text())["num_rounds"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return summary.get("rounds") == rounds and not (run_dir / FAILURE).is_file()


def join_overrides(row: str, extra: str) -> tuple[str, str]:
    """A row's run-config and the sweep's `run_config` with one `overrides` key between them:
    Flower refuses a key given twice, and a row may bring overrides of its own (fixmatch-uniform).
    The sweep's follow the row's (the later wins on a common key), e.g.
    `run_config="overrides='logging.mlflow=runs/mlflow logging.group=mine'"`, which groups the
    sweep's tracked runs. Anything that does not parse is left to the launcher to report."""
    if "overrides" not in row or "overrides" not in extra:
        return row, extra
    try:
        from feddb.launch import format_run_config, parse_run_config

        theirs, ours = parse_run_config(row), parse_run_config(extra)
    except Exception:  # noqa: BLE001 - the launcher says what is wrong with it
        return row, extra
    if "overrides" not in theirs or "overrides" not in ours:
        return row, extra
    ours["overrides"] = f"{theirs.pop('overrides')} {ours['overrides']}"
    return format_run_config(theirs), format_run_config(ours)


def with_value(extra: str, key: str, value: Any) -> str:
    """The sweep's run-config with `<key>=<value>` last among its overrides (it wins)."""
    if value is None:
        return extra
    part = f"overrides='{key}={value}'"
    if not extra.strip():
        return part
    first, second = join_overrides(extra, part)
    return f"{first} {second}".strip()


def request_of(run_config: str) -> dict[str, Any]:
    """A run-config as its run records it (run_config.json): every key, paths absolute."""
    from feddb.launch import absolute_paths, parse_run_config
    from fssl.config import run_config_defaults

    return run_config_defaults() | absolute_paths(parse_run_config(run_config))


def differences(run_dir: Path, asked: dict[str, Any]) -> list[str]:
    """How the run in run_dir was asked otherwise than this combination asks ([]: the same)."""
    from fssl.config import run_config_defaults
    from fssl.identity import asked_otherwise

    file = run_dir / "run_config.json"
    try:
        saved = json.loads(file.read_text())
    except (OSError, ValueError):
        return [f"{file.name} unreadable"]
    return asked_otherwise(saved, asked, run_config_defaults())


def resumable(run_dir: Path, in_process: bool) -> bool:
    """Whether an interrupted run can go on from its checkpoint as if never stopped. What its
    clients keep between rounds (train.optimizer_state=client, a method's estimates or own
    state) lives on the nodes: only a checkpoint written in process holds it, and only an
    in-process launcher gives it back (fssl/methods: lost_client_state). Else the run starts
    again; its partial directory is kept beside it as <run>.interrupted (the previous one
    replaced)."""
    from fssl import checkpoint

    config = run_dir / "config.yaml"
    if not config.is_file():
        return True
    try:
        cfg = yaml.safe_load(config.read_text()) or {}
        lost = lost_client_state(cfg, lambda: checkpoint.load(run_dir)[1], in_process)
    except Exception:  # noqa: BLE001 - an unreadable record or checkpoint: start again
        lost = "unreadable"
    if lost is None:
        return True
    set_aside(run_dir, ".interrupted")
    return False


def set_aside(run_dir: Path, suffix: str) -> Path:
    """Move a run directory that will be run again to <run><suffix> (replacing an older one)."""
    kept = run_dir.with_name(run_dir.name + suffix)
    shutil.rmtree(kept, ignore_errors=True)
    run_dir.rename(kept)
    return kept


def run_one(cfg: Any) -> dict[str, Any]:
    """Run (or skip, or resume) one combination; returns its status record."""
    config = row_config(str(cfg.row))
    if config is None:
        return {
            **status_record(cfg, run_dir_of(cfg)),
            "status": "failed",
            "reason": f"unknown row '{cfg.row}'; choose from {', '.join(rows())}",
        }
    fresh = fresh_run_config(cfg, config)
    try:
        asked = request_of(fresh)
    except ValueError:  # the launcher says what is wrong with it
        asked = None
    run_dir = run_dir_of(cfg)
    differ = (
        differences(run_dir, asked) if asked and (run_dir / "run_config.json").is_file() else []
    )
    if differ and str(cfg.mismatch) == "beside":
        run_dir = run_dir_of(cfg, asked)
        differ = differences(run_dir, asked) if (run_dir / "run_config.json").is_file() else []
    record = status_record(cfg, run_dir)
    if differ:
        return {
            **record,
            "status": "refused",
            "reason": f"{run_dir} holds a run asked otherwise ({'; '.join(differ)}): "
            "mismatch=beside runs this one beside it, or choose another out",
        }
    if complete(run_dir):
        return {**record, "status": "skipped"}
    if (run_dir / FAILURE).is_file():  # a failed run is run again; its directory kept beside
        record["rerun_after_failure"] = str(set_aside(run_dir, ".failed"))
    interrupted = (run_dir / "config.yaml").is_file() and any(
        (run_dir / f).is_file() for f in ("checkpoint.pt", "checkpoint.prev.pt")
    )
    in_process = "feddb.inprocess" in [str(a) for a in cfg.launcher]
    if interrupted and not resumable(run_dir, in_process):
        record["restarted"], interrupted = True, False
    elif not interrupted and (run_dir / "config.yaml").is_file():  # stopped before a checkpoint
        set_aside(run_dir, ".interrupted")
        record["restarted"] = True
    if interrupted:
        run_config, record["resumed"] = f"resume='{run_dir}'", True
    else:
        run_config = f"{fresh} output-dir='{run_dir}'"
    launcher = [sys.executable if a == "python" else str(a) for a in cfg.launcher]
    cmd = [*launcher, "--run-config", run_config, *str(cfg.launcher_args).split()]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    t0 = time.perf_counter()
    with open(log, "a") as f:  # appended: an earlier sweep's log of this run is kept
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} sweep {sweep_id()}: {run_config}\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, cwd=PROJECT, stdout=f, stderr=subprocess.STDOUT, env=run_env(run_dir)
        )
        try:
            code = proc.wait()
        finally:  # interrupted: SIGTERM, and time for the launcher to stop what it started
            stop([proc.pid] if proc.poll() is None else [], grace=60.0)
    record.update(seconds=time.perf_counter() - t0, log=str(log), exit=code)
    ok = code in (0, SKIPPED_EXIT) and complete(run_dir)  # skipped rounds: in summary.json
    return {
        **record,
        "status": "done" if ok else "failed",
        **({} if ok else {"reason": f"exit {code}, see {log}"}),
    }


def status_record(cfg: Any, run_dir: Path) -> dict[str, Any]:
    names = {k: str(cfg[k]) for k in ("row", "dataset", "partition")}
    return {**names, "seed": int(cfg.seed), "run_dir": str(run_dir), "time": time.time()}


def fresh_run_config(cfg: Any, config: str) -> str:
    """The run-config of a new run of this combination (its output-dir aside): the row's, the
    setting's, the sweep's own, and the run's identity (row, selection)."""
    value = cfg.get("value")
    tuned = with_value(str(cfg.run_config), cfg.tune, value)
    row, extra = join_overrides(config, tuned)
    selection = "" if value is None else f" selection='{cfg.tune}={value}'"
    return (
        f"{row} dataset='{cfg.dataset}' partition='{cfg.partition}' "
        f"experiment='{cfg.experiment}' seed={cfg.seed} row='{cfg.row}'{selection} {extra}"
    ).strip()


def gpu_present() -> bool:
    """An NVIDIA GPU on this machine (without importing torch in the sweep's process)."""
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def auto_jobs() -> int:
    """One run per core on a CPU (one thread each: two single-thread runs on 2 cores did twice
    the work of one two-thread run); with a GPU, at most 4 runs share it. (In-process paper runs
    did best at 8 under MPS on an H200, docs/speed.md; runs through Ray size their clients' GPU
    share as if alone, so `auto` stays at 4 and `--jobs 8` is the user's explicit choice.)"""
    return min(cores(), 4) if gpu_present() else cores()


def run_env(run_dir: Path) -> dict[str, str]:
    """A run's environment under `--jobs N` (FEDDB_SWEEP_JOBS): its share of the CPU threads,
    unless the user set them, and an FLWR_HOME of its own (runs through `flwr run` each keep
    their own SuperLink)."""
    env = dict(os.environ)
    jobs = int(env.get("FEDDB_SWEEP_JOBS", "1"))
    if jobs > 1:
        threads = str(max(1, cores() // jobs))
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(key, threads)
        env.setdefault("FLWR_HOME", str(run_dir.parent / f".flwr-home-{os.getpid()}"))
    return env


def split_jobs(argv: list[str]) -> tuple[int, list[str]]:
    """`--jobs N|auto` (or `--jobs=N`) taken out of the command line; the rest goes to Hydra."""
    jobs, rest, i = "1", [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--jobs" and i + 1 < len(argv):
            jobs, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--jobs="):
            jobs = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    if jobs == "auto":
        return auto_jobs(), rest
    if not jobs.isdigit() or int(jobs) < 1:
        print(f"error: --jobs takes a number >= 1 or auto, not '{jobs}'", file=sys.stderr)
        raise SystemExit(2)
    return int(jobs), rest


def row_problem(names: list[str]) -> str | None:
    """Why the rows cannot be swept (an unknown name, a method by path that does not load), or
    None."""
    from fssl.checks import ConfigError
    from fssl.methods import method_class

    unknown = [r for r in names if not is_method_path(r) and r not in rows()]
    if unknown:
        return (
            f"unknown row(s) {unknown}; choose from conf/method/*.yaml and "
            f"conf/comparison/*.yaml, or give a method by path: {', '.join(rows())}"
        )
    for r in filter(is_method_path, names):
        try:
            method_class(r)
        except ConfigError as err:
            return f"row '{r}': {err}"
    return None


def swept_rows(params: dict[str, str], task: list[str], name: str = "row") -> list[str]:
    """The rows (values of `name`) a multirun will run: the command line's `row=` or else the
    preset's, as plain comma-separated values (none where Hydra's grammar says more: choice(...),
    range(...), quotes; Hydra resolves those, and an unknown row then fails its run)."""
    value = str(params.get(name, ""))
    for item in task:
        key, sep, val = str(item).partition("=")
        if sep and key.lstrip("+~") == name:
            value = val
    if any(c in value for c in "()[]{}'\""):
        return []
    return [r.strip() for r in value.split(",") if r.strip()]


PROGRESS: dict[str, Any] = {"total": 0, "done": 0, "ran": 0, "start": 0.0, "id": None}


def count_jobs(params: dict[str, str], task: list[str]) -> int:
    """Combinations of a simple multirun: the product of the comma-separated lists of the
    preset's sweeper params and the command line's overrides (0 when it cannot tell)."""
    values = {str(k): str(v) for k, v in params.items()}
    for item in task:
        key, sep, val = str(item).partition("=")
        if sep:
            values[key.lstrip("+~")] = val
    total = 1
    for v in values.values():
        one_quoted = len(v) > 1 and v[0] in "'\"" and v[-1] == v[0] and v.count(v[0]) == 2
        if v.startswith(("[", "{")) or one_quoted:  # one value, whatever commas it holds
            continue
        if "(" in v:  # range(), choice(), ...: not counted
            return 0
        total *= len([x for x in v.split(",") if x != ""]) or 1
    return total


def first_runs(config: Any, params: dict[str, str], task: list[str]) -> dict[str, str]:
    """Each row's run-config in the sweep's first combination (each swept key's first value)."""
    keys = ("dataset", "partition", "experiment", "seed", "run_config", "tune", "value")
    first = {k: (swept_rows(params, task, k) or [config.get(k)])[0] for k in keys}
    named = {r: c for r in swept_rows(params, task) or [str(config.row)] if (c := row_config(r))}
    return {r: fresh_run_config(OmegaConf.create({**first, "row": r}), c) for r, c in named.items()}


def eta(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def sweep_id() -> str | None:
    """This sweep's id (set at its start; inherited by the worker processes of --jobs)."""
    return os.environ.get("FEDDB_SWEEP_ID", PROGRESS.get("id"))


def this_sweeps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records this sweep wrote: another sweep into the same folder at the same time
    appends to the same status file, and its runs and failures are not ours to count."""
    return [r for r in records if r.get("sweep") == sweep_id()]


def job(cfg: Any) -> None:
    record = run_one(cfg)
    record["sweep"] = sweep_id()
    out = Path(str(cfg.out)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / STATUS, "a") as f:
        f.write(json.dumps(record) + "\n")
    # counted from the status file: under --jobs the jobs run in worker processes
    start = float(os.environ.get("FEDDB_SWEEP_START", PROGRESS["start"]))
    total = int(os.environ.get("FEDDB_SWEEP_TOTAL", PROGRESS["total"]))
    lines = (out / STATUS).read_text().splitlines()
    mine = this_sweeps(list(map(json.loads, lines)))
    done, ran = len(mine), sum(r["status"] != "skipped" for r in mine)
    progress = f"{done}/{total}" if total else f"{done}"
    if total and ran:
        progress += f", eta {eta((time.time() - start) / ran * (total - done))}"
    print(
        f"[sweep] {progress:>16s}  {record['status']:7s} {record['row']} "
        f"{record['dataset']}_{record['partition']} seed {record['seed']}"
        + (f": {record['reason']}" if "reason" in record else ""),
        flush=True,
    )


LOCK = ".sweep.lock"
HELD: list[Any] = []  # the open lock file, for as long as this sweep runs


def lock_out(out: Path) -> str | None:
    """One sweep into `out` at a time: a lock on <out>/.sweep.lock that dies with its process.
    Why not, or None when taken."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    f = open(out / LOCK, "a+")  # noqa: SIM115 - held open until the process ends
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        return (
            f"another sweep ({holder}) is writing into {out}; wait for it to end, or give "
            "this one another out="
        )
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    HELD.append(f)
    return None


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object  # type: ignore[misc,assignment]


class SweepSummary(Callback):
    """At the end of a multirun: what ran, what was skipped, what failed (exit 1 if any)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self.start = time.time()
        try:
            params = dict(config.hydra.sweeper.params or {})
            task = list(config.hydra.overrides.task)
        except Exception:  # noqa: BLE001 - progress is a nicety
            params, task = {}, []
        problem = row_problem(swept_rows(params, task))
        if str(config.get("mismatch")) not in ("refuse", "beside"):
            problem = f"mismatch={config.get('mismatch')}: choose refuse or beside"
        if "lr" in params or any(str(t).lstrip("+").startswith("lr=") for t in task):
            problem = "the sweep key lr is now value (tune=train.lr is the default): value=0.01,0.1"
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
        problem = lock_out(Path(str(config.out)).resolve())
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
        note = sweep_warmup_note(first_runs(config, params, task), parse_run_config)
        if note:  # a warning: the runs go on
            print(f"warning: {note}", file=sys.stderr, flush=True)
        new_id = f"{os.getpid()}-{self.start}"
        PROGRESS.update(total=count_jobs(params, task), done=0, ran=0, start=self.start, id=new_id)
        # inherited by the worker processes of --jobs (started after this)
        os.environ["FEDDB_SWEEP_START"] = str(self.start)
        os.environ["FEDDB_SWEEP_ID"] = new_id
        os.environ["FEDDB_SWEEP_TOTAL"] = str(PROGRESS["total"])

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        file = Path(str(config.out)).resolve() / STATUS
        records = (
            [json.loads(line) for line in file.read_text().splitlines()] if file.is_file() else []
        )
        mine = this_sweeps(records)
        kinds = ("done", "skipped", "failed", "refused")
        by = {s: [r for r in mine if r["status"] == s] for s in kinds}
        print(
            f"[sweep] {len(mine)} combinations: {len(by['done'])} run, {len(by['skipped'])} "
            f"already complete, {len(by['failed'])} failed"
            + (f", {len(by['refused'])} refused" if by["refused"] else ""),
            flush=True,
        )
        for r in by["failed"] + by["refused"]:
            print(
                f"[sweep] {r['status'].upper()} {r['row']} {r['dataset']}_{r['partition']} "
                f"seed {r['seed']}: {r['reason']}",
                flush=True,
            )
        if by["failed"] or by["refused"]:
            sys.exit(1 if by["failed"] else 2)


FREE_TEXT = ("run_config", "launcher_args")


def quote_free_text(argv: list[str]) -> list[str]:
    """`run_config=data-path='/data'` as a shell leaves it: Hydra's grammar refuses the second `=`
    and would split a comma into a sweep. The values of run_config and launcher_args are free text
    (run-config, launcher options), so they reach Hydra quoted unless the user quoted them."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        if sep and key.lstrip("+~") in FREE_TEXT and not quoted:
            arg = f'{key}="' + value.replace('"', '\\"') + '"'
        out.append(arg)
    return out


def split_mps(argv: list[str]) -> tuple[bool, list[str]]:
    """`--mps` taken out of the command line; the rest goes to Hydra."""
    return "--mps" in argv, [a for a in argv if a != "--mps"]


SWEEP_HELP = f"""usage: feddb sweep [--jobs N|auto] [--mps] -m KEY=VALUES ...

{__doc__}
The sweep's own flags (before or after Hydra's):
  --jobs N|auto   N runs at once, each with cores/N CPU threads (auto: one per core on a CPU,
                  at most 4 sharing a GPU); default 1
  --mps           run under NVIDIA's Multi-Process Service (started and stopped unless running)

Hydra's help follows; the keys (row, dataset, partition, experiment, seed, out, run_config,
tune, value, launcher, launcher_args) are in conf/sweeps/config.yaml, presets in conf/sweeps/sweep/.
"""


def main() -> None:
    import hydra

    from feddb.resources import mps

    argv = sys.argv[1:]  # as given: a sweep resumes where it stopped
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(SWEEP_HELP)  # then Hydra's own help (its flags and the sweep's keys)
    use_mps, sys.argv[1:] = split_mps(quote_free_text(sys.argv[1:]))
    jobs, sys.argv[1:] = split_jobs(sys.argv[1:])
    os.environ["FEDDB_SWEEP_JOBS"] = str(jobs)
    if jobs > 1:  # Hydra's joblib launcher plugin: N jobs at once, each in a worker process
        sys.argv[1:] = [*sys.argv[1:], "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
        print(f"[sweep] {jobs} runs at once, {max(1, cores() // jobs)} CPU thread(s) each")
    sys.path.insert(0, str(PROJECT))
    try:
        with interruptible(), mps(use_mps) as line:
            if line:
                print(f"[sweep] {line}")
            hydra.main(
                config_path=str(PROJECT / "conf" / "sweeps"),
                config_name="config",
                version_base=None,
            )(job)()
    except RuntimeError as err:
        if not str(err).startswith("--mps"):
            raise
        raise SystemExit(f"feddb sweep: {err}") from None
    except KeyboardInterrupt as err:  # the runs of --jobs' workers too: they carry the sweep's id
        stop(marked(os.environ.get("FEDDB_SWEEP_ID", "-"), "FEDDB_SWEEP_ID"), grace=60.0)
        print(f"interrupted; resume with: {shlex.join(['feddb', 'sweep', *argv])}", file=sys.stderr)
        raise SystemExit(getattr(err, "code", 130)) from None


if __name__ == "__main__":
    # run the importable module's main: Hydra instantiates SweepSummary from `feddb.sweep`, and
    # the progress it counts must be the jobs' (python -m would give two module copies)
    from feddb.sweep import main as package_main

    package_main()
