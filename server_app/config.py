"""The run's configuration, checked by each layer that owns a part of it: the core's sections by
fssl.config (which also composes conf/ with Hydra), the server's aggregation by
strategy.validate. Everything that starts a run takes its configuration from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import strategy
from fssl import config


def compose(overrides: list[str] | None = None) -> dict[str, Any]:
    """conf/ composed with Hydra overrides, every part checked."""
    cfg = config.compose(overrides)
    strategy.validate(cfg)
    return cfg


def resolve(run_config: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """The configuration of a Flower run-config (or, with `resume`, the saved one and its run
    directory), every part checked."""
    cfg, resume_dir = config.resolve(run_config)
    strategy.validate(cfg)
    return cfg, resume_dir
