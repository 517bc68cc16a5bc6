"""What a run is: identity.json, written into the run directory before its first round.

    {"row": "fixmatch-gn", "selection": {"key": "train.lr", "value": "0.1"}, "regime": "miniature",
     "seed": 0, "config": "<fingerprint>", "data": "<fingerprint>", "run": "<uuid>", ...}

`row` is the table's name of the run (conf/comparison/, given by the sweep as the run-config key
`row`), or for a run started by hand a canonical name of its switches (`fixmatch+dpl`,
`Mine@3fa2c1`); `selection` the key and value a selection sweep tried; `regime` the experiment
preset. `config` fingerprints the resolved configuration less what does not change what the run
computes (its seed is recorded beside it; its directory, logging and checkpoint cadence not at
all), `data` the dataset's arrays (whatever format they came from). Sweeps, resume and reports
read this record: none of them rebuilds a run's row from its path or its switches.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

FILE = "identity.json"
# keys of the resolved configuration that do not change what a run computes
NOT_FINGERPRINTED = ("seed", "output_dir", "logging", "checkpoint", "data_meta")


class IdentityError(ValueError):
    """A run is not the run it is asked to be; the message names the keys or files."""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def fingerprinted(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in NOT_FINGERPRINTED}


def config_fingerprint(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(fingerprinted(cfg)).encode()).hexdigest()[:16]


def data_fingerprint(ds: Any) -> str:
    """The dataset's arrays (images and labels of every split, shapes and types included): the
    same images read from any file format give the same fingerprint, a changed file another."""
    h = hashlib.sha256()
    for name in ("x_train", "y_train", "x_test", "y_test", "x_val", "y_val"):
        a = getattr(ds, name, None)
        if a is None:
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{name}{a.shape}{a.dtype}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:16]


def switches_name(cfg: dict[str, Any]) -> str:
    """A run started by hand: its method (`<Class>@<hash of the path>` for a method by path)
    and the switches that differ from the method's own: `fixmatch+dpl`, `feddb-dma`,
    `fixmatch+dpl+global-prior`, `fixmatch@fedprox`."""
    m = cfg["method"]
    trainer = str(m.get("trainer") or m["name"])
    name = str(m["name"])
    if ":" in trainer:
        name = f"{trainer.rpartition(':')[2]}@{hashlib.sha1(trainer.encode()).hexdigest()[:6]}"
    if bool(cfg["dpl"]) != bool(m.get("dpl")):
        name += "+dpl" if cfg["dpl"] else "-dpl"
    if cfg["dpl"] and cfg.get("dpl_prior", "local") != "local":
        name += f"+{cfg['dpl_prior']}-prior"
    if bool(cfg["dma"]["enabled"]) != bool(m.get("dma")):
        name += "+dma" if cfg["dma"]["enabled"] else "-dma"
    strategy = (cfg.get("strategy") or {}).get("name", "method")
    if strategy != "method":
        name += f"@{strategy}"
    return name


def selection_of(text: str) -> dict[str, str] | None:
    """The run-config key `selection` ('train.lr=0.1') as {key, value}; None when empty."""
    key, sep, value = str(text or "").partition("=")
    if not text:
        return None
    if not sep or not key:
        raise IdentityError(f"run-config key selection={text!r}: write it as <key>=<value>")
    return {"key": key, "value": value}


def make(cfg: dict[str, Any], run_config: dict[str, Any], ds: Any) -> dict[str, Any]:
    """A new run's identity (`run_config` as Flower passed it: row, selection, experiment)."""
    row = str(run_config.get("row") or "")
    return {
        "row": row or switches_name(cfg),
        "row_from": "table" if row else "switches",
        "selection": selection_of(str(run_config.get("selection") or "")),
        "regime": str(run_config.get("experiment") or ""),
        "seed": cfg["seed"],
        "config": config_fingerprint(cfg),
        "data": data_fingerprint(ds),
        "dataset": str(run_config.get("dataset") or cfg["dataset"]["name"]),
        "partition": str(run_config.get("partition") or ""),
        "run": uuid.uuid4().hex,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write(run_dir: Path, identity: dict[str, Any]) -> None:
    (run_dir / FILE).write_text(json.dumps(identity, indent=2))


def read(run_dir: Path) -> dict[str, Any] | None:
    """The run's identity; None for a run from before identities were recorded; IdentityError
    naming the file when it cannot be read."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    try:
        identity = json.loads(path.read_text())
        identity["row"], identity["config"]  # noqa: B018 - the keys every reader needs
    except (ValueError, KeyError, TypeError) as err:
        raise IdentityError(f"{path}: not a run identity ({err})") from None
    return identity


def differing_keys(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configurations, fingerprinted keys only.
    A key one of them lacks is left out: a later version of the project added it with the
    value the earlier one had built in."""
    out = []
    for key in sorted(set(a) & set(b)):
        if not prefix and key in NOT_FINGERPRINTED:
            continue
        va, vb = a[key], b[key]
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differing_keys(va, vb, f"{prefix}{key}.")
        elif canonical(va) != canonical(vb):
            out.append(f"{prefix}{key}")
    return out


def check_resume(run_dir: Path, cfg: dict[str, Any], ds: Any) -> None:
    """A run resumes only as itself: the saved configuration and the data must be those its
    identity recorded (a run from before identities were recorded is not checked)."""
    identity = read(run_dir)
    if identity is None:
        return
    if config_fingerprint(cfg) != identity["config"]:
        raise IdentityError(
            f"cannot resume {run_dir}: config.yaml no longer matches the configuration the run "
            f"started with ({FILE}); restore config.yaml, or start a new run"
        )
    found = data_fingerprint(ds)
    if found != identity.get("data"):
        raise IdentityError(
            f"cannot resume {run_dir}: the data of dataset '{cfg['dataset']['name']}' "
            f"(data-path '{cfg['dataset'].get('path') or 'its own'}') differ from those the run "
            "started with; point data-path at the same files, or start a new run"
        )


def check_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    """A checkpoint resumes only the run that wrote it (`state["run"]`, saved with it)."""
    identity = read(run_dir)
    if identity is None:
        return  # a run from before identities were recorded
    if state.get("run") != identity["run"]:
        raise IdentityError(
            f"cannot resume {run_dir}: its checkpoint was written by another run "
            f"({state.get('run') or 'one without an identity'}, not {identity['run']} of "
            f"{FILE}); restore the run's own checkpoint, or start it anew in a new output-dir"
        )


IDENTITY_KEYS = ("row", "selection")  # run-config keys that name a run, set nothing in it


def asked_otherwise(saved: dict[str, Any], asked: dict[str, Any], defaults: dict) -> list[str]:
    """How a run was asked (its run_config.json) otherwise than `asked`, key by key, overrides
    one by one ([]: the same request). A key the saved request lacks (one added to the app
    since) counts as its default; the naming keys, recorded since identities were, are not held
    against older runs."""
    full = defaults | saved
    out = []
    for key in sorted((set(asked) | set(full)) - {"output-dir", "resume"}):
        was, now = full.get(key, ""), asked.get(key, "")
        if key in IDENTITY_KEYS and key not in saved:
            continue
        if key == "overrides":
            a, b = overrides_of(was), overrides_of(now)
            changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out += [f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in changed]
        elif was != now:
            out.append(f"{key}: {was!r} -> {now!r}")
    return out


def overrides_of(text: str) -> dict[str, str]:
    """Hydra overrides as key -> value (the later wins, as in Hydra)."""
    return dict(o.partition("=")[::2] for o in shlex.split(str(text or "")))
