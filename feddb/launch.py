"""Launch a simulation the safe way: `feddb run --run-config "method='fixmatch'"`.

What plain `flwr run .` does not do, this does:
- validates the configuration (and finds the data) before anything starts;
- sizes the federation from `fl.num_clients` (`num-supernodes`) and the client resources;
- uses a Flower home of its own (.flwr-home/run-<pid>-<port>, removed after the run) and free
  ports, so neither a stale SuperLink from elsewhere nor another run's is ever reused, disables Flower's runtime dependency installation, and stops the SuperLink it
  started (by pid) at the end;
- exits non-zero when the run did not finish as `finished:completed` (`flwr run` exits 0 anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from feddb.resources import RayHead, free_port, mps, ray_head
from fssl.config import interrupted_exit
from fssl.profiling import interruptible, stop, superlink_pids

PROJECT = Path(__file__).resolve().parents[1]


def parse_run_config(text: str) -> dict:
    """Parse `--run-config "k1=v1 k2=v2"` as Flower does and reject keys the app does not have."""
    import click
    from flwr.common.config import parse_config_args

    problem = bad_item(text) if text else ""
    if problem:  # (Flower drops a bare word silently and fails on the rest with a traceback)
        raise ValueError(f"run-config {text!r}: {problem}")
    try:
        values = parse_config_args([text]) if text else {}
    except click.ClickException as err:
        raise ValueError(f"run-config {text!r}: {err.format_message()}") from None
    with open(PROJECT / "pyproject.toml", "rb") as f:
        known = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown run-config key(s) {unknown}; allowed: {', '.join(known)}")
    return values


ITEM = re.compile(r"""([^\s=]+)=('[^']*'|"(?:[^"\\]|\\.)*"|[^\s'"]\S*|)(?=\s|$)|(\S+)""")


def bad_item(text: str) -> str:
    """The first `key=value` of a run-config that Flower cannot read, and how to write it."""
    import click
    from flwr.common.config import parse_config_args

    for m in ITEM.finditer(text):
        key, value, stray = m.groups()
        if stray is not None:
            return f"{stray!r} is not key=value (quote a value with spaces: key='a b')"
        if value == "":
            return f"{key} has no value (write {key}='' for an empty string)"
        try:
            parse_config_args([f"{key}={value}"])
        except click.ClickException:
            return (
                f"the value of {key} is not a TOML value: quote a string ({key}='{value}'), or "
                "write true/false or a number"
            )
    return ""


PATH_KEYS = ("output-dir", "resume", "data-path")


def absolute_paths(values: dict) -> dict:
    """Relative paths are meant from where the user stands, not from the SuperLink's directory."""
    out = dict(values)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = str(Path(out[key]).expanduser().resolve())
    method = out.get("method")
    if isinstance(method, str) and ".py:" in method:  # a user's method by file
        where, _, cls = method.rpartition(":")
        out["method"] = f"{Path(where).expanduser().resolve()}:{cls}"
    return out


def format_run_config(values: dict) -> str:
    """Back to Flower's `k1=v1 k2=v2` form (TOML values; strings as literal strings)."""

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f"'{v}'" if "'" not in v else '"' + v.replace('"', '\\"') + '"'
        return str(v)

    return " ".join(f"{k}={value(v)}" for k, v in values.items())


SKIP_DIRS = (".git", ".venv", ".flwr", "__pycache__")  # never in a FAB (Flower's rules)


def lean_app(app: Path, stage: Path) -> Path:
    """A copy of the app directory without the directories that Flower's FAB leaves out anyway
    (those ignored by the app's .gitignore, and .git, .venv, __pycache__). `flwr run` lists and
    resolves every file under the app directory before it filters them: with the virtual
    environment inside the project (`make`'s .venv, about 50,000 files) that took 5-9 s of every
    start-up here. The FAB built from the copy is the same, byte for byte (tested)."""
    from pathspec import PathSpec

    ignore = app / ".gitignore"
    spec = PathSpec.from_lines(
        "gitignore", ignore.read_text().splitlines() if ignore.is_file() else []
    )
    for root, dirs, files in os.walk(app):
        rel = Path(root).relative_to(app)
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not spec.match_file((rel / d).as_posix() + "/")
            and not (Path(root) / d).is_symlink()
        ]
        (stage / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            src = Path(root) / name
            if not src.is_symlink():  # Flower skips symlinks too
                shutil.copyfile(src, stage / rel / name)
    return stage


def flwr_exe() -> str:
    """The environment's own `flwr` first, else the one on PATH."""
    exe = Path(sys.executable).with_name("flwr")
    return str(exe) if exe.exists() else shutil.which("flwr") or "flwr"


def flwr(args: list[str], env: dict, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [flwr_exe(), *args], cwd=PROJECT, env=env, text=True, capture_output=capture, check=False
    )


ROUND = re.compile(
    r"\[feddb\] round +(\d+)/(\d+) +test acc ([0-9.]+)(?:.*val acc ([0-9.]+))?"
    r".*eta (\S+)"
)
KEEP = ("[feddb]", "Traceback", "Error", "error:", "Exception")
# Ray lines that KEEP would show (they say "RpcError") but that report no failure: with Ray
# installed without its dashboard extra (`ray[default]`, not a dependency here), the dashboard
# agent runs no gRPC server, so a GCS and a raylet told the agent's port explicitly (`ray start
# --dashboard-agent-grpc-port`) give up on exporting Ray's own metrics after 30 s and log it as an
# error; the run is unaffected. Exactly these two messages are hidden (--verbose shows them).
RAY_BENIGN = re.compile(
    r"\((?:gcs_server|raylet)\) \w+\.cc:\d+: Failed to establish connection to the "
    r"(?:event\+)?metrics exporter agent\. (?:Events and metrics|Metrics) will not be exported\. "
    r"Exporter agent status: RpcError: Running out of retries to initialize the metrics agent\."
)


def shown(line: str) -> bool:
    """Whether a line of the run's log is shown without --verbose: the project's own lines and
    anything that looks like an error, less Ray's known-benign RAY_BENIGN lines."""
    return any(k in line for k in KEEP) and not RAY_BENIGN.search(line)


def progress_bar(line: str, width: int = 24) -> str | None:
    """`[#####-----] round 12/40  test 91.2 %  val 90.8 %  eta 1m20s` for a round line."""
    m = ROUND.search(line)
    if not m:
        return None
    t, n = int(m.group(1)), int(m.group(2))
    fill = round(width * t / max(n, 1))
    val = f"  val {100 * float(m.group(4)):.1f} %" if m.group(4) else ""
    return (
        f"[{'#' * fill}{'-' * (width - fill)}] round {t}/{n}  test "
        f"{100 * float(m.group(3)):.1f} %{val}  eta {m.group(5)}"
    )


def follow_log(run_id: int, env: dict, verbose: bool, procs: list) -> None:
    """Stream the run's log: everything with --verbose; otherwise the project's own lines (and
    errors), the rounds as one progress bar on a terminal and as lines elsewhere. The `flwr log`
    process goes into `procs`, to be stopped before the SuperLink (else it starts a new one)."""
    proc = subprocess.Popen(
        [flwr_exe(), "log", str(run_id), "--stream"],
        cwd=PROJECT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    procs.append(proc)
    tty, bar_open = sys.stdout.isatty(), False
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if "[feddb] round" in line:
            STARTED.set()
        for marker, found in ((RUN_FAILED, FAILED), (RUN_SKIPPED, SKIPPED), (" run_dir=", RUN_DIR)):
            if marker in line:
                found.append(line[line.find(marker) + len(marker) :].strip())
        if verbose:
            print(line, flush=True)
            continue
        if FAILED or not shown(line):  # after the failure line: the ServerApp's traceback
            continue
        bar = progress_bar(line) if tty else None
        if bar is not None:
            print("\r" + bar, end="", flush=True)
            bar_open = True
            continue
        if bar_open:
            print()
            bar_open = False
        print(line[line.find("[feddb]") :] if "[feddb]" in line else line, flush=True)
    if bar_open:
        print()
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_config(ap)
    ap.add_argument(
        "--cpus-per-client",
        type=int,
        default=1,
        help="CPU cores Ray reserves for each simulated client (>= 1)",
    )
    ap.add_argument(
        "--gpus-per-client",
        default="0",
        help="GPU share per simulated client, e.g. 0.25 (4 clients per GPU at a "
        "time), or auto: measured from one client round's peak GPU memory",
    )
    ap.add_argument(
        "--mps",
        action="store_true",
        help="run NVIDIA's Multi-Process Service for the run, so that clients sharing "
        "a GPU run their kernels at once (started and stopped unless running)",
    )
    ap.add_argument("--federation-config", default="", help="extra Flower federation config")
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="show Flower's and Ray's own log lines (hidden by default)",
    )
    ap.add_argument(
        "--ray-address",
        default="",
        help="attach the simulation to an existing Ray cluster (head's HOST:PORT)",
    )
    ap.add_argument(
        "--flower-ray",
        action="store_true",
        help="let Flower's simulation start Ray itself, as plain `flwr run` does, "
        "instead of a Ray head started at once beside the SuperLink (slower)",
    )
    args = ap.parse_args(argv)
    # SIGINT, SIGTERM (a sweep, a job system), SIGHUP (a closed terminal): the SuperLink and the
    # Ray head started here are stopped on the way out, then one line says how to go on
    with interruptible():
        try:
            return run_command(args)
        except KeyboardInterrupt as err:
            command = ["feddb", "run", *(sys.argv[1:] if argv is None else argv)]
            return interrupted_exit(err, RUN_DIR[-1] if RUN_DIR else None, command)


def run_command(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(PROJECT))
    from fssl.checks import ConfigError
    from fssl.data import DataError
    from fssl.profiling import process_start

    # the start-up timeline (run_dir/startup.json) counts from this launcher's start
    os.environ["FEDDB_LAUNCH_TIME"] = str(process_start() or time.time())
    # bad input is answered before any process starts (Ray, the SuperLink)
    try:
        run_config, cfg = preflight(one_run_config(args.run_config))
        gpus = gpus_per_client(args.gpus_per_client, cfg)
        if args.cpus_per_client < 1:
            raise ValueError(
                f"--cpus-per-client must be at least 1, got {args.cpus_per_client} (Ray gives "
                "each simulated client whole cores)"
            )
    except (ConfigError, DataError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Ray starts now, in the background, while the rest starts (feddb.resources.ray_head); one
    # start-up at a time on this machine (startup_lock)
    with startup_lock(), ray_head(not (args.ray_address or args.flower_ray)) as head:
        return launch(args, head, run_config, cfg, gpus)


STARTED = threading.Event()  # set when the run's first round line arrives (follow_log)
RUN_FAILED = "[feddb] run failed:"  # the ServerApp's line for a run that failed while training
FAILED: list[str] = []  # its cause, once follow_log has seen it
RUN_SKIPPED = "[feddb] rounds skipped:"  # server_app.rounds.RUN_SKIPPED: a run that exits 4
SKIPPED: list[str] = []  # how many rounds it skipped, once follow_log has seen it
RUN_DIR: list[str] = []  # the run's directory, from the ServerApp's first line (open_run_dir)


@contextlib.contextmanager
def startup_lock(bound: float = 120.0):
    """Start-ups one at a time on this machine, until the run's first round line (or `bound`
    seconds): two runs started together each got a SuperLink and a Ray head of their own, yet
    one of them failed about one time in two with Flower's "No heartbeat received from the task"
    while neither did when started 12 s apart (measured here, Flower 1.41, Ray 2.55)."""
    import fcntl

    path = Path(tempfile.gettempdir()) / "feddb-startup.lock"
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("[launch] waiting for another run's start-up on this machine", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        once = threading.Lock()

        def release() -> None:
            if once.acquire(blocking=False):  # the first caller unlocks, the other does nothing
                fcntl.flock(f, fcntl.LOCK_UN)

        threading.Thread(target=lambda: (STARTED.wait(bound), release()), daemon=True).start()
        try:
            yield
        finally:
            release()


RUN_CONFIG_HELP = (
    "Flower run-config, e.g. \"method='fixmatch' seed=1\"; given once, with every key in it"
)


def add_run_config(ap: argparse.ArgumentParser) -> None:
    """`--run-config`, collected so that a second one is refused rather than silently winning."""
    ap.add_argument("--run-config", action="append", default=[], help=RUN_CONFIG_HELP)


def one_run_config(given: list[str]) -> str:
    """The one `--run-config` given ('' for none); ValueError when it was given more than once."""
    if len(given) > 1:
        raise ValueError(
            f"--run-config given {len(given)} times ({'; '.join(given)}): put every key in one, "
            f'e.g. --run-config "{" ".join(given)}"'
        )
    return given[0] if given else ""


def preflight(text: str, in_process: bool = False) -> tuple[dict, dict]:
    """Everything that can be checked before a process starts: the run-config, the composed
    configuration, the data and the split it must give, a resume directory's checkpoint (and,
    `in_process` or not, whether it can give the nodes what they kept). Raises ConfigError,
    DataError or ValueError with one line for the user; returns the run-config (paths absolute)
    and the configuration."""
    from fssl.checks import ConfigError
    from fssl.runtime import check_data, partition_for
    from server_app.config import resolve

    run_config = absolute_paths(parse_run_config(text))
    cfg, resume_dir = resolve(run_config)
    if cfg["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "device=cuda, and this machine has no CUDA GPU that PyTorch can use: set "
                "device=auto (the GPU where there is one) or device=cpu"
            )
    check_data(cfg)  # the data loads, and the model takes its images
    partition_for(cfg)  # a split the data cannot give fails here, not after Flower starts
    if resume_dir is not None:
        from fssl import checkpoint

        if not any((resume_dir / f).is_file() for f in (checkpoint.FILE, checkpoint.PREVIOUS)):
            raise ConfigError(f"cannot resume: {resume_dir} has no checkpoint.pt yet")
        file, note = checkpoint.find(resume_dir)  # CheckpointError names the files
        if note:
            print(f"[feddb] {note}", flush=True)
        check_resume(resume_dir, cfg, file, in_process)
    return run_config, cfg


def check_resume(run_dir: Path, cfg: dict, file: Path, in_process: bool = False) -> None:
    """The run resumed is the run recorded: its configuration, its data (read afresh, not from
    this process's cache), its checkpoint's run; and what its clients keep between rounds, if
    anything, is in the checkpoint and can go back to them (in process only)."""
    from fssl import checkpoint, identity
    from fssl.checks import ConfigError
    from fssl.data import load_dataset
    from fssl.methods import lost_client_state

    identity.check_resume(run_dir, cfg, load_dataset(cfg["dataset"]))
    state = checkpoint.load(run_dir, file)[1]
    identity.check_checkpoint(run_dir, state)
    problem = lost_client_state(cfg, lambda: state, in_process)
    if problem:
        raise ConfigError(f"cannot resume {run_dir}: {problem}")


def launch(
    args: argparse.Namespace, head: RayHead | None, run_config: dict, cfg: dict, gpus: float
) -> int:
    fed = {
        "num-supernodes": cfg["fl"]["num_clients"],
        "client-resources-num-cpus": args.cpus_per_client,
    }
    if gpus > 0:
        fed["client-resources-num-gpus"] = gpus
    for item in args.federation_config.split():  # user values win
        key, _, value = item.partition("=")
        fed[key] = value
    if head is not None and head.failure():
        print(
            f"[launch] warning: {head.failure()}\n[launch] Flower's simulation starts Ray itself "
            "instead",
            flush=True,
        )
        head = None
    ray_address = args.ray_address or (head.address if head else "")
    env = {"RAY_ADDRESS": ray_address} if ray_address else {}
    # (Flower's Ray backend calls ray.init() without an address: RAY_ADDRESS, inherited from the
    # SuperLink this starts, makes it join that cluster instead of starting one.)
    try:
        with mps(args.mps) as line:
            if line:
                print(f"[launch] {line}", flush=True)
            return flwr_run(
                PROJECT,
                fed,
                format_run_config(run_config) if run_config else "",
                env,
                args.verbose,
                watch=head.watch if head else None,
            )
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def flwr_run(
    app: Path,
    fed: dict,
    run_config: str = "",
    env_extra: dict | None = None,
    verbose: bool = False,
    show: bool = True,
    watch: Callable[[], str | None] | None = None,
) -> int:
    """`flwr run app` on a local simulation federation with its own FLWR_HOME (unless one is set)
    and free ports, and no runtime dependency installation; follows the log (if `show`), checks that the
    run finished as completed and stops the SuperLink it started. 0 on success. `watch` says
    what broke (e.g. the Ray head this run depends on stopped): then the run is stopped."""
    from fssl.provenance import export_commit

    del FAILED[:], SKIPPED[:], RUN_DIR[:]
    export_commit()  # the installed app cannot see the checkout's git
    env = dict(os.environ, **(env_extra or {}))
    http_port, control_port = free_port(), free_port()
    # a Flower home of its own (the local SuperLink's database lives there), removed afterwards:
    # two runs at once, or one beside a plain `flwr run`, never share a SuperLink
    own_home = PROJECT / ".flwr-home" / f"run-{os.getpid()}-{http_port}"
    if "FLWR_HOME" not in env:
        env["FLWR_HOME"] = str(own_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")  # picks the run up at once, not
    # within Flower's default 1 s
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(http_port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(control_port)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    fed_text = " ".join(f"{k}={v}" for k, v in fed.items())
    stage = tempfile.TemporaryDirectory(prefix="feddb-app-")
    done, followers = threading.Event(), []
    cmd = [
        "run",
        str(lean_app(app, Path(stage.name))),
        "--format",
        "json",
        "--federation-config",
        fed_text,
    ]
    if run_config:
        cmd += ["--run-config", run_config]
    try:
        started = start_run(cmd, env)
        stage.cleanup()  # the SuperLink holds the FAB now
        if NO_SUPERLINK in started.stdout + started.stderr:  # Flower starts it by name
            where = f"{Path(flwr_exe()).parent} (the bin of Flower's environment)"
            print(f"error: no `flower-superlink` on PATH: put {where} on it", file=sys.stderr)
            return 2
        try:
            run_id = json.loads(started.stdout[started.stdout.find("{") :])["run-id"]
        except (ValueError, KeyError):
            err = f"error: `flwr run` did not start a run:\n{started.stdout}{started.stderr}"
            print(err, file=sys.stderr)
            return 1
        if watch is not None:
            threading.Thread(
                target=watchdog, args=(watch, done, http_port, followers), daemon=True
            ).start()
        if show:
            follow_log(run_id, env, verbose, followers)
        status = wait_for(run_id, env, follow=not show)
        from server_app.rounds import FAILED_EXIT, SKIPPED_EXIT

        if FAILED:
            print(f"error: run failed: {FAILED[0]}", file=sys.stderr)
            return FAILED_EXIT
        if not completed(run_id, status):
            return 1
        if show:
            print(f"run {run_id}: {status['status']}" + "".join(f"; {n}" for n in SKIPPED[:1]))
        return SKIPPED_EXIT if SKIPPED else 0
    finally:
        done.set()
        stage.cleanup()
        stop_run(http_port, followers)
        shutil.rmtree(own_home, ignore_errors=True)


SUPERLINK_LATE = "Failed to start local SuperLink within"
NO_SUPERLINK = "No such file or directory: 'flower-superlink'"


def start_run(cmd: list[str], env: dict, tries: int = 3) -> subprocess.CompletedProcess:
    """`flwr run`, tried again when Flower's local SuperLink missed the fixed 15 s that Flower 1.41
    gives its start-up (CI saw it on a machine loaded by two test workers). Flower has killed that
    SuperLink by then, so the next try starts a fresh one on the same free ports."""
    started = flwr(cmd, env, capture=True)
    for attempt in range(2, tries + 1):
        if SUPERLINK_LATE not in started.stdout + started.stderr:
            break
        late = "[launch] Flower's local SuperLink did not start within its 15 s (a busy machine)"
        print(f"{late}; starting it again ({attempt}/{tries})", flush=True)
        started = flwr(cmd, env, capture=True)
    return started


def stop_run(http_port: int, followers: list[subprocess.Popen]) -> None:
    """Stop the log followers first (a `flwr log` whose SuperLink is gone starts a new one),
    then the SuperLink, its SuperExec and the simulation process."""
    for p in followers:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    stop(superlink_pids(http_port))


def watchdog(
    watch: Callable[[], str | None],
    done: threading.Event,
    http_port: int,
    followers: list[subprocess.Popen],
) -> None:
    """Stop the run (so that it ends) as soon as `watch` reports a failure."""
    while not done.wait(0.5):
        failure = watch()
        if failure:
            print(
                f"error: {failure}\nerror: the run cannot go on without it; run again with "
                "--flower-ray to let Flower start Ray itself",
                file=sys.stderr,
                flush=True,
            )
            stop_run(http_port, followers)
            return


def wait_for(run_id: int, env: dict, follow: bool) -> dict:
    """The run's entry of `flwr ls` once it has finished (polled when `follow`)."""
    while True:
        listed = flwr(["ls", "--run-id", str(run_id), "--format", "json"], env, capture=True)
        try:
            run = json.loads(listed.stdout[listed.stdout.find("{") :])["runs"][0]
        except (ValueError, KeyError, IndexError):
            return {"status": "unknown", "status-details": listed.stdout[-500:]}
        if not follow or str(run.get("status", "")).startswith("finished"):
            return run
        time.sleep(1.0)


def completed(run_id: int, status: dict) -> bool:
    """Whether the run finished as completed; says how it ended where it did not."""
    if status.get("status") == "finished:completed":
        return True
    print(
        f"error: run {run_id} ended as {status.get('status')}: {status.get('status-details', '')}",
        file=sys.stderr,
    )
    return False


def gpus_per_client(value: str, cfg: dict) -> float:
    """`--gpus-per-client`: a share in [0, 1], or `auto` (feddb.resources)."""
    if value == "auto":
        from feddb.resources import auto_gpus_per_client
        from fssl.config import clients_per_round

        share, how = auto_gpus_per_client(cfg, clients_per_round(cfg))
        print(f"[launch] --gpus-per-client auto: {how}", flush=True)
        return share
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise ValueError(f"--gpus-per-client must be a number in [0, 1] or auto, got {value!r}")
    from fssl.train import resolve_device

    if share > 0 and resolve_device(cfg["device"]).type != "cuda":
        raise ValueError(
            f"--gpus-per-client {value}: this run trains on the CPU (device={cfg['device']}, no "
            "CUDA GPU here), and Ray would wait for a GPU that is not there; drop the option"
        )
    return share


if __name__ == "__main__":
    sys.exit(main())
