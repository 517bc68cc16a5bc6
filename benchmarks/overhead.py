"""Where a round's time goes when training costs nothing: `feddb overhead`.

    .venv/bin/feddb overhead                 # about 1 minute on 2 CPU cores
    .venv/bin/feddb overhead --profile       # also the top functions of the ServerApp and ClientApps
    .venv/bin/feddb overhead --eval-every 5  # the central evaluation every 5 rounds (eval.every)
    .venv/bin/feddb overhead --eval-every 20 # the plumbing alone (a simulation has no defences)
    .venv/bin/feddb overhead --defences      # with a deployment's defences (norm bound, agreement
        # filter, loss check, DMA cap: on by default on SuperNodes only)
    .venv/bin/feddb overhead --aggregation --experiment paper/cifar10_dir0.3   # no Flower: the
        # server's critical-path aggregation of 10 synthetic updates of that model (DMA, defences)
    .venv/bin/feddb overhead --deployment --nodes 3 --rounds 9   # SuperNodes with TLS: Flower's
        # echo floor and the project's null trainer in turn, then no step and training

Two real `flwr run` simulations on the same federation (20 SuperNodes, 10 sampled a round, one CPU
each, the CNN's arrays), each joining a Ray head of its own as `feddb run` does:
- the project with a null trainer (`train.local_epochs=0`): each client parses the configuration,
  loads the received state into its cached model, takes its cached data, makes the one
  pseudo-labelling pass that gives APP-U, and replies; the server configures, aggregates with DMA,
  evaluates the global model centrally (test and validation sets), writes metrics.jsonl and
  TensorBoard, and checkpoints. Its timings come from metrics.jsonl (`timing`, the clients'
  `setup_seconds`, `train_seconds`, `reply_seconds`);
- Flower's floor: a trivial ServerApp/ClientApp pair (written to a temporary directory) that only
  sends the same arrays to 10 of the 20 nodes a round through `grid.send_and_receive` and has
  them echoed back.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from benchmarks.echofloor import FLOOR_APP, FLOOR_PYPROJECT, model_shapes
from feddb.launch import PROJECT, flwr_run
from feddb.resources import ray_head

sys.path.insert(0, str(PROJECT))

NODES, PER_ROUND = 20, 10
SKIP = 2  # rounds left out of the means: Ray workers start, caches fill


def flwr_run_with_ray_head(
    app: Path,
    fed: dict,
    run_config: str = "",
    env_extra: dict | None = None,
    use_head: bool = True,
    **kwargs,
) -> int:
    """`flwr_run` with a Ray head of its own, started first, as `feddb run` runs (benchmarks);
    `use_head=False`: Flower starts Ray itself, as with `feddb run --flower-ray`."""
    with ray_head(use_head) as head:
        env = dict(env_extra or {}, **({"RAY_ADDRESS": head.address} if head else {}))
        return flwr_run(app, fed, run_config, env, watch=head.watch if head else None, **kwargs)


def federation(overrides: list[str]) -> tuple[int, int]:
    """The configured federation's nodes and clients a round."""
    from server_app.config import compose

    fl = compose(overrides)["fl"]
    return fl["num_clients"], round(fl["num_clients"] * fl["fraction_train"])


def floor(
    rounds: int,
    tmp: Path,
    shapes: dict[str, list[int]],
    use_head: bool,
    nodes: int = NODES,
    per_round: int = PER_ROUND,
) -> list[float]:
    """Seconds per round of the echo pair."""
    app = tmp / "floor"
    app.mkdir()
    (app / "pyproject.toml").write_text(textwrap.dedent(FLOOR_PYPROJECT))
    (app / "floorapp.py").write_text(FLOOR_APP.format(nodes=nodes, per_round=per_round))
    out = tmp / "floor.json"
    rc = f"rounds={rounds} out='{out}' shapes='{json.dumps(shapes)}'"
    fed = {"num-supernodes": nodes, "client-resources-num-cpus": 1}
    env = {"FLWR_HOME": str(tmp / "flwr-home-floor")}
    if flwr_run_with_ray_head(app, fed, rc, env, use_head, show=False) != 0:
        raise RuntimeError("the floor app's run failed")
    return json.loads(out.read_text())


# the defences run on SuperNodes by default, not in a simulation: this puts them in scope here
DEFENCES = "server.robust.scope=always"


def project(
    rounds: int,
    tmp: Path,
    profile: Path | None,
    use_head: bool,
    eval_every: int = 1,
    defences: bool = False,
) -> list[dict]:
    """metrics.jsonl records of the project's null-trainer run."""
    out = tmp / "project"
    overrides = (
        f"train.local_epochs=0 fl.num_clients={NODES} fl.fraction_train={PER_ROUND / NODES}"
        f" eval.every={eval_every}" + (" " + DEFENCES if defences else "")
    )
    from fssl.data import embedded_candidates

    data = next(str(c) for c in embedded_candidates() if c.is_file())  # the FAB carries no .npz
    rc = f"num-server-rounds={rounds} output-dir='{out}' data-path='{data}' overrides='{overrides}'"
    env = {"FLWR_HOME": str(tmp / "flwr-home-project")}
    if profile is not None:
        env["FEDDB_PROFILE"] = str(profile)
    fed = {"num-supernodes": NODES, "client-resources-num-cpus": 1}
    if flwr_run_with_ray_head(PROJECT, fed, rc, env, use_head, show=False) != 0:
        raise RuntimeError("the project's null-trainer run failed")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def split(records: list[dict], workers: int) -> dict[str, float]:
    """Mean seconds per round of the project's parts (after the first SKIP rounds)."""
    recs = records[SKIP:]
    mean = lambda f: float(np.mean([f(r) for r in recs]))  # noqa: E731
    clients = lambda key: mean(lambda r: sum(c.get(key) or 0.0 for c in r["clients"]))  # noqa: E731
    part = {
        k: mean(lambda r, k=k: r["timing"].get(k, 0.0))
        for k in (
            "configure",
            "communicate",
            "aggregate",
            "evaluate",
            "record_previous_round",
            "checkpoint_previous_round",
            "loss_check",
        )
    }
    part.update(
        {
            "round": mean(lambda r: r["round_seconds"]),
            "client_setup_sum": clients("setup_seconds"),
            "client_pass_sum": clients("train_seconds"),
            "client_reply_sum": clients("reply_seconds"),
            "workers": workers,
        }
    )
    part["client_pass_critical"] = part["client_pass_sum"] / workers
    part["overhead"] = part["round"] - part["client_pass_critical"]
    part["server_work"] = sum(
        part[k]
        for k in (
            "configure",
            "aggregate",
            "evaluate",
            "record_previous_round",
            "checkpoint_previous_round",
        )
    )
    return part


def top_functions(profile: Path, n: int = 12) -> dict[str, list[str]]:
    """The n functions with the most own time in the ServerApp's and the ClientApps' profiles."""
    out = {}
    for side in ("server", "client"):
        files = sorted(str(f) for f in profile.glob(f"{side}-*.prof"))
        if not files:
            continue
        stats = pstats.Stats(files[0])
        for f in files[1:]:
            stats.add(f)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:n]  # (cc, nc, tt, ct, _)
        out[side] = [
            f"{tt:7.2f} s own {ct:7.2f} s total  {Path(fn).name}:{line} {name}"
            for (fn, line, name), (_, _, tt, ct, _) in rows
        ]
    return out


def aggregation_seconds(
    overrides: list[str], clients: int = PER_ROUND, repeats: int = 7
) -> tuple[list[float], dict]:
    """Seconds of the server's work while a round's clients wait (DMA's weights, then the update
    with a deployment's defences: norm bound, agreement filter, momentum) on `clients` synthetic
    updates of the configured model, `repeats` times after one warm-up; and the last round's
    `robust` record. No Flower: the strategy's own methods, as a ServerApp calls them."""
    import torch

    from fssl.methods import make_model
    from fssl.runtime import cores
    from server_app.config import compose
    from strategy import ServerSetup, make_strategy

    cfg = compose(overrides)
    torch.manual_seed(0)
    # no data is loaded: the first convolution's input channels only move a few hundred values
    channels = 1 if cfg["dataset"]["name"] == "mnist10k" else 3
    state = make_model(cfg, 10, channels).state_dict()
    g = {k: v.numpy().copy() for k, v in state.items()}
    rng = np.random.default_rng(0)
    updates = [
        {
            k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype)
            if v.dtype.kind == "f"
            else v
            for k, v in g.items()
        }
        for _ in range(clients)
    ]
    app_u = rng.dirichlet(np.full(10, 0.3), size=clients)
    replies = [{"app_u": a, "arrays": u} for a, u in zip(app_u, updates)]
    strategy = make_strategy(cfg, 10, ServerSetup(workers=cores()))
    seconds = []
    for _ in range(repeats + 1):
        strategy.update.momentum_buffer = {}
        t0 = time.perf_counter()
        weights = strategy.weighting.weights(replies, 1)  # DMA's, as after the warm-up
        strategy.update(g, replies, weights, strategy.round_record)
        seconds.append(time.perf_counter() - t0)
    return seconds[1:], strategy.round_record.robust or {}


def floor_only(args: argparse.Namespace) -> int:
    """`--floor-only`: Flower's echo floor in an experiment's federation, with its model's arrays."""
    from fssl.checks import ConfigError

    overrides = [f"experiment={args.experiment}"] if args.experiment else []
    try:
        nodes, per_round = federation(overrides)
        shapes = model_shapes(overrides)
    except ConfigError as err:
        print(f"feddb overhead: {err}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        seconds = floor(args.rounds, Path(tmp), shapes, not args.flower_ray, nodes, per_round)
    fl = float(np.mean(seconds[SKIP:]))
    values = sum(int(np.prod(s)) for s in shapes.values())
    print(
        f"Flower's floor ({args.experiment or 'the default CNN'}): {per_round} of {nodes} nodes a "
        f"round echo {values:,} values each: {fl:.3f} s a round (mean of rounds "
        f"{SKIP + 1}-{args.rounds}; min {min(seconds[SKIP:]):.3f}, max {max(seconds[SKIP:]):.3f})"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "experiment": args.experiment,
                    "nodes": nodes,
                    "per_round": per_round,
                    "values": values,
                    "floor_round": fl,
                    "floor_rounds": seconds,
                },
                indent=2,
            )
        )
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of each measured run")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the ServerApp and every ClientApp call; print the top items",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--deployment",
        action="store_true",
        help="instead: a TLS deployment of --nodes SuperNodes on this machine running Flower's "
        "echo floor and the project with a null trainer in turn, then the project without a "
        "step and training (benchmarks/deployoverhead.py; --rounds 9 is enough)",
    )
    ap.add_argument("--nodes", type=int, default=3, help="--deployment: SuperNodes")
    ap.add_argument(
        "--flower-ray",
        action="store_true",
        help="let Flower start Ray in each run instead of the launcher's Ray head",
    )
    ap.add_argument(
        "--eval-every",
        type=int,
        default=1,
        metavar="N",
        help="the project's eval.every: central evaluation every N rounds (default 1)",
    )
    ap.add_argument(
        "--defences",
        action="store_true",
        help="with the defences, defaults only on SuperNodes (a deployment's server "
        f"work: norm bound, agreement filter, loss check, DMA cap): {DEFENCES}",
    )
    ap.add_argument(
        "--aggregation",
        action="store_true",
        help="only time the server's aggregation of synthetic updates (no Flower)",
    )
    ap.add_argument(
        "--floor-only",
        action="store_true",
        help="only Flower's echo floor, in --experiment's federation with its model's arrays "
        "(e.g. paper/cifar10_dir0.3: 100 nodes, 10 a round, WRN-28-2)",
    )
    ap.add_argument(
        "--experiment",
        help="with --aggregation or --floor-only: an experiment preset for the "
        "model (e.g. paper/cifar10_dir0.3: WRN-28-2); default: the default CNN",
    )
    return ap


def aggregation_only(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """--aggregation: the server's aggregation of synthetic updates alone, timed."""
    overrides = [f"experiment={args.experiment}"] if args.experiment else []
    from fssl.checks import ConfigError

    try:
        seconds, _ = aggregation_seconds(overrides)
    except ConfigError as err:
        ap.error(str(err))
    print(
        f"server aggregation of {PER_ROUND} synthetic updates "
        f"({args.experiment or 'the default CNN'}; DMA, norm bound, agreement filter, "
        f"momentum): median {np.median(seconds) * 1000:.0f} ms, min "
        f"{min(seconds) * 1000:.0f} ms over {len(seconds)} repeats"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.rounds <= SKIP:
        print(
            f"error: --rounds {args.rounds}: the first {SKIP} rounds are left out of the means "
            f"(start-up); give at least {SKIP + 1}",
            file=sys.stderr,
        )
        return 2
    if args.deployment:
        from benchmarks.deployoverhead import main as deployment_main

        return deployment_main(args.nodes, args.rounds, args.json)
    if args.experiment and not (args.aggregation or args.floor_only):
        ap.error(
            "--experiment goes with --aggregation or --floor-only "
            "(the project's simulations use the default CNN)"
        )
    if args.floor_only:
        return floor_only(args)
    if args.aggregation:
        return aggregation_only(args, ap)
    return project_against_floor(args)


def project_against_floor(args: argparse.Namespace) -> int:
    """The project's run with a null trainer and Flower's echo floor, each timed; the table."""
    workers = min(PER_ROUND, os.cpu_count() or 1)  # one CPU per client: clients at a time
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        profile = tmp / "profile" if args.profile else None
        if profile is not None:
            profile.mkdir()
        t0 = time.perf_counter()
        records = project(
            args.rounds, tmp, profile, not args.flower_ray, args.eval_every, args.defences
        )
        t_project = time.perf_counter() - t0
        t0 = time.perf_counter()
        shapes = model_shapes()
        floor_seconds = floor(args.rounds, tmp, shapes, not args.flower_ray)
        t_floor = time.perf_counter() - t0
        tops = top_functions(profile) if profile is not None else {}
    p = split(records, workers)
    fl = float(np.mean(floor_seconds[SKIP:]))
    print_parts(p, fl, args.eval_every, args.defences, shapes, workers, args.rounds)
    print(
        f"\noverhead / floor: {p['overhead'] / fl:.2f}x; whole runs: project {t_project:.0f} s, "
        f"floor {t_floor:.0f} s (start-up included)"
    )
    for side, lines in tops.items():
        print(f"\ntop {side} functions by own time (cProfile, all rounds):")
        print("\n".join("  " + line for line in lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"project": p, "floor_round": fl, "floor_rounds": floor_seconds, "top": tops},
                indent=2,
            )
        )
    return 0


def print_parts(p: dict, fl: float, eval_every: int, defences: bool, shapes, workers, rounds):
    """The table of a round's parts (seconds per round, means over the rounds after SKIP)."""
    rows = [
        ("round (null trainer), wall", p["round"]),
        ("  clients' own pass for APP-U (sum / clients at a time)", p["client_pass_critical"]),
        ("  **overhead** = round - that pass", p["overhead"]),
        (
            "server's own work, overlapping the clients' (next round's instructions go out first)",
            p["server_work"],
        ),
        ("  configure (instructions)", p["configure"]),
        (
            "  aggregation (DMA, defences" + ("" if defences else " off") + ", momentum)",
            p["aggregate"],
        ),
        (
            "    of which the loss check (m + 1 evaluations of 500 validation images)",
            p["loss_check"],
        ),
        (
            f"  central evaluation (test + validation), every {eval_every} round(s)",
            p["evaluate"],
        ),
        ("  metrics.jsonl, TensorBoard, progress line", p["record_previous_round"]),
        ("  checkpoint", p["checkpoint_previous_round"]),
        ("server waiting for replies after its own work", p["communicate"]),
        ("clients' set-up (config, model, received state, data), sum", p["client_setup_sum"]),
        ("clients' reply arrays, sum", p["client_reply_sum"]),
        ("**Flower's floor**: echo ServerApp/ClientApp, same arrays and federation", fl),
    ]
    values = sum(int(np.prod(s)) for s in shapes.values())
    print(
        f"{PER_ROUND} of {NODES} clients a round, CNN ({values:,} values a message), {workers} "
        f"at a time; means over rounds {SKIP + 1}-{rounds}\n"
    )
    print("| part | seconds per round |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
