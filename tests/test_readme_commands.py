"""Every `feddb` command the README shows works as typed: its subcommand exists, takes every
option the README gives it (its --help lists them), and a run-config it carries resolves."""

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from feddb.cli import COMMANDS
from feddb.cli import main as feddb

README = Path(__file__).resolve().parents[1] / "README.md"


def commands() -> list[str]:
    """`feddb ...` in backticks and in fenced blocks ("feddb bench`, `overhead`" lists: the first)."""
    text = README.read_text()
    spans = re.findall(r"`((?:\.venv/bin/)?feddb [^`]+)`", text)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        spans += [line for line in block.replace("\\\n", " ").splitlines() if "feddb " in line]
    return sorted({s.split("#")[0].strip() for s in spans if "<command>" not in s})


def help_of(argv: list[str]) -> str:
    out, saved = io.StringIO(), list(sys.argv)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            feddb([*argv, "--help"])
    finally:
        sys.argv = saved
    return out.getvalue()


@pytest.mark.parametrize("command", commands())
def test_a_readme_command_works_as_typed(command):
    words = shlex.split(command)
    words = words[words.index(next(w for w in words if w.endswith("feddb"))) + 1 :]
    assert words[0] in COMMANDS, f"README: no command '{words[0]}' in: {command}"
    sub = words[:2] if words[0] == "deploy" else words[:1]
    text = help_of(sub)
    assert f"usage: feddb {' '.join(sub)}" in text or words[0] == "sweep", text[:200]
    for option in (w.split("=")[0] for w in words if w.startswith("--")):
        assert option in text, f"README's `{command}`: {option} is not an option of {sub}"
    if "--run-config" in words:
        from feddb.launch import preflight

        preflight(words[words.index("--run-config") + 1])  # resolves: no ConfigError


def test_the_readme_shows_its_commands():
    found = {shlex.split(c)[1] for c in commands()}
    assert {"run", "local", "sweep", "report", "claims", "deploy"} <= found


def test_every_subcommand_names_itself_and_every_option_says_what_it_does(monkeypatch):
    """`feddb <command> --help` (and deploy's subcommands): the usage line carries the command,
    and no option is without help text."""
    import argparse

    bare = []
    original = argparse._ActionsContainer.add_argument

    def recording(self, *args, **kwargs):
        action = original(self, *args, **kwargs)
        if not action.help and action.dest not in ("help", "cmd"):
            bare.append((getattr(self, "prog", "?"), action.option_strings or action.dest))
        return action

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", recording)
    for cmd in COMMANDS:
        subs = (
            [[cmd, s] for s in ("certs", "keys", "export", "local")] if cmd == "deploy" else [[cmd]]
        )
        for argv in subs:
            text = help_of(argv)
            assert cmd == "sweep" or f"usage: feddb {' '.join(argv)}" in text, text[:300]
    assert not bare, f"options without help: {bare}"


def test_a_finished_runs_directory_is_refused_and_left_byte_for_byte(tmp_path, capsys):
    from conftest import TINY

    from feddb.inprocess import main as local_main

    rc = f"num-server-rounds=1 output-dir='{tmp_path / 'run'}' overrides='{' '.join(TINY)}'"
    assert local_main(["--run-config", rc]) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert local_main(["--run-config", rc.replace("num-server-rounds=1", "seed=5")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: output-dir") and "holds a run" in err and "resume=" in err
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before
