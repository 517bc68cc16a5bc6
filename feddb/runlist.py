"""runs.csv: every run a table was made from (its row, dataset, partition, scenario, seed, final
and selected test accuracy, commit, hardware and exact run-config), written beside the tables of
`feddb report` and `feddb claims` and read by `feddb reproduce`; when each run started, for
the provenance lines of tables made from it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fssl.partition import scenario_of

DEFAULT_SCENARIO = "labels_at_clients"
FIELDS = [
    "regime",
    "row",
    "dataset",
    "partition",
    "scenario",
    "seed",
    "final",
    "selected",
    "commit",
    "hardware",
    "date",
    "run_config",
]
ORDER = ("regime", "scenario", "dataset", "partition", "row", "seed")


def run_fields(run: dict) -> dict:
    """One runs.csv line for a run as `feddb report` read it: its row, dataset and partition as
    its identity records them (the run-config's names, which `feddb reproduce` runs again)."""
    d, ident = Path(run["dir"]), run["identity"]
    rc_file, prov_file = d / "run_config.json", d / "provenance.json"
    rc = json.loads(rc_file.read_text()) if rc_file.is_file() else {}
    prov = json.loads(prov_file.read_text()) if prov_file.is_file() else {}
    rc = {k: v for k, v in rc.items() if k not in ("output-dir", "resume") and v != ""}
    # the same row and seed run in each scenario: the scenario tells their lines apart
    scenario = scenario_of(run["cfg"])[0] if "cfg" in run else rc.get("scenario", DEFAULT_SCENARIO)
    return {
        "regime": run.get("regime", ""),
        "row": ident["row"] + selection_suffix(ident.get("selection")),
        "dataset": ident["dataset"],
        "partition": ident["partition"],
        "scenario": scenario,
        "seed": run["seed"],
        "final": f"{100 * run['final']:.2f}",
        "selected": "" if run["selected"] is None else f"{100 * run['selected']:.2f}",
        "commit": str(prov.get("commit") or "")[:12],
        "hardware": prov.get("hardware", ""),
        "date": str(prov.get("date") or "")[:19],
        "run_config": json.dumps(rc),
    }


def selection_suffix(selection: dict | None) -> str:
    """A selection's run as its sweep names its directory: `@<the key's last part>=<value>`."""
    if not selection:
        return ""
    return f"@{selection['key'].rpartition('.')[2]}={selection['value']}"


def write_runs(runs: list[dict], path: Path) -> None:
    """runs.csv: every run a table was made from, for `feddb reproduce`."""
    lines = sorted((run_fields(r) for r in runs), key=lambda f: tuple(f[k] for k in ORDER))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(lines)
