"""The `feddb` command: every tool behind one entry point, each with --help."""

import subprocess
import sys
from pathlib import Path

import pytest

from feddb.cli import COMMANDS, NO_ARGV, main

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
def test_every_subcommand_has_help(cmd, capsys):
    if cmd in NO_ARGV:  # they read sys.argv (Hydra): a process of their own
        res = subprocess.run(
            [sys.executable, "-m", "feddb.cli", cmd, "--help"],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        code, out = res.returncode, res.stdout
    else:
        try:
            code = main([cmd, "--help"])
        except SystemExit as done:  # argparse's --help
            code = done.code or 0
        out = capsys.readouterr().out
    assert code == 0
    assert ("usage" in out.lower()) or ("powered by hydra" in out.lower())


def test_round_lines_become_a_progress_bar():
    from feddb.launch import progress_bar

    line = (
        "INFO :      [feddb] round  12/40  test acc 0.9120  val acc 0.9080  loss 0.31  "
        "pl ratio 0.50  top class 0.12  2.1s/round  eta 1m20s"
    )
    assert progress_bar(line) == (
        "[#######-----------------] round 12/40  test 91.2 %  val 90.8 %  eta 1m20s"
    )
    assert progress_bar("INFO : Starting Flower ServerApp") is None


def test_sweep_counts_its_combinations():
    from feddb.sweep import count_jobs

    params = {"row": "fedavg,fixmatch,feddb", "seed": "0,1,2,3,4"}
    assert count_jobs(params, ["sweep=mnist_miniature"]) == 15
    assert count_jobs(params, ["sweep=mnist_miniature", "seed=3,4"]) == 6
    assert count_jobs({"seed": "range(0,3)"}, []) == 0
