"""The `feddb` command: every tool behind one entry point, each with --help."""

import subprocess
import sys
from pathlib import Path

import pytest

from feddb.cli import COMMANDS, main

PROJECT = Path(__file__).resolve().parents[1]


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("run", "local", "sweep", "report", "ladder", "attacks", "bench", "deploy"):
        assert f"  {cmd}" in out


def test_an_unknown_subcommand_says_which_exist(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "report" in err


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_subcommand_has_help(cmd):
    res = subprocess.run([sys.executable, "-m", "feddb.cli", cmd, "--help"], cwd=PROJECT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert ("usage" in res.stdout.lower()) or ("powered by hydra" in res.stdout.lower())
