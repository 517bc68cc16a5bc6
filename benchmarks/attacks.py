"""The attack benchmark: one malicious client of five in every round, on MNIST-10k.

    feddb attacks --out runs/attacks_forced   # 48 runs, about 2-3 min each here; resumable
    feddb attacks --out runs/attacks_forced --part 0/2  &  ... --part 1/2   # two processes
    feddb attacks --federation five --out runs/attacks_five     # 5 clients, all every round
    feddb attacks --federation default --out runs/attacks20     # the quick preset's federation

Setting (forced, the default): experiment=quick (1000 labels, Dirichlet 0.3, 40 rounds), its 20
clients with 5 a round and fl.always_sample=[0], so node 0 is one of the 5 in every round and
attacks (client_app/attacks.py, switched on here through node_config and FEDDB_TEST_ATTACKS=1,
never by a run-config). FedDB is the victim, except for inflated sizes, which only matter to n_m/N
weighting (FixMatch with server.weighting=samples). For each attack, final test accuracy: clean /
attacked with no defence (dma.cap=null, server.sizes=reported, server.robust.clip=null,
server.robust.min_cosine=null, server.robust.loss_check=null) / with the defaults but neither the
agreement filter nor the loss check / with the defaults. Then the honest checks: FedDB seeds 0-2
with the defaults against no defence and against neither filter; the other methods (seed 0) with
and without them; each filter alone (sign flip and honest, seeds 0-2). Every run has
server.robust.scope=always: "the defaults" are a deployment's, where every defence runs.
Complete runs are skipped, so an interrupted benchmark resumes; the table goes to <out>/attacks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from feddb import rows

PROJECT = Path(__file__).resolve().parents[1]
# five: the benchmark; default: the quick preset's own federation (20 clients, 10 a round), where
# node 0 is drawn in about half of the rounds and is then 1 of 10
SETTINGS = {
    "five": "experiment='quick' overrides='fl.num_clients=5 fl.fraction_train=1.0 "
    "fl.min_train_clients=1 checkpoint.every=0{extra}'",
    "default": "experiment='quick' overrides='checkpoint.every=0{extra}'",
    "forced": "experiment='quick' overrides='fl.fraction_train=0.25 fl.always_sample=[0] "
    "checkpoint.every=0{extra}'",
}
# a node that attacks is a deployment's threat: the defences, on by default only where the nodes
# are SuperNodes, are in scope here as they would be there
ALWAYS = " server.robust.scope=always"
HEADER = {
    "five": "node 0 of 5, every round",
    "default": "node 0 of 20, when drawn (10 a round)",
    "forced": "node 0 of 20, in every round of 5",
}
UNDEFENDED = (
    " dma.cap=null server.sizes=reported server.robust.clip=null"
    " server.robust.min_cosine=null server.robust.loss_check=null"
)
# the defaults without the two filters of updates: the cap, trusted sizes and the norm bound stay
NO_FILTERS = " server.robust.min_cosine=null server.robust.loss_check=null"
FILTER = " server.robust.loss_check=null"  # the agreement filter alone (no evaluations)
LOSS_CHECK = " server.robust.min_cosine=null"  # the loss check alone
SAMPLES = " server.weighting=samples"
VICTIM = {
    "uniform_app_u": ("feddb", ""),
    "inflated_sizes": ("fixmatch", SAMPLES),
    "scaled_update": ("feddb", ""),
    "sign_flip": ("feddb", ""),
    "nan": ("feddb", ""),
}
HONEST_SEEDS = (0, 1, 2)
# honest, seed 0: the paper's other methods, as the table of runs lists them (conf/comparison)
OTHER_METHODS = tuple(
    name
    for name, row in rows.table().items()
    if row.section == "methods" and row.method == name and name != "feddb"
)


def plan() -> list[dict]:
    """Every run: (dir, method, overrides, attack, seed)."""

    def run(d, method, extra, attack=None, seed=0):
        return {"dir": d, "method": method, "extra": extra, "attack": attack, "seed": seed}

    runs = []
    for method, extra in sorted(set(VICTIM.values())):
        tag = method + ("-samples" if extra else "")
        for seed in HONEST_SEEDS if method == "feddb" else (0,):
            runs.append(run(f"clean/{tag}/s{seed}", method, extra, seed=seed))
            if method == "feddb":
                runs += [
                    run(f"clean-undefended/{tag}/s{seed}", method, extra + UNDEFENDED, seed=seed),
                    run(f"clean-no-filters/{tag}/s{seed}", method, extra + NO_FILTERS, seed=seed),
                ]
    for attack, (method, extra) in VICTIM.items():
        for kind, more in (
            ("undefended", UNDEFENDED),
            ("no-filters", NO_FILTERS),
            ("defaults", ""),
        ):
            if not (attack == "nan" and kind == "undefended"):  # rejected by the reply check
                runs.append(run(f"{attack}/{kind}", method, extra + more, attack))
    runs += [
        run(f"{attack}/defaults-s{seed}", "feddb", "", attack, seed)
        for attack in ("sign_flip", "nan")
        for seed in HONEST_SEEDS[1:]
    ]
    # the attack on seeds the defaults were not set on; NaN: node 0's replies all rejected, i.e.
    # the run without node 0's data, which is the best any defence can do against node 0
    for kind, more in (("filter", FILTER), ("loss-check", LOSS_CHECK)):  # each filter alone
        runs += [
            run(
                f"sign_flip/{kind}" + (f"-s{seed}" if seed else ""),
                "feddb",
                more,
                "sign_flip",
                seed,
            )
            for seed in HONEST_SEEDS
        ]
        runs += [
            run(f"clean-{kind}/feddb/s{seed}", "feddb", more, seed=seed) for seed in HONEST_SEEDS
        ]
    for method in OTHER_METHODS:  # what the two filters cost the other methods
        runs += [
            run(f"clean/{method}/s0", method, ""),
            run(f"clean-no-filters/{method}/s0", method, NO_FILTERS),
        ]
    return runs


def pct(v: float | None) -> str:
    return "not run" if v is None else f"{100 * v:.2f}"


def final(run_dir: Path) -> float | None:
    """The run's final test accuracy; None while it is not complete."""
    f = run_dir / "summary.json"
    return json.loads(f.read_text())["final_test_accuracy"] if f.is_file() else None


def paired(out: Path, a: str, b: str) -> list[tuple[int, float, float]]:
    """(seed, a, b) for the honest seeds where both runs are complete."""
    rows = [(s, final(out / a.format(s=s)), final(out / b.format(s=s))) for s in HONEST_SEEDS]
    return [(s, x, y) for s, x, y in rows if x is not None and y is not None]


def mean_interval(d: list[float]) -> str:
    from feddb.stats import interval95

    if not d:
        return "not run"
    mean, lo, hi = interval95(d)
    return f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] ({len(d)} seeds)"


def table(out: Path, federation: str = "forced") -> str:
    """The benchmark's tables; runs not complete yet show as `not run`."""
    lines = [
        f"| attack ({HEADER[federation]}) | victim | clean | attacked, no defence | "
        "attacked, defaults without the filter and the loss check | attacked, defaults | "
        "defaults − clean |",
        "|---|---|---|---|---|---|---|",
    ]
    for attack, (method, extra) in VICTIM.items():
        tag = method + ("-samples" if extra else "")
        clean = final(out / f"clean/{tag}/s0")
        hit = final(out / f"{attack}/undefended") if attack != "nan" else None
        held = final(out / f"{attack}/defaults")
        gap = (
            f"{100 * (held - clean):+.2f}" if held is not None and clean is not None else "not run"
        )
        lines.append(
            f"| {attack} | {tag} | {pct(clean)} | "
            f"{pct(hit) if attack != 'nan' else 'rejected (same as defaults)'} | "
            f"{pct(final(out / f'{attack}/no-filters'))} | {pct(held)} | {gap} |"
        )
    rows = paired(out, "clean/feddb/s{s}", "clean-undefended/feddb/s{s}")
    done = [out / f"clean-undefended/feddb/s{s}" for s, *_ in rows]
    lines += [
        "",
        "Sign flip with the defaults on the other seeds: "
        + (other_seeds(out, "sign_flip/defaults-s{s}") or "not run")
        + ".",
    ]
    return "\n".join(
        lines
        + [
            "",
            honest_table(
                out,
                "FedDB, no attack: defaults vs no defence",
                "clean/feddb/s{s}",
                "clean-undefended/feddb/s{s}",
                "no defence",
            ),
            "",
            honest_table(
                out,
                "FedDB, no attack: defaults vs the defaults without the agreement "
                "filter and the loss check",
                "clean/feddb/s{s}",
                "clean-no-filters/feddb/s{s}",
                "no filters",
            ),
            "",
            other_methods_table(out),
            "",
            alone_table(out, "filter", FILTER),
            "",
            alone_table(out, "loss-check", LOSS_CHECK),
            "",
            honest_weights(done) if done else "",
        ]
    )


def other_seeds(out: Path, attacked: str) -> str:
    """`seed 1 x (clean y, x - y; node 0 absent z); seed 2 ...` for the attacked runs on seeds 1-2
    complete so far; node 0 absent: the NaN run of that seed (its replies all rejected)."""
    return "; ".join(
        f"seed {s} {pct(x)} (clean {pct(y)}, {100 * (x - y):+.2f}; node 0 absent "
        f"{pct(final(out / f'nan/defaults-s{s}'))})"
        for s, x, y in paired(out, attacked, "clean/feddb/s{s}")
        if s
    )


def honest_table(out: Path, title: str, a: str, b: str, b_name: str) -> str:
    rows = paired(out, a, b)
    return "\n".join(
        [
            f"Honest runs, {title}, final test accuracy (%)",
            "",
            f"| seed | defaults | {b_name} | difference |",
            "|---|---|---|---|",
            *[f"| {s} | {pct(x)} | {pct(y)} | {100 * (x - y):+.2f} |" for s, x, y in rows],
            f"| mean, 95 % interval | | | {mean_interval([100 * (x - y) for _, x, y in rows])} |",
        ]
    )


def other_methods_table(out: Path) -> str:
    """What the agreement filter and the loss check (defaults for every method) cost the other
    methods' honest runs, seed 0, with the rounds where they dropped an honest update."""
    lines = [
        "Honest runs of the other methods, seed 0: defaults vs the defaults without the "
        "agreement filter and the loss check",
        "",
        "| method | defaults | no filters | difference | rounds with an update dropped |",
        "|---|---|---|---|---|",
    ]
    for m in OTHER_METHODS:
        x, y = final(out / f"clean/{m}/s0"), final(out / f"clean-no-filters/{m}/s0")
        diff = f"{100 * (x - y):+.2f}" if x is not None and y is not None else "not run"
        lines.append(
            f"| {m} | {pct(x)} | {pct(y)} | {diff} | {dropped_rounds(out / f'clean/{m}/s0')} |"
        )
    return "\n".join(lines)


def dropped_rounds(run_dir: Path) -> str:
    f = run_dir / "metrics.jsonl"
    if not f.is_file():
        return "not run"
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    hit = sum(
        bool((r.get("robust") or {}).get("dropped") or (r.get("robust") or {}).get("loss_dropped"))
        for r in rows
    )
    return f"{hit} of {len(rows)}"


def alone_table(out: Path, kind: str, overrides: str) -> str:
    """One of the two filters alone (`filter`: no evaluations; `loss-check`: no cosines) against
    the sign flip on the three seeds, against node 0 being absent (the NaN run: its reply dropped
    every round), and what it changes in honest runs."""
    flips = [
        (s, final(out / (f"sign_flip/{kind}" + (f"-s{s}" if s else "")))) for s in HONEST_SEEDS
    ]
    text = "; ".join(
        f"seed {s} {pct(x)} (clean {pct(c)}, {100 * (x - c):+.2f})"
        for s, x in flips
        if x is not None and (c := final(out / f"clean/feddb/s{s}")) is not None
    )
    return "\n".join(
        [
            f"Sign flip with `{overrides.strip()}` ({kind} alone): {text or 'not run'} "
            f"(node 0 absent, its data lost: {pct(final(out / 'nan/defaults'))}).",
            "",
            honest_table(
                out,
                f"FedDB, no attack: the defaults vs the {kind} alone",
                "clean/feddb/s{s}",
                f"clean-{kind}/feddb/s{{s}}",
                f"{kind} alone",
            ),
        ]
    )


def honest_weights(run_dirs: list[Path]) -> str:
    """The distribution of m * beta_m under unbounded DMA in honest runs: what the cap is set by."""
    import numpy as np

    v = []
    for d in run_dirs:
        for line in (d / "metrics.jsonl").read_text().splitlines():
            w = (json.loads(line).get("dma") or {}).get("weights") or []
            v += [len(w) * x for x in w]
    q = np.percentile(v, [50, 90, 99, 100])
    return (
        f"Honest FedDB runs without the cap ({len(v)} client-rounds): m·β_m median "
        f"{q[0]:.2f}, 90th percentile {q[1]:.2f}, 99th {q[2]:.2f}, largest {q[3]:.2f}; "
        f"above κ = 2 in {100 * np.mean(np.asarray(v) > 2):.1f} % of client-rounds."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="runs/attacks", help="where the benchmark's runs go")
    ap.add_argument(
        "--part",
        default="0/1",
        metavar="K/N",
        help="run only every N-th run from the K-th (0 <= K < N), so that N "
        "processes share the plan; the table is written once all are complete",
    )
    ap.add_argument(
        "--federation",
        choices=sorted(SETTINGS),
        default="forced",
        help="five: 5 clients, all every round (the benchmark); default: the quick "
        "preset's 20 clients, 10 a round; forced: 20 clients, 5 a round, node 0 "
        "in every round (fl.always_sample=[0]); use another --out for each",
    )
    ap.add_argument(
        "--table",
        action="store_true",
        help="run nothing: write the table of the runs complete so far (the others "
        "show as `not run`) to <out>/attacks.md",
    )
    args = ap.parse_args(argv)
    try:
        k, n = (int(x) for x in args.part.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        print(
            f"error: --part must be K/N with 0 <= K < N (e.g. 0/2), got {args.part!r}",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(PROJECT))
    from client_app.attacks import ENV
    from feddb.inprocess import run_in_process
    from feddb.launch import parse_run_config
    from feddb.sweep import complete

    os.environ[ENV] = "1"  # this process's simulated node 0 may attack
    out = Path(args.out).resolve()
    runs = plan()
    for i, r in enumerate(runs if not args.table else [], 1):
        run_dir = out / r["dir"]
        if (i - 1) % n != k or complete(run_dir):
            continue
        print(f"[attacks] {i}/{len(runs)} {r['dir']}", flush=True)
        rc = parse_run_config(
            f"method='{r['method']}' seed={r['seed']} output-dir='{run_dir}' "
            + SETTINGS[args.federation].format(extra=ALWAYS + r["extra"])
        )
        run_in_process(rc, node_config={0: {"attack": r["attack"]}} if r["attack"] else None)
    missing = [r["dir"] for r in runs if not complete(out / r["dir"])]
    if missing and not args.table:
        print(
            f"[attacks] part {k}/{n} done; {len(missing)} runs of other parts still to finish "
            f"(first: {missing[0]}); run again without --part for the table, or with "
            "--table for what is complete"
        )
        return 0
    text = table(out, args.federation)
    (out / "attacks.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
