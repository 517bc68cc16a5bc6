"""A deployment round beside Flower's own floor, in one call: `feddb overhead --deployment`.

One SuperLink and N SuperNodes on this machine, TLS and SuperNode authentication on (as `feddb
deploy local`), run three apps in turn on the same nodes, every node every round:
- Flower's floor: a ServerApp/ClientApp pair that only sends the model's arrays to the nodes and
  has them echoed back (feddb/overhead.py's echo pair);
- the project with a null trainer (`train.local_epochs=0`): everything but the training;
- the project training (the `quick` preset's client);
then, on a second deployment of the same nodes started with `resident=false`, the null trainer
again, each message doing its work in the process Flower starts for it (client_app/resident.py).
It prints seconds per round of each (the first rounds, cold starts, left out), the project's
round over the floor, and where the project's round goes: the ClientApp's own work (its set-up:
configuration, model, received state and data; training; the reply), and the rest, which is the
ClientApp process Flower starts for every message, its imports, and the messages themselves.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path

import numpy as np

NULL = "train.local_epochs=0"  # the null trainer: no step, only the pass that gives APP-U
SKIP = 2  # rounds left out of the means: the SuperNodes' first ClientApp processes, caches


def submit_app(dep, app: Path, run_config: str) -> int:
    """`flwr run <app> deploy` against the deployment's SuperLink; the run id."""
    import subprocess

    from .deploy import _bin, _json

    res = subprocess.run(
        [_bin("flwr"), "run", str(app), "deploy", "--format", "json", "--run-config", run_config],
        cwd=app,
        env=dep.env,
        text=True,
        capture_output=True,
        check=False,
    )
    try:
        return int(_json(res.stdout)["run-id"])
    except (ValueError, KeyError) as err:
        raise RuntimeError(f"`flwr run` of {app} did not start:\n{res.stdout}{res.stderr}") from err


def finished(dep, run_id: int, what: str) -> None:
    status = dep.follow(run_id)
    if status.get("status") != "finished:completed":
        raise RuntimeError(f"the {what} run ended as {status.get('status')}")


def project_rounds(dep, nodes: int, rounds: int, out: Path, extra: str) -> list[dict]:
    overrides = f"fl.num_clients={nodes} fl.fraction_train=1.0 fl.node_wait=60 {extra}".strip()
    rc = {"num-server-rounds": rounds, "output-dir": str(out), "overrides": overrides}
    finished(dep, dep.submit(rc), f"project ({extra or 'training'})")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def where(records: list[dict]) -> dict[str, float]:
    """Mean seconds of the project's rounds after SKIP: the round, the slowest client's own
    set-up, training and reply, and the rest (process start, imports, messages)."""
    rs = records[SKIP:]
    own = []
    for r in rs:
        cs = r.get("clients", [])
        own.append(
            max(
                (
                    (c.get("setup_seconds") or 0)
                    + (c.get("train_seconds") or 0)
                    + (c.get("reply_seconds") or 0)
                    for c in cs
                ),
                default=0.0,
            )
        )
    parts = {
        key: float(np.mean([max((c.get(key) or 0) for c in r.get("clients", [{}])) for r in rs]))
        for key in ("setup_seconds", "train_seconds", "reply_seconds")
    }
    round_s = float(np.mean([r["round_seconds"] for r in rs]))
    return {"round": round_s, **parts, "rest": round_s - float(np.mean(own))}


def measure(nodes: int, rounds: int, workdir: Path, resident: bool = True, all_apps: bool = True):
    """One deployment's rounds: Flower's echo floor, the project's null trainer and its training
    (`all_apps`), or the null trainer alone; `resident=False` starts the nodes with
    `resident=false` (each message does its work in the process Flower starts for it)."""
    from .deploy import LocalDeployment, export_data, make_keys
    from .overhead import FLOOR_APP, FLOOR_PYPROJECT, model_shapes

    rc_data = {"overrides": f"fl.num_clients={nodes} fl.fraction_train=1.0"}
    data_files = export_data(rc_data, workdir / "data")
    dep = LocalDeployment(workdir)
    dep.node_extra = "" if resident else "resident=false"
    res: dict = {"nodes": nodes, "rounds": rounds}
    try:
        dep.start_superlink()
        keys = make_keys(dep.workdir / "keys", nodes)
        for key in keys:
            dep.register(key)
        for i in range(nodes):
            dep.start_supernode(i, nodes, data_files[i], keys[i])
        if all_apps:
            app = workdir / "floor"
            app.mkdir(exist_ok=True)
            (app / "pyproject.toml").write_text(textwrap.dedent(FLOOR_PYPROJECT))
            (app / "floorapp.py").write_text(FLOOR_APP.format(nodes=nodes, per_round=nodes))
            out = workdir / "floor.json"
            rc = f"rounds={rounds} out='{out}' shapes='{json.dumps(model_shapes())}'"
            finished(dep, submit_app(dep, app, rc), "floor")
            res["floor"] = float(np.mean(json.loads(out.read_text())[SKIP:]))
        res["null"] = where(project_rounds(dep, nodes, rounds, workdir / "null", NULL))
        if all_apps:
            res["training"] = where(project_rounds(dep, nodes, rounds, workdir / "trained", ""))
    finally:
        dep.close()
    return res


def report(res: dict) -> str:
    fl, null, tr = res["floor"], res["null"], res["training"]
    own = res.get("null_own_process")
    lines = [
        f"{res['nodes']} authenticated TLS SuperNodes on this machine, every node every round, "
        f"{res['rounds']} rounds (the first {SKIP} left out):",
        f"  Flower's floor (echo pair):       {fl:6.2f} s a round",
        f"  the project, null trainer:        {null['round']:6.2f} s a round "
        f"({null['round'] / fl:.2f}x the floor)",
        f"  the project, training:            {tr['round']:6.2f} s a round "
        f"({tr['round'] / fl:.2f}x the floor)",
    ]
    if own is not None:
        lines.append(
            f"  null trainer, resident=false:     {own['round']:6.2f} s a round "
            f"({own['round'] / fl:.2f}x the floor; each message's work in its own process)"
        )
    lines.append(
        "  the project's round beyond the floor (null trainer): "
        f"{null['round'] - fl:+.2f} s; its slowest ClientApp's set-up {null['setup_seconds']:.2f} s, "
        f"training {null['train_seconds']:.2f} s, reply {null['reply_seconds']:.2f} s; the rest "
        f"(ClientApp process start, imports, relay, messages) {null['rest']:.2f} s"
    )
    return "\n".join(lines)


def main(nodes: int, rounds: int, out: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="feddb-deploy-overhead-") as tmp:
        try:
            res = measure(nodes, rounds, Path(tmp) / "resident")
            own = measure(nodes, rounds, Path(tmp) / "own", resident=False, all_apps=False)
            res["null_own_process"] = own["null"]
        except RuntimeError as err:
            print(f"error: {err}")
            return 1
    print(report(res))
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    return 0
