"""A deployment round beside Flower's own floor, in one call: `feddb overhead --deployment`.

One SuperLink and N SuperNodes on this machine, TLS and SuperNode authentication on (as `feddb
deploy local`), run on the same nodes, every node every round, one after another:
- Flower's floor: a ServerApp/ClientApp pair that only sends the model's arrays to the nodes and
  has them echoed back (benchmarks/overhead.py's echo pair);
- the project with the null trainer (benchmarks/nulltrainer.py, loaded by path: no step and no pass
  over the data) and the global model evaluated only after the last round: the project's
  framework alone;
- the floor and the null trainer again (pairs taken in turn, so that a drift of this machine's
  speed shows as a difference between the pairs, not between the apps);
- the project without a step (`train.local_epochs=0`: the APP-U pass over the client's images and
  the central evaluation every round, the computation a round of the method needs besides
  training), then training (the default method's client, the default data).
It prints seconds per round of each (the first rounds, cold starts, and the project's last round,
its final evaluation, left out), the null trainer's round over the floor per pair, and where the
project's round goes: the process Flower starts for every message (its start and imports, as the
ClientApp reports them), the relay to the node's resident worker, the work's own set-up
(configuration, model, received state and data), training and reply, and the rest: Flower's
message path, TLS, and the server's checks, aggregation and recording.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from benchmarks.echofloor import FLOOR_APP, FLOOR_PYPROJECT, model_shapes
from benchmarks.nulltrainer import SPEC as NULL_TRAINER

NULL = "eval.every=1000000"  # with method=NULL_TRAINER: the model evaluated after the last round
NO_STEP = "train.local_epochs=0"  # no step, but the APP-U pass and the evaluation every round
SKIP = 2  # rounds left out of the means: the SuperNodes' first ClientApp processes, caches
PAIRS = 2  # floor and null trainer, taken in turn


def submit_app(dep, app: Path, run_config: str) -> int:
    """`flwr run <app> deploy` against the deployment's SuperLink; the run id."""
    import subprocess

    from feddb.deploy import flwr_bin, json_of

    res = subprocess.run(
        [
            flwr_bin("flwr"),
            "run",
            str(app),
            "deploy",
            "--format",
            "json",
            "--run-config",
            run_config,
        ],
        cwd=app,
        env=dep.env,
        text=True,
        capture_output=True,
        check=False,
    )
    try:
        return int(json_of(res.stdout)["run-id"])
    except (ValueError, KeyError) as err:
        raise RuntimeError(f"`flwr run` of {app} did not start:\n{res.stdout}{res.stderr}") from err


def finished(dep, run_id: int, what: str) -> None:
    status = dep.follow(run_id)
    if status.get("status") != "finished:completed":
        raise RuntimeError(f"the {what} run ended as {status.get('status')}")


def project_rounds(dep, nodes: int, rounds: int, out: Path, kind: str) -> list[dict]:
    """The project's rounds: `null` (the null trainer), `no_step` (the default method without a
    step: its APP-U pass and the central evaluation every round) or `training`."""
    overrides = f"fl.num_clients={nodes} fl.fraction_train=1.0 fl.node_wait=60"
    rc = {"num-server-rounds": rounds, "output-dir": str(out), "overrides": overrides}
    if kind == "null":
        rc.update(method=NULL_TRAINER, overrides=f"{overrides} {NULL}")
    elif kind == "no_step":
        rc.update(overrides=f"{overrides} {NO_STEP}")
    finished(dep, dep.submit(rc), f"project ({kind})")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


PARTS = ("process_seconds", "relay_seconds", "setup_seconds", "train_seconds", "reply_seconds")


def where(records: list[dict]) -> dict[str, float]:
    """Mean seconds of the project's rounds after SKIP and before the last (its final
    evaluation): the round; the slowest client's message process (its start and imports), relay
    to its resident worker, set-up, training and reply (each the round's largest); and the rest
    (Flower's message path, TLS, the server's checks, aggregation and recording)."""
    rs = records[SKIP:-1]
    own = [
        max(
            (sum((c.get(key) or 0) for key in PARTS) for c in r.get("clients", [])),
            default=0.0,
        )
        for r in rs
    ]
    parts = {
        key: float(np.mean([max((c.get(key) or 0) for c in r.get("clients", [{}])) for r in rs]))
        for key in PARTS
    }
    round_s = float(np.mean([r["round_seconds"] for r in rs]))
    return {"round": round_s, **parts, "rest": round_s - float(np.mean(own))}


def floor_rounds(dep, nodes: int, rounds: int, workdir: Path, k: int) -> float:
    """Mean seconds of the echo pair's rounds after SKIP."""
    app = workdir / "floor"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(textwrap.dedent(FLOOR_PYPROJECT))
    (app / "floorapp.py").write_text(FLOOR_APP.format(nodes=nodes, per_round=nodes))
    out = workdir / f"floor{k}.json"
    rc = f"rounds={rounds} out='{out}' shapes='{json.dumps(model_shapes())}'"
    finished(dep, submit_app(dep, app, rc), "floor")
    return float(np.mean(json.loads(out.read_text())[SKIP:]))


def measure(nodes: int, rounds: int, workdir: Path) -> dict:
    """One deployment: PAIRS of (Flower's echo floor, the null trainer), then the project
    without a step and training."""
    from feddb.deploy import LocalDeployment, export_data, make_keys

    rc_data = {"overrides": f"fl.num_clients={nodes} fl.fraction_train=1.0"}
    data_files = export_data(rc_data, workdir / "data")
    dep = LocalDeployment(workdir)
    dep.node_extra = f"allow-methods='{NULL_TRAINER}'"
    res: dict = {"nodes": nodes, "rounds": rounds, "pairs": []}
    try:
        dep.start_superlink()
        keys = make_keys(dep.workdir / "keys", nodes)
        for key in keys:
            dep.register(key)
        for i in range(nodes):
            dep.start_supernode(i, nodes, data_files[i], keys[i])
        for k in range(PAIRS):
            floor = floor_rounds(dep, nodes, rounds, workdir, k)
            null = where(project_rounds(dep, nodes, rounds, workdir / f"null{k}", "null"))
            res["pairs"].append({"floor": floor, "null": null})
        res["no_step"] = where(project_rounds(dep, nodes, rounds, workdir / "nostep", "no_step"))
        res["training"] = where(project_rounds(dep, nodes, rounds, workdir / "trained", "training"))
    finally:
        dep.close()
    res["floor"] = float(np.mean([p["floor"] for p in res["pairs"]]))
    res["null"] = {
        key: float(np.mean([p["null"][key] for p in res["pairs"]]))
        for key in res["pairs"][0]["null"]
    }
    return res


def report(res: dict) -> str:
    fl, null, tr = res["floor"], res["null"], res["training"]
    pairs = ", ".join(f"{p['null']['round'] / p['floor']:.2f}x" for p in res["pairs"])
    lines = [
        f"{res['nodes']} authenticated TLS SuperNodes on this machine, every node every round, "
        f"{res['rounds']} rounds (the first {SKIP} and the project's last left out), "
        f"{len(res['pairs'])} pairs in turn:",
        f"  Flower's floor (echo pair):       {fl:6.2f} s a round",
        f"  the project, null trainer:        {null['round']:6.2f} s a round "
        f"({null['round'] / fl:.2f}x the floor; pair by pair {pairs})",
        f"  the project, no step:             {res['no_step']['round']:6.2f} s a round "
        f"({res['no_step']['round'] / fl:.2f}x the floor; train.local_epochs=0: the APP-U "
        "pass and the evaluation every round)",
        f"  the project, training:            {tr['round']:6.2f} s a round "
        f"({tr['round'] / fl:.2f}x the floor)",
        "  the project's round beyond the floor (null trainer): "
        f"{null['round'] - fl:+.2f} s. Its slowest client's message process (start and imports) "
        f"{null.get('process_seconds', 0):.2f} s, relay to the resident worker "
        f"{null.get('relay_seconds', 0):.2f} s, set-up {null['setup_seconds']:.2f} s, training "
        f"{null['train_seconds']:.2f} s, reply {null['reply_seconds']:.2f} s; the rest (Flower's "
        f"message path, TLS, the server's checks, aggregation, recording) {null['rest']:.2f} s",
    ]
    return "\n".join(lines)


def table(res: dict) -> str:
    """The four apps' seconds a round against Flower's floor, as markdown (printed, and rendered
    into docs/speed.md by `feddb tables` from the --out file)."""
    fl = res["floor"]
    pairs = ", ".join(f"{p['null']['round'] / p['floor']:.2f}×" for p in res["pairs"])
    rows = [
        ("Flower's floor: the model's arrays echoed back", fl, "1.00×"),
        (
            "the project, null trainer (`benchmarks/nulltrainer.py`), resident workers",
            res["null"]["round"],
            f"**{res['null']['round'] / fl:.2f}×** (pairs {pairs})",
        ),
        (
            "the project without a step (`train.local_epochs=0`: the APP-U pass, evaluation "
            "every round)",
            res["no_step"]["round"],
            f"{res['no_step']['round'] / fl:.2f}×",
        ),
        (
            "the project training (the default method and data)",
            res["training"]["round"],
            f"{res['training']['round'] / fl:.2f}×",
        ),
    ]
    return "\n".join(
        ["| app | seconds a round | over the floor |", "|---|---|---|"]
        + [f"| {app} | {sec:.2f} | {ratio} |" for app, sec, ratio in rows]
    )


def main(nodes: int, rounds: int, out: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="feddb-deploy-overhead-") as tmp:
        try:
            res = measure(nodes, rounds, Path(tmp))
        except RuntimeError as err:
            print(f"error: {err}")
            return 1
    print(report(res) + "\n\n" + table(res))
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    return 0
