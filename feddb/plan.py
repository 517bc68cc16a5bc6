"""A study's plan: the endpoint, the test, alpha and the family of comparisons, fixed in a committed
file before the runs it judges (studies/plans/). `feddb report --plan FILE` takes its family from
one and `feddb claims` reads the claims study's; both name the plan by the commit that last
changed it, so a reader can check that the plan came before the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fssl.provenance import git

PROJECT = Path(__file__).resolve().parents[1]
REQUIRED = ("endpoint", "test", "alpha", "fixed", "family")


class PlanError(ValueError):
    """A plan file that cannot be read or lacks what a report needs; the message says which."""


def shown_path(path: Path) -> str:
    """The plan's path from the project's root where it lies inside, else as given."""
    try:
        return path.resolve().relative_to(PROJECT).as_posix()
    except ValueError:
        return str(path)


def commit_state(path: Path) -> str:
    """'at commit <hash>, <date>' (with ', changed since' when the working tree differs), or
    'not committed'."""
    where = shown_path(path)
    commit, dirty = (
        git(*args, "--", where, cwd=PROJECT)
        for args in (["log", "-1", "--format=%h, %cs"], ["status", "--porcelain"])
    )
    if not commit:
        return "not committed"
    return f"at commit {commit}" + (", changed since" if dirty else "")


def headline(path: Path, plan: dict[str, Any]) -> str:
    """The plan's one line: where it is, its commit, endpoint, test and alpha."""
    return (
        f"Plan: {shown_path(path)} ({commit_state(path)}): {plan['endpoint']}; {plan['test']}; "
        f"α = {plan['alpha']}."
    )


def read_plan(path: Path) -> dict[str, Any]:
    """A report's plan: REQUIRED keys, alpha in (0, 1), the family a non-empty list of
    [minuend, subtrahend] pairs of display names (as `feddb report` names rows)."""
    try:
        plan = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PlanError(f"cannot read the plan {path}: {err}") from None
    if not isinstance(plan, dict):
        raise PlanError(f"the plan {path} is not a mapping of {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in plan]
    if missing:
        raise PlanError(f"the plan {path} lacks {', '.join(missing)} (see studies/plans/uda.yaml)")
    alpha = plan["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, float | int) or not 0 < alpha < 1:
        raise PlanError(f"the plan {path}: alpha must be a number in (0, 1), not {alpha!r}")
    family = plan["family"]
    pairs = (
        isinstance(family, list)
        and family
        and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in family
        )
    )
    if not pairs:
        raise PlanError(
            f"the plan {path}: family must be a list of [minuend, subtrahend] pairs of row "
            "names as the report shows them, e.g. - [UDA, FixMatch (online)]"
        )
    plan["family"] = [tuple(p) for p in family]
    return plan
