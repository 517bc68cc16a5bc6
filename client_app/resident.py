"""A deployed node's resident worker: one long-lived process per SuperNode that keeps torch, the
model and the node's data loaded, so that the process Flower starts for every message (the
ClientApp, client_app/app.py) only relays the message to it.

Flower 1.41 runs each message a SuperNode receives in a fresh `flwr-clientapp` process. Importing
torch, building the model, reading the node's data and warming the kernels took most of a
deployment round's time beyond Flower's own (docs/speed.md, "A deployment round against Flower's
floor"); a simulation pays them once per worker process. Here the first message of a node starts
the worker (`python -m client_app.resident`, from the same installed app), later ones reuse it.

- One worker per SuperNode and app: its Unix socket is named after the installed app's directory
  (the FAB's hash is in it), the process that started the ClientApp (the SuperNode's executor)
  and the node's data file, in a directory only this user can open (mode 0700).
- It lives while that process lives and at most IDLE_SECONDS between messages, then removes its
  socket; a message that finds no live worker starts one.
- Nothing crosses a network: the relay and the worker are processes of the same user on the same
  machine, and the node's TLS connection, authentication and the server's checks of its replies
  are Flower's and the project's as before. The worker runs the ClientApp's own code
  (client_app/work.py) on the same Message and Context, so a reply is the one the ClientApp would
  have made itself (tests/test_resident_worker.py); an exception in it is raised in the ClientApp.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

IDLE_SECONDS = 600.0  # a worker with no message for this long exits
START_SECONDS = 120.0  # a worker must answer within this after it is started
OFF = {"0", "false", "no", "off"}
ON = {"1", "true", "yes", "on"}
HEADER = struct.Struct("!Q")


def enabled(context: Any) -> bool:
    """A node with its own data (a deployment) uses its resident worker unless its operator set
    `--node-config "resident=false"`; a simulation's clients never do."""
    config = context.node_config
    value = str(config.get("resident", "true")).lower()
    if value not in ON | OFF:
        raise ValueError(
            f"node_config resident={config['resident']!r}: use true or false "
            '(--node-config "resident=false" does each message\'s work in its own process)'
        )
    return bool(config.get("data-path")) and value in ON


def app_root() -> Path:
    """The directory that holds client_app/: the installed app's (the FAB's) or the project's."""
    return Path(__file__).resolve().parents[1]


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"feddb-resident-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{path} must belong to this user and be closed to others (chmod 700 {path}), or "
            'start the SuperNode with --node-config "resident=false"'
        )
    return path


def socket_path(context: Any, parent: int | None = None) -> Path:
    """The worker's socket for this app, node (its executor `parent`) and data file."""
    parent = os.getppid() if parent is None else parent
    key = f"{app_root()}|{parent}|{context.node_config.get('data-path')}"
    return runtime_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.sock"


def send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(len(data)) + data)


def recv(sock: socket.socket) -> Any:
    (size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return pickle.loads(_exactly(sock, size))  # noqa: S301 - a process of this user, 0700 socket


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("the resident worker closed the connection")
        got += n
    return bytes(buf)


def connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def forward(kind: str, msg: Any, context: Any, parent: int | None = None) -> Any:
    """Have the node's worker handle the message (starting it if none answers); the reply. The
    worker's updated `context.state` (what a method keeps between rounds) comes back into
    `context`. A worker that goes away before it answers (it reached its idle limit as the
    message came) is started again, once."""
    path = socket_path(context, parent)
    parent = os.getppid() if parent is None else parent
    try:
        ok, reply, state = ask(connect(path) or start(path, parent), (kind, msg, context))
    except ConnectionError:
        ok, reply, state = ask(start(path, parent), (kind, msg, context))
    if not ok:
        raise reply
    context.state = state
    return reply


def ask(sock: socket.socket, request: Any) -> Any:
    with sock:
        send(sock, request)
        return recv(sock)


def prestart(context: Any, parent: int | None = None) -> None:
    """Start the node's worker without waiting for it (the run's node-binding query comes before
    round 1: round 1 then finds torch, the methods and the CUDA context loaded). Nothing happens
    where a worker answers or is starting."""
    path = socket_path(context, parent)
    parent = os.getppid() if parent is None else parent
    sock = connect(path)
    if sock is not None:
        sock.close()
        return
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a message is starting it
            return
        if starting(path) is None:
            spawn(path, parent)


def start(path: Path, parent: int) -> socket.socket:
    """Start the worker for `path`, or wait for the one starting (one at a time: a lock beside
    the socket, the starting worker's pid in a file beside it), and connect."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = connect(path)  # another message started it while this one waited
        if sock is not None:
            return sock
        pid = starting(path)
        proc = spawn(path, parent) if pid is None else None
        pid = proc.pid if proc is not None else pid
        log = path.with_suffix(".log")
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            sock = connect(path)
            if sock is not None:
                return sock
            if (proc.poll() is not None) if proc is not None else not alive(pid):
                code = proc.returncode if proc is not None else "unknown"
                raise RuntimeError(
                    f"the node's resident worker exited with code {code} before it answered; "
                    f"its log: {log}"
                )
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        raise TimeoutError(f"the node's resident worker did not answer in {START_SECONDS:.0f} s")


def spawn(path: Path, parent: int) -> subprocess.Popen:
    """The worker process for `path`, its pid written beside the socket (the caller holds the
    lock)."""
    root = str(app_root())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with open(path.with_suffix(".log"), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "client_app.resident", str(path), str(parent)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # outlives this message's process
        )
    path.with_suffix(".pid").write_text(str(proc.pid))
    return proc


def starting(path: Path) -> int | None:
    """The pid of a worker started for `path` that is still alive (it may not answer yet)."""
    try:
        pid = int(path.with_suffix(".pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: os.kill's answer
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def serve(path: Path, parent: int, idle: float = IDLE_SECONDS) -> None:
    """The worker: answer messages on `path` one at a time while `parent` lives and messages come
    at most `idle` seconds apart; then remove the socket."""
    from client_app import work  # torch, the methods: once for the node's life

    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(8)
    server.settimeout(1.0)
    last = time.monotonic()
    try:
        while alive(parent) and time.monotonic() - last < idle:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                answer(conn, work.HANDLERS)
            last = time.monotonic()
    finally:
        server.close()
        path.with_suffix(".pid").unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)
        log = path.with_suffix(".log")
        if log.exists() and log.stat().st_size == 0:  # a log with something in it stays
            log.unlink()
        path.unlink(missing_ok=True)  # last: a socket gone means the worker has cleaned up


def answer(conn: socket.socket, handlers: dict) -> None:
    try:
        kind, msg, context = recv(conn)
    except (ConnectionError, EOFError, pickle.UnpicklingError):
        return
    try:
        out = (True, handlers[kind](msg, context), context.state)
    except Exception as err:  # noqa: BLE001 - raised again in the ClientApp
        traceback.print_exc()
        try:
            pickle.dumps(err)
        except Exception:  # noqa: BLE001 - an exception that cannot cross as itself
            err = RuntimeError(f"{type(err).__name__}: {err}")
        out = (False, err, None)
    with contextlib.suppress(OSError):  # the ClientApp is gone (Flower stopped it)
        send(conn, out)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
