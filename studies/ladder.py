"""The sanity ladder: do the project's trainers learn, and does semi-supervised learning help?

    feddb ladder --out runs/ladder                 # every rung, seed 0
    feddb ladder --rungs central --labels 100 --modes minibatch,fullbatch

Rungs on the embedded MNIST-10k, each run in process with the real
ServerApp and ClientApp, its run directory under --out (complete runs are skipped, so an
interrupted ladder resumes):
- central: one client holding all training images, 100 and 40 labels: labels-only vs FixMatch, in
  the mini-batch mode (8 rounds of 250 steps, batch 64, mu 7) and, with --modes, the paper's
  full-batch mode (5 epochs a round of one step over all local data);
- iid, dir0.3, dir0.1: the miniature's federated protocol (experiment=miniature, 20 clients):
  FedAvg (labels only), FixMatch, FixMatch-FedDPL and FedDB;
- protocol: FixMatch on the miniature (δ=0.3) with one part of the CPU protocol put back as it was
  before (batch-statistics BN, the old full-batch lr-0.5 round, the global-average-pool CNN head,
  no warm-up): what each part is for.
Prints one table (final test accuracy, test accuracy at the best-validation round, the collapse
signal) and writes it to <out>/ladder.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from feddb import rows
from fssl.record import read_rounds, run_summary

PROJECT = Path(__file__).resolve().parents[1]
ROWS = ("fedavg", "fixmatch", "fixmatch-feddpl", "feddb")  # of conf/comparison/paper.yaml


def methods() -> dict[str, str]:
    """The ladder's rows by display name -> run-config (the table of runs, feddb/rows.py)."""
    return {rows.table()[n].display: rows.table()[n].run_config() for n in ROWS}


CENTRAL = "fl.num_clients=1 fl.fraction_train=1.0 fl.min_train_clients=1 checkpoint.every=0"
MODES = {
    "minibatch": "train.mode=minibatch train.local_epochs=1 train.local_steps=250 "
    "train.batch_size=64 train.mu=7 num_rounds=8 train.warmup_rounds=0",
    "fullbatch": "train.mode=fullbatch train.local_epochs=5 num_rounds=20 train.warmup_rounds=0",
}
FEDERATED = ("iid", "dir0.3", "dir0.1")
PROTOCOL = {
    "as the miniature": "",
    "batch-statistics BN": "model.norm=batchstat",
    "old full-batch round (5 clipped steps, lr 0.5)": "train.mode=fullbatch train.local_epochs=5 train.lr=0.5",
    "global-average-pool CNN head": "model.hidden=0",
    "no warm-up": "train.warmup_rounds=0",
}


def plan(rungs: list[str], labels: list[int], modes: list[str]) -> list[dict]:
    """(name, run-config) of every run the ladder asks for, in order."""
    runs = []
    for rung in rungs:
        if rung == "central":
            for n in labels:
                for mode in modes:
                    for name in list(methods())[:2]:  # labels only, FixMatch
                        runs.append(
                            {
                                "rung": f"central, {mode}",
                                "labels": n,
                                "method": name,
                                "dir": f"central_{mode}_l{n}/{name.replace(' ', '_')}",
                                "run_config": f"{methods()[name]} experiment='miniature' "
                                f"partition='iid' overrides='{CENTRAL} {MODES[mode]} "
                                f"dataset.num_labeled={n}'",
                            }
                        )
        elif rung in FEDERATED:
            for name, rc in methods().items():
                runs.append(
                    {
                        "rung": f"federated, {rung}",
                        "labels": 100,
                        "method": name,
                        "dir": f"federated_{rung}/{name.replace(' ', '_')}",
                        "run_config": f"{rc} experiment='miniature' partition='{rung}'",
                    }
                )
        elif rung == "protocol":
            for i, (change, ov) in enumerate(PROTOCOL.items()):
                runs.append(
                    {
                        "rung": "protocol, dir0.3",
                        "labels": 100,
                        "method": f"FixMatch, {change}",
                        "dir": f"protocol/{i}",
                        "run_config": f"{rows.table()['fixmatch'].run_config()} experiment='miniature' "
                        f"partition='dir0.3'" + (f" overrides='{ov}'" if ov else ""),
                    }
                )
        else:
            raise ValueError(
                f"unknown rung '{rung}': choose central, {', '.join(FEDERATED)}, protocol"
            )
    return runs


def table(rows: list[dict]) -> str:
    out = [
        "| rung | labels | method | final test acc (%) | test acc at best-val round (%) | "
        "top-class share: final / largest in the second half | confident pseudo-labels correct (%) | collapsed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda v: "–" if v is None else f"{100 * v:.2f}"  # noqa: E731
    for r in rows:
        s = r["summary"]
        out.append(
            f"| {r['rung']} | {r['labels']} | {r['method']} | "
            f"{pct(s['final_test_accuracy'])} | {pct(s.get('selected_test_accuracy'))} | "
            f"{s['final_top_class_share']:.2f} / {late(r['run_dir']):.2f} | "
            f"{pct(r['pl_accuracy'])} | {'yes' if s['collapsed'] else 'no'} |"
        )
    return "\n".join(out)


def record(run: dict, seed: int) -> dict:
    """A rung's run as ladder.json keeps it: what the docs' tables are rendered from."""
    s, prov = run["summary"], json.loads((run["run_dir"] / "provenance.json").read_text())
    return {
        "rung": run["rung"],
        "labels": run["labels"],
        "method": run["method"],
        "seed": seed,
        "final_test_accuracy": s["final_test_accuracy"],
        "selected_test_accuracy": s.get("selected_test_accuracy"),
        "collapsed": bool(s["collapsed"]),
        "pseudo_label_accuracy": run["pl_accuracy"],
        **{k: prov.get(k) for k in ("hardware", "date", "commit")},
    }


def provenance(records: list[dict]) -> str:
    """One line: the machines, dates, commits and seeds of the records."""
    kinds = lambda key, f=str: ", ".join(sorted({f(r[key]) for r in records}))  # noqa: E731
    collapsed = sum(r["collapsed"] for r in records)
    return (
        f"*{kinds('hardware')}; {kinds('date', lambda d: d[:10])}; commit "
        f"{kinds('commit', lambda c: c[:7])}; seed {kinds('seed')}; {collapsed} of "
        f"{len(records)} runs collapsed.*"
    )


def docs_table(records: list[dict]) -> str:
    """Final test accuracy by rung and method (docs/results/protocol.md, `feddb tables`)."""
    ladder = [r for r in records if not r["rung"].startswith("protocol")]
    names = list(dict.fromkeys(r["method"] for r in ladder))
    rungs: dict[str, dict[str, float]] = {}
    for r in ladder:
        rung = r["rung"] + (f", {r['labels']} labels" if r["rung"].startswith("central") else "")
        rungs.setdefault(rung, {})[r["method"]] = r["final_test_accuracy"]
    lines = ["| rung | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for rung, acc in rungs.items():
        cells = [f"{100 * acc[n]:.2f}" if n in acc else "" for n in names]
        lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", provenance(ladder)])


def protocol_table(records: list[dict]) -> str:
    """The protocol rung: FixMatch with one part of the old protocol put back (`feddb tables`)."""
    rows = [r for r in records if r["rung"].startswith("protocol")]
    pct = lambda v: "–" if v is None else f"{100 * v:.2f}"  # noqa: E731
    lines = [
        "| FixMatch on the miniature (δ = 0.3), with | final test acc (%) | confident "
        "pseudo-labels correct (%) |",
        "|---|---|---|",
    ] + [
        f"| {r['method'].removeprefix('FixMatch, ')} | {pct(r['final_test_accuracy'])} | "
        f"{pct(r['pseudo_label_accuracy'])} |"
        for r in rows
    ]
    return "\n".join([*lines, "", provenance(rows)])


def late(run_dir: Path) -> float:
    """Largest top-class share over the second half of the rounds (recomputed from the rounds)."""
    return run_summary(read_rounds(run_dir))["max_top_class_share_late"]


def pseudo_label_accuracy(run_dir: Path) -> float | None:
    """Mean over rounds of the pooled accuracy of the round's confident pseudo-labels."""
    vals = [r.pseudo_label_accuracy_pooled for r in read_rounds(run_dir)]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="runs/ladder", help="where the rungs' run directories go")
    ap.add_argument(
        "--rungs",
        default="central,iid,dir0.3,dir0.1,protocol",
        help="comma-separated rungs to run (default: all)",
    )
    ap.add_argument("--labels", default="100,40", help="label counts of the central rung")
    ap.add_argument(
        "--modes",
        default="minibatch",
        help="training modes of the central rung: minibatch, fullbatch",
    )
    ap.add_argument("--seed", type=int, default=0, help="the seed of every rung's runs")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    from feddb.inprocess import run_in_process
    from feddb.launch import parse_run_config
    from feddb.sweep import complete
    from fssl.checks import ConfigError

    try:
        runs = plan(
            args.rungs.split(","), [int(n) for n in args.labels.split(",")], args.modes.split(",")
        )
        for mode in args.modes.split(","):
            if mode not in MODES:
                raise ValueError(f"unknown mode '{mode}': choose {', '.join(MODES)}")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    done = []
    for i, r in enumerate(runs, 1):
        run_dir = out / r["dir"]
        if not complete(run_dir):
            print(
                f"[ladder] {i}/{len(runs)} {r['rung']}, {r['labels']} labels, {r['method']}",
                flush=True,
            )
            rc = parse_run_config(f"{r['run_config']} seed={args.seed} output-dir='{run_dir}'")
            try:
                run_in_process(rc)
            except ConfigError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        done.append(
            {
                **r,
                "run_dir": run_dir,
                "summary": json.loads((run_dir / "summary.json").read_text()),
                "pl_accuracy": pseudo_label_accuracy(run_dir),
            }
        )
    text = table(done)
    (out / "ladder.md").write_text(text + "\n")
    (out / "ladder.json").write_text(json.dumps([record(r, args.seed) for r in done], indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
