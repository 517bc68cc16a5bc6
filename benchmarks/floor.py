"""A sweep's arithmetic floor: its floating-point operations, counted, against this machine's fp32
rates; no implementation of the same arithmetic in fp32 runs the sweep faster here.

    feddb floor                                        # the miniature's 43 runs
    feddb floor --sweep claims_cpu --out floor.json

Each row of the sweep presets runs three short in-process runs (the real ServerApp and ClientApp)
under torch's FlopCounterMode: one round, two rounds, and two rounds of which one is past the
labels-only warm-up. Their differences give the initial evaluation, a warm-up round and a
semi-supervised round (clients' training, their passes, the server's evaluation); a full run is
the first plus its rounds of each kind. Rows are counted at seed 0 and the presets' first dataset
and partition; sampled clients differ in size from round to round, so a run's count is an
estimate within a few per cent. SemiFL trains on its confident images only, few of them in round
2, so its rows are counted low; work outside torch (augmentation, DMA's solver, Flower) is not
counted at all: the floor is a lower bound.

The rates, one thread each, times the CPU cores: a 2048 x 2048 fp32 matrix multiply (about the
cores' fp32 peak) and the model's own training step (forward and backward over one mini-batch of
labeled and both views of unlabeled images).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import sys
import tempfile
from pathlib import Path

import yaml

from fssl.runtime import cores

PROJECT = Path(__file__).resolve().parents[1]
MINIATURE = "mnist_miniature,mnist_miniature_others"


def preset(name: str) -> dict:
    path = PROJECT / "conf" / "sweeps" / "sweep" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise SystemExit(f"feddb floor: no sweep preset '{name}'; choose from {', '.join(known)}")
    return yaml.safe_load(path.read_text())


def first(params: dict, key: str, default: str) -> str:
    return str(params.get(key, default)).split(",")[0].strip()


def sweep_rows(names: list[str]) -> list[dict]:
    """One entry per (preset, row): its run-config at seed 0 and how many runs the preset makes."""
    from feddb.sweep import rows

    known, out = rows(), []
    for name in names:
        p = preset(name)
        params = {k: str(v) for k, v in p["hydra"]["sweeper"]["params"].items()}
        runs = math.prod(len(v.split(",")) for k, v in params.items() if k != "row")
        for row in params["row"].split(","):
            rc = (
                f"{known[row.strip()]} experiment='{p.get('experiment', 'quick')}' "
                f"dataset='{first(params, 'dataset', p.get('dataset', 'mnist10k'))}' "
                f"partition='{first(params, 'partition', p.get('partition', 'dir0.3'))}' "
                f"{p.get('run_config', '')}"
            )
            out.append({"preset": name, "row": row.strip(), "runs": runs, "run_config": rc})
    return out


def counted_flops(run_config: dict) -> float:
    """FLOPs of one in-process run, everything torch computes in it (one thread: the apps run
    their clients and evaluation in this one)."""
    from torch.utils.flop_counter import FlopCounterMode

    from feddb.inprocess import run_in_process

    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # Flower's per-run warnings, e.g. no federated evaluation
    try:
        with (
            FlopCounterMode(display=False) as counter,
            contextlib.redirect_stdout(io.StringIO()),
        ):
            run_in_process(run_config)
    finally:
        flwr_log.setLevel(level)
    return float(counter.get_total_flops())


def run_flops(run_config: str, tmp: Path) -> dict[str, float]:
    """A full run's FLOPs from three short runs: A = init + 2w, B = init + w + s, C = init + w."""
    from feddb.launch import parse_run_config
    from server_app.config import resolve

    base = parse_run_config(run_config)
    cfg, _ = resolve(base)
    rounds, warmup = cfg["num_rounds"], min(cfg["train"]["warmup_rounds"], cfg["num_rounds"])
    extra = base.pop("overrides", "")

    def count(tag: str, num_rounds: int, warm: int) -> float:
        return counted_flops(
            base
            | {
                "seed": 0,
                "num-server-rounds": num_rounds,
                "output-dir": str(tmp / tag),
                "overrides": f"{extra} train.warmup_rounds={warm} logging.tensorboard=false",
            }
        )

    a, b, c = count("a", 2, 2), count("b", 2, 1), count("c", 1, 1)
    init, warm_round, semi_round = 2 * c - a, a - c, b - c
    total = init + warmup * warm_round + (rounds - warmup) * semi_round
    return {"warmup_round": warm_round, "semi_round": semi_round, "run": total, "rounds": rounds}


def machine_rates(run_config: str) -> dict[str, float]:
    """One thread's fp32 FLOP/s: a 2048^2 matrix multiply, and the model's training step."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.roundfloor import timed_rate
    from feddb.launch import parse_run_config
    from fssl.methods import make_model
    from fssl.runtime import dataset_for
    from server_app.config import resolve

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(2048, 2048)
        matmul = timed_rate(lambda: a @ a, 2 * 2048**3, 4)
        cfg, _ = resolve(parse_run_config(run_config))
        ds = dataset_for(cfg)
        model = make_model(cfg, ds.num_classes, ds.image_shape[0])
        tr = cfg["train"]
        batch = tr["batch_size"] * (1 + 2 * tr["mu"]) if tr["mode"] == "minibatch" else 256
        x = torch.randn(batch, *ds.image_shape)

        def step() -> None:
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()

        with FlopCounterMode(display=False) as counter:
            step()
        train = timed_rate(step, counter.get_total_flops(), 10)
    finally:
        torch.set_num_threads(threads)
    return {"matmul": matmul, "train_step": train, "batch": batch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feddb floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--sweep", default=MINIATURE, help=f"sweep presets, comma-separated ({MINIATURE})"
    )
    ap.add_argument("--cores", type=int, default=cores(), help="cores the sweep uses (all)")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument(
        "--paper-round",
        action="store_true",
        help="instead: a paper round's FLOPs against the device's measured rate for its model "
        "(benchmarks/roundfloor.py)",
    )
    ap.add_argument("--experiment", default="paper/cifar10_dir0.3", help="--paper-round's preset")
    ap.add_argument("--device", default="cuda", help="--paper-round: where the rate is measured")
    ap.add_argument(
        "--batches", default="540,5400", help="--paper-round: training-step batches to time"
    )
    ap.add_argument("--clients-images", default="40,500", help="--paper-round: labeled,pool")
    ap.add_argument("--run", help="--paper-round: also a run's rounds as they were (its dir)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    if args.paper_round:
        return paper_round_floor(args)
    rows = sweep_rows([s.strip() for s in args.sweep.split(",") if s.strip()])
    print(f"{'preset':<28} {'row':<20} {'runs':>4} {'TFLOP a run':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(rows):
            r.update(run_flops(r["run_config"], Path(tmp) / str(i)))
            print(f"{r['preset']:<28} {r['row']:<20} {r['runs']:>4} {r['run'] / 1e12:>11.2f}")
    total = sum(r["runs"] * r["run"] for r in rows)
    rates = machine_rates(rows[0]["run_config"])
    floor = {key: total / (rate * args.cores) for key, rate in rates.items() if key != "batch"}
    print(f"the sweep: {sum(r['runs'] for r in rows)} runs, {total / 1e12:.0f} TFLOP")
    print(
        f"fp32, one thread: matrix multiply {rates['matmul'] / 1e9:.1f} GFLOP/s, the model's "
        f"training step ({rates['batch']} images) {rates['train_step'] / 1e9:.1f} GFLOP/s; "
        f"x {args.cores} cores"
    )
    print(
        f"floor: {floor['matmul'] / 60:.1f} min at the matrix-multiply rate, "
        f"{floor['train_step'] / 60:.1f} min at the training step's rate"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"config": vars(args), "rows": rows, "rates": rates, "floor_seconds": floor})
        )
    return 0


def paper_round_floor(args: argparse.Namespace) -> int:
    """`--paper-round`: the round's FLOPs (every unlabeled image confident; and a run's rounds),
    the device's rate for the model's training step at each batch, and the two floors."""
    from benchmarks import roundfloor
    from server_app.config import compose

    try:
        cfg = compose([f"experiment={args.experiment}"])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        n_l, n_u = (int(x) for x in args.clients_images.split(","))
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        print(
            "error: --clients-images takes two integers (labeled,pool) and --batches "
            f"integers, comma-separated (got {args.clients_images!r}, {args.batches!r})",
            file=sys.stderr,
        )
        return 2
    test_images = {"cifar10": 10000, "cifar100": 10000, "svhn": 26032}.get(
        cfg["dataset"]["name"], 10000
    )
    count = roundfloor.paper_round(cfg, n_l, n_u, test_images)
    print(
        f"{args.experiment}: a round of {count['clients']} clients ({n_l} labeled, {n_u} pool "
        f"images each, every one confident): {count['round'] / 1e12:.2f} TFLOP "
        f"({count['client'] / 1e12:.2f} a client, evaluation {count['evaluation'] / 1e12:.2f})"
    )
    out = {"experiment": args.experiment, "count": count}
    if args.run:
        out["run"] = roundfloor.measured_rounds(Path(args.run), cfg, test_images)
        print(
            f"{args.run}: {out['run']['rounds']} rounds as they were, "
            f"{out['run']['mean_round'] / 1e12:.2f} TFLOP a round on average"
        )
    try:
        rates = {b: roundfloor.step_rate(cfg, args.device, b) for b in batches}
    except (RuntimeError, AssertionError) as err:
        print(f"error: no rate on {args.device}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    for b, r in rates.items():
        print(f"{args.device}: the training step at batch {b}: {r / 1e12:.1f} TFLOP/s")
    best = max(rates.values())
    own = rates.get(count["step_batch"], best)
    floor = {"best_rate": count["round"] / best, "clients_in_turn": count["round"] / own}
    print(
        f"floor: {floor['best_rate']:.2f} s a round at the best rate, "
        f"{floor['clients_in_turn']:.2f} s with the clients one after another at batch "
        f"{count['step_batch']}"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps({**out, "rates": rates, "floor_seconds": floor, "device": args.device})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
