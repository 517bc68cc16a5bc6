"""Deployment on Flower's SuperLink + SuperNodes, secure by default (TLS + SuperNode authentication).

    feddb deploy certs  --out deploy/certs --hosts localhost,127.0.0.1,myhost
    feddb deploy keys   --out deploy/keys --count 3
    feddb deploy export --out deploy/data --run-config "overrides='fl.num_clients=3'"
    feddb deploy local  --nodes 3 --workdir deploy --run-config "..."
    feddb deploy local  --nodes 6 --churn 7 --run-config "num-server-rounds=20 ..."  # churn soak

`certs` makes a CA and a server certificate for the given host names and addresses; `keys` makes one
ECDSA P-384 key pair (OpenSSH format) per SuperNode; `export` writes one data file per client (only
its own data) from the configured dataset and partition; `local` does all of that and runs a whole
deployment on this machine (one SuperLink, N SuperNodes as separate processes, `flwr run` against
it), then stops every process it started. `--insecure` turns TLS and authentication off.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from feddb.launch import (
    PROJECT,
    absolute_paths,
    add_run_config,
    completed,
    format_run_config,
    free_port,
    lean_app,
    one_run_config,
    parse_run_config,
)
from fssl.config import interrupted_exit
from fssl.profiling import TOKEN_VAR, interruptible, marked, stop
from server_app.rounds import FAILED_EXIT, FAILURE, SKIPPED_EXIT, skipped_in


# -- credentials -------------------------------------------------------------------------------
def make_certs(out: Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("feddb-flower CA"))
        .issuer_name(name("feddb-flower CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(pem))
    files["cert"].write_bytes(cert.public_bytes(pem))
    files["key"].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files["key"].chmod(0o600)
    return files


def make_keys(out: Path, count: int, prefix: str = "supernode") -> list[Path]:
    """ECDSA P-384 key pairs in OpenSSH format: `<prefix>_<i>` (private) and `.pub`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out.mkdir(parents=True, exist_ok=True)
    private = []
    for i in range(count):
        key = ec.generate_private_key(ec.SECP384R1())
        path = out / f"{prefix}_{i}"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)
        path.with_suffix(".pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        )
        private.append(path)
    return private


def export_data(run_config: dict, out: Path) -> list[Path]:
    """One file per client holding only its own data (the simulation's partition)."""
    from fssl.data import write_client_files
    from fssl.runtime import dataset_for, partition_for
    from server_app.config import resolve

    cfg, _ = resolve(run_config)
    part = partition_for(cfg)
    return write_client_files(dataset_for(cfg), part.labeled, part.unlabeled, out)


# -- a whole deployment on this machine ---------------------------------------------------------
def flwr_bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _flwr(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [flwr_bin("flwr"), *args], cwd=PROJECT, env=env, text=True, capture_output=True, check=False
    )


def json_of(text: str) -> dict:
    return json.loads(text[text.find("{") :])


STALE_AFTER_RESTART = 150.0  # seconds without a new round after a SuperLink restart


class LocalDeployment:
    """One SuperLink and SuperNodes as separate processes on loopback, all stopped by `close`."""

    def __init__(self, workdir: Path, insecure: bool = False, state_db: bool = False) -> None:
        """`state_db`: the SuperLink keeps its state in a file, which a restarted SuperLink
        carries on from; in memory otherwise (measured: half the SuperLink's CPU time, a 2-round
        deployment of 3 nodes 84 s -> 66 s on 2 cores)."""
        self.workdir, self.insecure, self.state_db = workdir.resolve(), insecure, state_db
        self.env = dict(os.environ, FLWR_HOME=str(self.workdir / "cli-home"))
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env.get("PATH", "")
        self.port = free_port()
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        # in every node's environment, which Flower passes on to what it starts (SuperExecs, app
        # processes, those in sessions of their own included): `close` stops what carries it
        self.token = self.env[TOKEN_VAR] = uuid.uuid4().hex
        self.node_extra = ""  # node_config every SuperNode gets (allow-methods for a user's)
        self.certs = (
            None if insecure else make_certs(self.workdir / "certs", ["localhost", "127.0.0.1"])
        )

    def _start(self, name: str, cmd: list[str], env_extra: dict | None = None) -> subprocess.Popen:
        env = dict(self.env, FLWR_HOME=str(self.workdir / f"home-{name}"), **(env_extra or {}))
        proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stderr=subprocess.STDOUT,
            stdout=open(self.logs / f"{name}.log", "a"),  # noqa: SIM115 - open while the node runs (a restarted one appends)
        )
        self.procs[name] = proc
        return proc

    def start_superlink(self) -> None:
        cmd = [
            flwr_bin("flower-superlink"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-runtime-dependency-installation",
        ]
        connection: dict = {"address": f"127.0.0.1:{self.port}"}
        if self.insecure:
            cmd.append("--insecure")
            connection["insecure"] = True
        else:
            c = self.certs
            cmd += [
                "--ssl-ca-certfile",
                str(c["ca"]),
                "--ssl-certfile",
                str(c["cert"]),
                "--ssl-keyfile",
                str(c["key"]),
                "--enable-supernode-auth",
            ]
            connection["root-certificates"] = str(c["ca"])
        if self.state_db:  # runs, registered nodes: a restarted SuperLink carries on from them
            cmd += ["--database", str(self.workdir / "superlink-state.db")]
        self.superlink_cmd = cmd
        home = self.workdir / "cli-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in connection.items())
        )
        self._start("superlink", cmd)
        _wait_for_port(self.port)

    def restart_superlink(self) -> None:
        """Kill the SuperLink (a crash: no clean shutdown) and start it again on the same port,
        certificates and state database."""
        if not self.state_db:
            raise RuntimeError("a SuperLink restart needs the state database (state_db=True)")
        self.crash("superlink")
        self.restarts = getattr(self, "restarts", 0) + 1
        self._start(f"superlink_restart{self.restarts}", self.superlink_cmd)
        self.procs["superlink"] = self.procs.pop(f"superlink_restart{self.restarts}")
        _wait_for_port(self.port)

    def register(self, key: Path) -> None:
        reg = _flwr(["supernode", "register", str(key.with_suffix(".pub")), "deploy"], self.env)
        if reg.returncode != 0:
            raise RuntimeError(f"registering {key.name}.pub failed:\n{reg.stdout}{reg.stderr}")

    def start_supernode(
        self,
        pid: int,
        num: int,
        data_file: Path | None,
        key: Path | None,
        extra_config: str = "",
        env_extra: dict | None = None,
        patient: bool = False,
    ) -> subprocess.Popen:
        """`extra_config`/`env_extra`: more node_config and environment (the attack test).
        `patient`: a node restarted during a run keeps trying to connect for up to 3 min (the
        SuperLink refuses an authenticated node's key until it has expired the node's old
        session, 2 x 30 s of missed heartbeats), where a first start gives up after 60 s
        without the SuperLink: enough to outlast its restart (three tries, 3 s, were not: a
        node gave up while the restarted SuperLink was still starting)."""
        extra = " ".join(e for e in (self.node_extra, extra_config) if e)
        node_config = f"partition-id={pid} num-partitions={num}" + (f" {extra}" if extra else "")
        if data_file is not None:
            node_config += f" data-path='{data_file}'"
        cmd = [
            flwr_bin("flower-supernode"),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(free_port()),
            "--node-config",
            node_config,
            "--max-wait-time",
            "180" if patient else "60",
        ]
        if self.insecure:
            cmd.append("--insecure")
        else:
            cmd += [
                "--root-certificates",
                str(self.certs["ca"]),
                "--auth-supernode-private-key",
                str(key),
            ]
        if "OMP_NUM_THREADS" not in os.environ:  # the nodes share this machine: each its share
            cores = len(os.sched_getaffinity(0))  # of the cores (fssl.runtime.cpu_threads)
            env_extra = {"OMP_NUM_THREADS": str(max(1, cores // num)), **(env_extra or {})}
        return self._start(f"supernode_{pid}", cmd, env_extra)

    def submit(self, run_config: dict) -> int:
        """`flwr run` of the project on this deployment's SuperLink; the FAB is built from a lean
        copy of the project (feddb.launch.lean_app: the same FAB without walking .venv)."""
        with tempfile.TemporaryDirectory(prefix="feddb-app-") as stage:
            cmd = ["run", str(lean_app(PROJECT, Path(stage))), "deploy", "--format", "json"]
            if run_config:
                cmd += ["--run-config", format_run_config(run_config)]
            started = _flwr(cmd, self.env)
        try:
            return int(json_of(started.stdout)["run-id"])
        except (ValueError, KeyError) as err:
            raise RuntimeError(
                f"`flwr run` did not start:\n{started.stdout}{started.stderr}"
            ) from err

    def follow(
        self,
        run_id: int,
        kill_node_after: float | None = None,
        kill_after_round: tuple[int, Path] | None = None,
        restart_after_round: tuple[int, Path] | None = None,
    ) -> dict:
        """Wait until the run ends, optionally killing SuperNode 0 after a delay or once the run's
        metrics.jsonl holds a given round (failure drills); print its log. A streaming `flwr log`
        ends with the run: asking `flwr ls` every 2 s cost a core-second a call, taken from the
        SuperNodes; `flwr ls` now confirms the end, checks every 30 s in case the stream broke
        off, and every 2 s once it has."""
        t0 = checked = time.monotonic()
        stale = None  # (restart time, metrics file, its rounds then) after a SuperLink restart
        stream = subprocess.Popen(
            [flwr_bin("flwr"), "log", str(run_id), "deploy", "--stream"],
            cwd=PROJECT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while True:
                time.sleep(0.5)
                now = time.monotonic()
                due = kill_node_after is not None and now - t0 > kill_node_after
                if kill_after_round is not None:
                    rounds, metrics = kill_after_round
                    due = metrics.is_file() and len(metrics.read_text().splitlines()) >= rounds
                if due:
                    self.crash("supernode_0")
                    print("killed SuperNode 0 (partition 0)", flush=True)
                    kill_node_after = kill_after_round = None
                if restart_after_round is not None:
                    rounds, metrics = restart_after_round
                    if metrics.is_file() and len(metrics.read_text().splitlines()) >= rounds:
                        self.restart_superlink()
                        print(f"restarted the SuperLink after round {rounds}", flush=True)
                        restart_after_round = None
                        checked = 0.0  # the log stream broke off with it: ask `flwr ls`
                        stale = (now, metrics, len(metrics.read_text().splitlines()))
                if stale is not None and now - stale[0] > STALE_AFTER_RESTART:
                    if len(stale[1].read_text().splitlines()) == stale[2]:
                        # its ServerApp died with the old SuperLink and nothing marked the run
                        # failed (seen under load): stop it, for the caller's resume path
                        _flwr(["stop", str(run_id), "deploy"], self.env)
                        return {
                            "status": f"stale: no round {STALE_AFTER_RESTART:.0f} s after "
                            "the SuperLink's restart"
                        }
                    stale = None
                streaming = stream.poll() is None
                if now - checked < (30.0 if streaming else 2.0):
                    continue
                checked = now
                run = self.run_status(run_id)
                if run is not None and str(run.get("status", "")).startswith("finished"):
                    log = _flwr(["log", str(run_id), "deploy", "--show"], self.env)
                    print(log.stdout, flush=True)
                    return run
        finally:
            if stream.poll() is None:
                stream.terminate()
                try:
                    stream.wait(5)
                except subprocess.TimeoutExpired:
                    stream.kill()
                    stream.wait()

    def run_status(self, run_id: int) -> dict | None:
        """The run's entry in `flwr ls`, None when the SuperLink did not answer."""
        listed = _flwr(["ls", "deploy", "--run-id", str(run_id), "--format", "json"], self.env)
        try:
            return json_of(listed.stdout)["runs"][0]
        except (ValueError, KeyError, IndexError):
            return None

    def crash(self, name: str) -> None:
        """SIGKILL the process `name` and reap it. A SuperNode takes every process it started
        with it (its SuperExec, ClientApp processes, resident worker: each carries the node's
        FLWR_HOME), as a machine that crashes does: killed alone, a node left them behind (its
        SuperExec lived on for minutes, its ClientApp processes and resident worker, 600 MB,
        longer), and a churn soak piled up orphans that took the cores the live nodes needed.
        The SuperLink goes alone: its ServerApp may outlive it (the restart drill)."""
        self.procs[name].kill()
        for _ in range(2 if name.startswith("supernode") else 0):  # again: a child started late
            for pid in marked(str(self.workdir / f"home-{name}"), "FLWR_HOME"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.procs[name].wait()

    def close(self) -> None:
        """Stop the nodes, then what they started (SuperExecs, app processes). Those end by
        themselves once their parent is gone, but a parent killed and not yet reaped still exists
        for them, and a node that exited early (refused, crashed) may have left its SuperExec
        behind: so reap the nodes, and stop every process left that carries this deployment's
        token in its environment."""
        running = [p for p in self.procs.values() if p.poll() is None]
        stop([p.pid for p in running])
        for p in running:
            p.wait()
        stop(marked(self.token), grace=5.0)


def run_local(args: argparse.Namespace, run_config: dict) -> int:
    """`deploy local`: credentials, client data files, SuperLink, `--nodes` SuperNodes and
    `flwr run`; exit code. `--churn`: a seed; SuperNodes are then killed and restarted at
    random times (Churn)."""
    every, down = span(args.churn_every, "--churn-every"), span(args.churn_down, "--churn-down")
    churn_burst = burst(args.churn_burst, args.nodes)
    nodes, out = args.nodes, run_config.get("output-dir")
    restart_after = args.restart_superlink_after_round
    watched = (args.kill_node_after_round, args.churn_after_round, restart_after)
    problem = drill_refused(watched, run_config, nodes)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    data_files = export_data(run_config, args.workdir / "data")
    dep = LocalDeployment(args.workdir, args.insecure, args.state_db or restart_after is not None)
    chaos = None
    method = str(run_config.get("method", ""))
    if ":" in method:  # a user's method by path: these nodes are the user's own
        dep.node_extra = f"allow-methods='{method}'"

    def at_round(n: int | None) -> tuple[int, Path] | None:  # a drill's round and where it shows
        return None if n is None else (n, Path(out or ".") / "metrics.jsonl")

    try:
        keys = start_nodes(dep, nodes, data_files, args.insecure)
        run_id = dep.submit(run_config)
        print(f"run {run_id} submitted to the SuperLink on 127.0.0.1:{dep.port}", flush=True)
        if args.churn is not None:
            chaos = Churn(
                dep,
                nodes,
                data_files,
                keys,
                args.churn,
                dep.workdir / "churn.jsonl",
                every,
                down,
                burst=churn_burst,
                max_kills=args.churn_kills,
                after_round=at_round(args.churn_after_round),
            )
            chaos.start()
        status = dep.follow(
            run_id,
            args.kill_node_after,
            at_round(args.kill_node_after_round),
            at_round(restart_after),
        )
        if getattr(dep, "restarts", 0) > 0 and status.get("status") != "finished:completed":
            # the ServerApp did not outlive its SuperLink: the documented way on, a run that
            # resumes from the ServerApp's last checkpoint on the same SuperNodes
            print(
                f"run {run_id} ended as {status.get('status')} with its SuperLink; resuming it "
                f"from its checkpoint: resume='{out}'",
                flush=True,
            )
            run_id = dep.submit({"resume": out})
            status = dep.follow(run_id)
        if chaos is not None:
            print(chaos.stop(), flush=True)
        return run_exit(run_id, status, out)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if chaos is not None:  # no node restarted behind `close`
            chaos.done.set()
            chaos.thread.join(30)
        dep.close()


def drill_refused(watched: tuple, run_config: dict, nodes: int) -> str | None:
    """Why `deploy local` cannot start, before any file is written: a drill that watches the
    rounds without output-dir, or --nodes other than the configuration's clients; or None."""
    flags = ("--kill-node-after-round", "--churn-after-round", "--restart-superlink-after-round")
    for flag, value in zip(flags, watched):
        if value is not None and not run_config.get("output-dir"):
            return (
                f"{flag} needs output-dir in --run-config (where the run's metrics.jsonl "
                "is watched), e.g. output-dir='runs/drill'"
            )
    from server_app.config import resolve

    clients = resolve(run_config)[0]["fl"]["num_clients"]
    if clients != nodes:
        return (
            f"the configuration has {clients} clients (fl.num_clients) but --nodes "
            f"{nodes}: add overrides='fl.num_clients={nodes}' to --run-config, or start "
            f"--nodes {clients}"
        )
    return None


def start_nodes(dep: LocalDeployment, nodes: int, data_files: list[Path], insecure: bool):
    """The SuperLink, the nodes' keys registered (unless insecure), and the SuperNodes."""
    dep.start_superlink()
    keys = [] if insecure else make_keys(dep.workdir / "keys", nodes)
    for key in keys:
        dep.register(key)
    for i in range(nodes):
        dep.start_supernode(i, nodes, data_files[i], None if insecure else keys[i])
    return keys


def run_exit(run_id: int, status: dict, out: str | None) -> int:
    """The exit code of a followed run, as `feddb run` gives it (3 failed, 4 rounds skipped)."""
    failure = Path(out or ".") / FAILURE
    if status.get("status") != "finished:completed" and failure.is_file():
        reason = json.loads(failure.read_text()).get("reason", "")
        print(f"error: run failed: {reason}", file=sys.stderr)
        return FAILED_EXIT
    if not completed(run_id, status):
        return 1
    note = skipped_in(out)  # exit 4: read where the run is known
    print(f"run {run_id}: {status['status']}" + (f"; {note}" if note else ""), flush=True)
    return SKIPPED_EXIT if note else 0


def span(text: str, flag: str, low: float = 0, high: float | None = None, unit=float):
    """`A,B` (seconds, or with `unit=int` whole numbers of nodes), low <= A <= B (<= high);
    ValueError naming the flag otherwise."""
    what = "numbers of seconds" if unit is float else "whole numbers of nodes"
    try:
        a, b = (unit(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} takes two {what}, A,B (got {text!r})") from None
    if not low <= a <= b or (high is not None and b > high):
        bound = "" if high is None else f" <= {high}"
        raise ValueError(f"{flag} {text}: needs {low} <= A <= B{bound}")
    return a, b


def burst(text: str | None, nodes: int) -> tuple[int, int]:
    """--churn-burst: `A,B` nodes, 1 <= A <= B <= nodes; None: one to three, at most all."""
    if text is None:
        return 1, max(1, min(3, nodes))
    return span(text, "--churn-burst", low=1, high=nodes, unit=int)


class Churn:
    """SuperNodes leaving and joining at random (seeded) times while a run goes on: every
    `every` seconds (drawn uniformly) `burst` running nodes (a number drawn uniformly) are killed
    at once, and come back `down` seconds later with the same keys and data files (machines that
    crashed and rebooted); the ServerApp binds a partition whose node came back under a new id
    before a round (server_app.nodes.RejoinedNodes).
    Each event, and the resident memory of the SuperLink and the SuperNodes (sampled every 2 s,
    written every 30 s), go to `log` (JSON lines); `stop` returns a one-line summary."""

    RETRY = 10.0  # seconds before a refused node is started again
    MEMORY_EVERY = 30.0  # seconds between memory lines in the log

    def __init__(
        self,
        dep: LocalDeployment,
        nodes: int,
        data_files: list[Path],
        keys: list[Path],
        seed: int,
        log: Path,
        every: tuple[float, float] = (30.0, 90.0),
        down: tuple[float, float] = (4.0, 12.0),
        burst: tuple[int, int] = (1, 3),
        max_kills: int | None = None,
        after_round: tuple[int, Path] | None = None,
    ) -> None:
        import random
        import threading

        self.dep, self.nodes, self.data_files, self.keys = dep, nodes, data_files, keys
        self.rng, self.every, self.downtime, self.burst = random.Random(seed), every, down, burst
        self.log, self.done = log, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.kills, self.restarts, self.peak, self.first = 0, 0, {}, {}
        self.next_memory = 0.0
        self.restarted: set[int] = set()
        self.down: set[int] = set()  # killed and not yet due back: not readmitted meanwhile
        self.next_try: dict[int, float] = {}  # a refused node: when to start it again
        self.max_kills, self.after_round = max_kills, after_round

    def start(self) -> None:
        self.log.write_text("")
        self.t0 = time.monotonic()
        self.thread.start()

    def note(self, **event) -> None:
        with open(self.log, "a") as f:
            f.write(json.dumps({"t": round(time.monotonic() - self.t0, 1), **event}) + "\n")

    def rss(self) -> dict[str, float]:
        out = {}
        for name, proc in list(self.dep.procs.items()):  # the SuperLink may be restarted
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) / 1024
            except OSError:
                continue
        return out

    def sample(self) -> None:
        """Peaks every 2 s; every `MEMORY_EVERY` s a line with each process's memory, whether
        it stays bounded over a long soak."""
        now = self.rss()
        for name, mb in now.items():
            self.first.setdefault(name, mb)
            self.peak[name] = max(self.peak.get(name, 0.0), mb)
        if time.monotonic() >= self.next_memory:
            self.next_memory = time.monotonic() + self.MEMORY_EVERY
            self.note(event="memory", rss_mb={k: round(v) for k, v in sorted(now.items())})

    def wait(self, seconds: float) -> bool:
        """Sample memory, and start again a restarted node the SuperLink turned away, while
        waiting; True when the run ended meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sample()
            self.readmit()
            if self.done.wait(min(2.0, max(0.0, deadline - time.monotonic()))):
                return True
        return False

    def readmit(self) -> None:
        """A restarted authenticated node is refused ("Failed to activate SuperNode"; it exits)
        until the SuperLink has expired its old session (2 x 30 s of missed heartbeats): start
        it again `RETRY` s after it exits, as a service manager would, until it is let in (a
        node started every 2 s for that minute took most of a 2-core machine)."""
        now = time.monotonic()
        for i in sorted(self.restarted - self.down):
            proc = self.dep.procs.get(f"supernode_{i}")
            if proc is None or proc.poll() is None:
                continue
            due = self.next_try.setdefault(i, now + self.RETRY)
            if now >= due:
                del self.next_try[i]
                self.start_node(i)
                self.note(event="restart", node=i, after_exit=proc.returncode)

    def start_node(self, i: int) -> None:
        key = self.keys[i] if self.keys else None
        self.dep.start_supernode(i, self.nodes, self.data_files[i], key, patient=True)
        self.restarted.add(i)

    def recorded(self) -> int:
        """Rounds the run has recorded so far (lines of its metrics.jsonl)."""
        try:
            return len(self.after_round[1].read_text().splitlines())
        except OSError:
            return 0

    def loop(self) -> None:
        # `after_round`: no kill before round N is recorded, so that a short drill does not
        # depend on how long this machine takes to start the run
        while self.after_round is not None and self.recorded() < self.after_round[0]:
            if self.wait(1.0):
                return
        while not self.wait(self.rng.uniform(*self.every)):
            if self.max_kills is not None and self.kills >= self.max_kills:
                self.wait(1e9)  # memory is still sampled until the run ends
                break
            count = self.rng.randint(*self.burst)
            if self.max_kills is not None:
                count = min(count, self.max_kills - self.kills)
            victims = sorted(self.rng.sample(range(self.nodes), min(count, self.nodes)))
            for i in victims:
                self.dep.crash(f"supernode_{i}")
                self.down.add(i)
                self.next_try.pop(i, None)
                self.kills += 1
                self.note(event="kill", node=i)
            if self.wait(self.rng.uniform(*self.downtime)):
                break
            for i in victims:
                self.down.discard(i)
                self.start_node(i)
                self.restarts += 1
                self.note(event="restart", node=i)

    def stop(self) -> str:
        self.done.set()
        self.thread.join(10)
        link = self.peak.get("superlink", 0.0)
        nodes = [v for k, v in self.peak.items() if k.startswith("supernode")]
        self.note(event="end", peak_rss_mb=self.peak, first_rss_mb=self.first)
        return (
            f"churn: {self.kills} SuperNode kills, {self.restarts} restarts ({self.log}); peak "
            f"resident memory: SuperLink {link:.0f} MB (at start "
            f"{self.first.get('superlink', 0.0):.0f}), a SuperNode {max(nodes, default=0):.0f} MB"
        )


def _wait_for_port(port: int, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the SuperLink did not open port {port} within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    with interruptible():  # Ctrl-C, SIGTERM, SIGHUP: unwind through `close`, then one line
        try:
            return command(argv)
        except KeyboardInterrupt as err:
            given = sys.argv[1:] if argv is None else argv
            texts = [b for a, b in zip(given, given[1:]) if a == "--run-config"]
            out = absolute_paths(parse_run_config(texts[0])).get("output-dir") if texts else None
            return interrupted_exit(err, out, ["feddb", "deploy", *given])


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("certs", help="CA + server certificate")
    c.add_argument("--out", type=Path, required=True, help="directory for the files")
    c.add_argument(
        "--hosts",
        default="localhost,127.0.0.1",
        help="comma-separated host names and IP addresses of the SuperLink",
    )
    k = sub.add_parser("keys", help="SuperNode key pairs")
    k.add_argument("--out", type=Path, required=True, help="directory for the key pairs")
    k.add_argument("--count", type=int, required=True, help="key pairs, one per SuperNode (>= 1)")
    e = sub.add_parser("export", help="one data file per client")
    e.add_argument("--out", type=Path, required=True, help="directory for the clients' files")
    add_run_config(e)
    local_arguments(sub.add_parser("local", help="a whole deployment on this machine"))
    return ap


def local_arguments(lo: argparse.ArgumentParser) -> None:
    """`deploy local`'s options: the deployment, its run, and the failure drills."""
    lo.add_argument(
        "--nodes",
        type=int,
        required=True,
        help="SuperNodes to start: one per client (fl.num_clients)",
    )
    lo.add_argument(
        "--workdir",
        type=Path,
        default=PROJECT / "deploy",
        help="where certificates, keys, data files and logs go (default: deploy/)",
    )
    add_run_config(lo)
    lo.add_argument("--insecure", action="store_true", help="no TLS, no node authentication")
    lo.add_argument(
        "--kill-node-after",
        type=float,
        default=None,
        help="kill SuperNode 0 this many seconds after submitting (failure drill)",
    )
    lo.add_argument(
        "--kill-node-after-round",
        type=int,
        default=None,
        metavar="N",
        help="kill SuperNode 0 once round N is recorded (failure drill; needs "
        "output-dir in --run-config)",
    )
    lo.add_argument(
        "--churn",
        type=int,
        default=None,
        metavar="SEED",
        help="every 30-90 s kill 1-3 random SuperNodes at once and restart them 4-12 s later, "
        "drawn from SEED; events and memory in <workdir>/churn.jsonl (the soak: --nodes 6, 20+ "
        "rounds)",
    )
    lo.add_argument(
        "--churn-every",
        default="30,90",
        metavar="A,B",
        help="seconds between kills, drawn in [A, B]",
    )
    lo.add_argument(
        "--churn-burst",
        default=None,
        metavar="A,B",
        help="nodes killed at once, drawn in [A, B] (default 1,3, or 1,N with fewer nodes)",
    )
    lo.add_argument(
        "--churn-down", default="4,12", metavar="A,B", help="seconds a killed node stays down"
    )
    lo.add_argument("--churn-kills", type=int, default=None, help="at most this many kills")
    lo.add_argument(
        "--churn-after-round",
        type=int,
        default=None,
        metavar="N",
        help="no kill before round N is recorded (needs output-dir in --run-config)",
    )
    lo.add_argument(
        "--restart-superlink-after-round",
        type=int,
        default=None,
        metavar="N",
        help="kill the SuperLink once round N is recorded and start it again on its state "
        "database; a run that did not survive it is resumed from its checkpoint (drill; needs "
        "output-dir in --run-config; implies --state-db)",
    )
    lo.add_argument(
        "--state-db",
        action="store_true",
        help="keep the SuperLink's state in <workdir>/superlink-state.db, so that a SuperLink "
        "started again on it carries on (default: in memory, which costs it half the CPU time)",
    )


def refused(args: argparse.Namespace, hosts: list[str]) -> str | None:
    """What is wrong with the command line before anything starts, in one line; or None."""
    if args.cmd == "certs" and not hosts:
        return "--hosts names no host: give the SuperLink's names or addresses"
    if args.cmd == "local" and args.nodes < 1:
        return f"--nodes {args.nodes}: start at least one SuperNode"
    if args.cmd in ("certs", "keys", "export") and args.out.exists() and not args.out.is_dir():
        return f"--out {args.out} is a file; choose a directory"
    if args.cmd == "keys" and args.count < 1:
        return f"--count {args.count}: make at least one key pair"
    return None


def command(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    hosts = [h.strip() for h in getattr(args, "hosts", "").split(",") if h.strip()]
    problem = refused(args, hosts)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.cmd == "certs":
        files = make_certs(args.out, hosts)
        print("\n".join(f"{k}: {v}" for k, v in files.items()))
        return 0
    if args.cmd == "keys":
        for key in make_keys(args.out, args.count):
            print(f"{key} (public: {key.with_suffix('.pub')})")
        return 0
    from fssl.checks import ConfigError
    from fssl.data import DataError

    try:
        run_config = absolute_paths(parse_run_config(one_run_config(args.run_config)))
        if args.cmd == "export":
            for file in export_data(run_config, args.out):
                print(file)
            return 0
        return run_local(args, run_config)
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
