"""The checks every configuration value passes: one rule per kind (integer, number, choice,
boolean, path, mapping, lists), each refusal one line naming the key as the user sets it, the
value and what is allowed. Methods check their own parameters with them (`check_params`);
fssl.config applies them to the whole configuration."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GROUPS = ("method", "strategy", "dataset", "partition", "scenario", "model", "experiment")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


# run-config key -> the Hydra key it sets (the groups set themselves; `overrides` and `resume`
# are handled apart)
RUN_CONFIG_TARGETS = {
    **{g: g for g in GROUPS},
    "dpl": "dpl",
    "dma": "dma.enabled",
    "data-path": "dataset.path",
    "seed": "seed",
    "output-dir": "output_dir",
    "num-server-rounds": "num_rounds",
}

_REQUIRED = object()


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _word(value: Any) -> str:
    """A value as a configuration's YAML writes it: true, false, null, strings bare."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


@dataclass(frozen=True)
class Bounds:
    """An interval; None leaves that side unbounded."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, x: float) -> bool:
        return (self.low is None or (x > self.low if self.open_low else x >= self.low)) and (
            self.high is None or (x < self.high if self.open_high else x <= self.high)
        )

    def words(self, name: str) -> str:
        """'>= 1', '> 0', or on both sides 'with 0 < tau <= 1' (`name`: what is bounded)."""
        below, above = "<" if self.open_low else "<=", "<" if self.open_high else "<="
        if self.low is not None and self.high is not None:
            return f"with {self.low} {below} {name} {above} {self.high}"
        if self.low is not None:
            return f"{'>' if self.open_low else '>='} {self.low}"
        return "" if self.high is None else f"{above} {self.high}"


@dataclass(frozen=True)
class Rule:
    """What a value may be: `accepts` decides it and `describe` words it."""

    kind: str  # integer, number, boolean, choice, path, mapping, list
    bounds: Bounds = Bounds()  # integer, number
    options: tuple = ()  # choice
    item: Rule | None = None  # list: the rule of each element (an integer or a number)
    nonempty: bool = False  # list

    def accepts(self, v: Any) -> bool:
        if self.kind == "integer":  # a bool is not an integer here
            return isinstance(v, int) and not isinstance(v, bool) and v in self.bounds
        if self.kind == "number":
            return is_number(v) and v in self.bounds
        if self.kind == "list":
            return (
                isinstance(v, list)
                and bool(v or not self.nonempty)
                and all(self.item.accepts(x) for x in v)
            )
        if self.kind == "choice":
            return v in self.options
        return isinstance(v, {"boolean": bool, "path": str, "mapping": dict}[self.kind])

    def describe(self, name: str) -> str:
        """The rule in words; `name` (the key's last part) stands for the value in an interval."""
        if self.kind in ("integer", "number"):
            article = "an" if self.kind == "integer" else "a"
            return f"{article} {self.kind} {self.bounds.words(name)}".rstrip()
        if self.kind == "list":
            bounds = self.item.bounds.words("x")
            items = f"{self.item.kind}s x" if bounds.startswith("with") else f"{self.item.kind}s"
            return f"a {'non-empty ' * self.nonempty}list of {items} {bounds}".rstrip()
        if self.kind == "choice":
            return ", ".join(map(_word, self.options))
        words = {"boolean": "true or false", "path": "a path string", "mapping": "a mapping"}
        return words[self.kind]


def check(
    cfg: dict[str, Any],
    path: str,
    rule: Rule,
    *,
    default: Any = _REQUIRED,
    nullable: bool | str = False,
    also: tuple = (),
    note: str = "",
) -> Any:
    """The value at the dotted `path` of cfg, checked against `rule` (the keywords: see above)."""
    parent, key = lookup(cfg, path)
    value = parent[key] if default is _REQUIRED else parent.get(key, default)
    if rule.accepts(value) or (nullable and value is None) or value in also:
        return value
    allowed = " ".join(filter(None, (rule.describe(key), note)))
    if also:
        allowed = ", ".join(map(_word, also)) + ", or " + allowed
    if nullable:
        allowed += ", or null" + (f" ({nullable})" if isinstance(nullable, str) else "")
    raise ConfigError(f"invalid value for {user_key(path)}: {value!r}; allowed: {allowed}")


def user_key(path: str) -> str:
    """How the user sets a config path: its run-config key where it has one (num-server-rounds
    for num_rounds), else the Hydra path for `overrides`."""
    keys = [k for k, target in RUN_CONFIG_TARGETS.items() if target == path and k != target]
    return f"run-config key {keys[0]} (`{path}`)" if keys else f"`{path}`"


def _each(cfg: dict[str, Any], paths: tuple[str, ...], rule: Rule, how: dict[str, Any]) -> Any:
    values = tuple(check(cfg, path, rule, **how) for path in paths)
    return values[0] if len(values) == 1 else values


def _bounded(
    kind: str,
    cfg: dict[str, Any],
    paths: tuple[str, ...],
    how: dict[str, Any],
    listed: bool = False,
) -> Any:
    """`kind` within Bounds(low, high, open_low, open_high) taken from `how`; `listed`: a list of
    them (`nonempty` too)."""
    bounds = Bounds(**{k: how.pop(k) for k in ("low", "high", "open_low", "open_high") if k in how})
    rule = Rule(kind, bounds)
    if listed:
        rule = Rule("list", item=rule, nonempty=how.pop("nonempty", False))
    return _each(cfg, paths, rule, how)


def integer(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    """An integer (not a bool) within the bounds (low, high, open_low, open_high)."""
    return _bounded("integer", cfg, paths, how)


def number(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    """A finite number within the bounds (low, high, open_low, open_high)."""
    return _bounded("number", cfg, paths, how)


def integers(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    """A list of integers, each within the bounds."""
    return _bounded("integer", cfg, paths, how, listed=True)


def numbers(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    """A list of numbers, each within the bounds."""
    return _bounded("number", cfg, paths, how, listed=True)


def choice(cfg: dict[str, Any], path: str, options: Iterable[Any], **how: Any) -> Any:
    return check(cfg, path, Rule("choice", options=tuple(options)), **how)


def boolean(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    return _each(cfg, paths, Rule("boolean"), how)


def path_string(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    return _each(cfg, paths, Rule("path"), how)


def mapping(cfg: dict[str, Any], *paths: str, **how: Any) -> Any:
    return _each(cfg, paths, Rule("mapping"), how)


def lookup(cfg: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    *parents, key = path.split(".")
    for name in parents:
        cfg = cfg[name]
    return cfg, key
