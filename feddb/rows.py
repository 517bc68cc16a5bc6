"""The one table of runs (conf/comparison/*.yaml): a row is a name and what it runs, the method,
DPL, DMA, DPL's prior, the server strategy, other overrides, its display name, and the rows it is
compared with (paired, per seed, in `feddb report`). Sweeps run
rows by name; `feddb report` and the claims study name and order runs by it; the ladder picks its
rows from it. Every method of conf/method/ is a row by its own name, so a new method needs no
entry; display names come from the methods' classes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fssl.checks import ConfigError
from fssl.methods import display_name
from strategy.flower import FLOWER

PROJECT = Path(__file__).resolve().parents[1]
TABLE = PROJECT / "conf" / "comparison"
METHODS = PROJECT / "conf" / "method"
FIELDS = ("method", "dpl", "dma", "prior", "strategy", "overrides", "display", "compare")
# What a method the table does not list is compared with: labels-only training, and FixMatch
# labelling once a round and at every step (most methods label online).
DEFAULT_COMPARE = ("fedavg", "fixmatch", "fixmatch-online")


@dataclass(frozen=True)
class Row:
    name: str
    method: str
    dpl: bool | None = None  # None: the method's own
    dma: bool | None = None
    prior: str | None = None  # what DPL divides by: local (the paper's) | global
    strategy: str | None = None
    overrides: str = ""
    shown: str | None = None  # the table's display name; None: made from the switches
    section: str = ""  # its section of conf/comparison; "registry": a method not listed there
    compare: tuple[str, ...] = ()  # the rows it is compared with, by name

    def run_config(self) -> str:
        """The row as a Flower run-config."""
        parts = [f"method='{self.method}'"]
        for key, value in (("dpl", self.dpl), ("dma", self.dma)):
            if value is not None:
                parts.append(f"{key}={str(value).lower()}")
        if self.strategy:
            parts.append(f"strategy='{self.strategy}'")
        prior = f"dpl_prior={self.prior}" if self.prior else ""
        overrides = " ".join(filter(None, (prior, self.overrides)))
        if overrides:
            parts.append(f"overrides='{overrides}'")
        return " ".join(parts)

    @property
    def display(self) -> str:
        if self.shown:
            return self.shown
        m = dict(method_yaml(self.method))
        for override in self.overrides.split():  # e.g. method.pseudo_labels=online
            key, _, value = override.partition("=")
            if key == "method.pseudo_labels":
                m["pseudo_labels"] = value
        dpl = bool(m.get("dpl")) if self.dpl is None else self.dpl
        dma = bool(m.get("dma")) if self.dma is None else self.dma
        name = variant_name(m, dpl, dma, self.prior or "local")
        if self.strategy and self.strategy != "method":  # as the report names such runs
            name += f" @ {FLOWER.get(self.strategy, self.strategy)}"
        return name


@cache
def own_yaml(name: str) -> dict[str, Any]:
    """conf/method/<name>.yaml's `method:` block, read once a process ({} where there is none);
    callers copy before they change it."""
    path = METHODS / f"{name}.yaml"
    return yaml.safe_load(path.read_text())["method"] if path.is_file() else {}


def method_yaml(name: str) -> dict[str, Any]:
    """A method's `method:` block (conf/method/<name>.yaml); for a method by path, its name as
    the trainer (its class gives the display name)."""
    if ":" not in name and own_yaml(name):
        return own_yaml(name)
    return {"name": name, "trainer": name, "dpl": False, "dma": False}


def method_display(m: dict[str, Any]) -> str:
    """A method's display name: its configuration's (runs saved when the YAML carried one), else
    its class's, else its name (a class that no longer loads)."""
    try:
        return display_name(m)
    except (ConfigError, KeyError):
        return str(m.get("name"))


def variant_name(m: dict[str, Any], dpl: bool, dma: bool, prior: str = "local") -> str:
    """A method's display name with the switches that differ from its defaults: "FixMatch-FedDPL",
    "FedDB w/o DPL", "FedDB w/o DMA", "FixMatch+DMA", "... (global prior)", and "FixMatch
    (online)" where `m` labels at another time than its method's YAML says."""
    name = method_display(m)
    own = own_yaml(str(m.get("name")))
    timing = m.get("pseudo_labels")
    if timing and own.get("pseudo_labels") and timing != own["pseudo_labels"]:
        name += " (online)" if timing == "online" else " (once a round)"
    if dpl != bool(m.get("dpl")):
        name += "-FedDPL" if dpl else " w/o DPL"
    if dpl and prior == "global":
        name += " (global prior)"
    if dma != bool(m.get("dma")):
        name += "+DMA" if dma else " w/o DMA"
    return name


@cache
def table() -> dict[str, Row]:
    """Every row by name, in the table's order: conf/comparison/paper.yaml's `methods`, the
    methods of conf/method/ not listed there, then every other section of every file."""
    sections: list[tuple[str, dict[str, dict]]] = []
    for path in sorted(TABLE.glob("*.yaml")):
        sections += list((yaml.safe_load(path.read_text()) or {}).items())
    rows: dict[str, Row] = {}
    for i, (section, specs) in enumerate(sections):
        for name, spec in specs.items():
            rows[name] = row_of(name, spec, section)
        if i == 0:  # the paper's methods, then every other method by its own name
            for path in sorted(METHODS.glob("*.yaml")):
                if path.stem != "custom" and path.stem not in rows:
                    rows[path.stem] = Row(
                        path.stem, path.stem, section="registry", compare=DEFAULT_COMPARE
                    )
    return distinct(rows)


def distinct(rows: dict[str, Row]) -> dict[str, Row]:
    """Every row its own display name: a row shown as an earlier one is (fixmatch-gn,
    fixmatch-joint: "FixMatch") gets its name beside it, "FixMatch [fixmatch-gn]", so that no
    table pools two rows' runs."""
    seen: set[str] = set()
    for name, row in rows.items():
        if row.display in seen:
            rows[name] = replace(row, shown=f"{row.display} [{name}]")
        seen.add(rows[name].display)
    for row in rows.values():
        unknown = [ref for ref in row.compare if ref not in rows]
        if unknown:
            raise ValueError(
                f"conf/comparison row '{row.name}': compare names {unknown}, which are not rows"
            )
    return rows


def row_of(name: str, spec: dict[str, Any], section: str = "") -> Row:
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown or "method" not in spec:
        raise ValueError(
            f"conf/comparison row '{name}': keys {unknown or ['method (missing)']}; "
            f"a row has {', '.join(FIELDS)}"
        )
    return Row(
        name,
        str(spec["method"]),
        spec.get("dpl"),
        spec.get("dma"),
        spec.get("prior"),
        spec.get("strategy"),
        str(spec.get("overrides") or ""),
        spec.get("display"),
        section,
        tuple(spec.get("compare") or ()),
    )


def display_order() -> list[str]:
    """Display names in the table's order: how tables sort their rows."""
    return list(dict.fromkeys(row.display for row in table().values()))


def comparisons(displays) -> list[tuple[str, str]]:
    """The paired comparisons among runs shown by these display names, in the table's order: each
    row's `compare`; a variant no row shows (a method by path, a switch flipped on a listed
    method) is compared as variant_name builds it: "X-FedDPL" with X, "X (global prior)" with X
    and X without DPL, anything else with DEFAULT_COMPARE."""
    shown = set(displays)
    rows = table()
    pairs = [(row.display, rows[ref].display) for row in rows.values() for ref in row.compare]
    for v in sorted(shown - {row.display for row in rows.values()}):
        base = v.removesuffix(" (global prior)")
        if base != v:
            refs = [base, base.removesuffix("-FedDPL")]
        elif v.endswith("-FedDPL"):
            refs = [v.removesuffix("-FedDPL")]
        else:
            refs = [rows[r].display for r in DEFAULT_COMPARE]
        pairs += [(v, ref) for ref in refs if ref != v]
    wanted = dict.fromkeys((a, b) for a, b in pairs if a in shown and b in shown)
    return list(wanted)
