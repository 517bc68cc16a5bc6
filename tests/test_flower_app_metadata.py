"""The app as Flower's app format and Hub read it: FAB format 1, the Flower version it targets,
the licence file, and the installed Flower within the declared range."""

import tomllib
from importlib import metadata
from pathlib import Path

from flwr.supercore.fab_format_version import normalize_and_validate_fab_format
from packaging.requirements import Requirement

PROJECT = Path(__file__).resolve().parents[1]


def test_the_app_declares_fab_format_1_and_flower_accepts_it():
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    meta = normalize_and_validate_fab_format(config)
    assert meta.fab_format_version == 1
    assert (meta.flwr_version_min, meta.flwr_version_target) == ("1.41.0", "1.41.0")
    assert "Apache License" in (PROJECT / config["project"]["license"]["file"]).read_text()
    flwr = next(r for r in map(Requirement, config["project"]["dependencies"]) if r.name == "flwr")
    assert metadata.version("flwr") in flwr.specifier
