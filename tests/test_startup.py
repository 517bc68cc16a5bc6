"""The start-up timeline (fssl/profiling.py) and `feddb startup`'s table."""

import json
import os
import subprocess
import sys
import time

from fssl.profiling import Timeline, ancestor_start, process_start


def test_process_start_is_this_process_start():
    started = process_start()
    assert started is not None and started <= time.time()
    assert time.time() - started < 3600                 # this test's own process, not the boot
    assert process_start(10 ** 9) is None               # no such process


def test_ancestor_start_finds_the_named_parent_process():
    marker = "feddb_marker_parent_xyz"
    child = ("import json, sys; from fssl.profiling import ancestor_start, process_start; "
             "print(json.dumps([ancestor_start(sys.argv[1]), ancestor_start('no-such-' + 'name-q')]))")
    parent = (f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
              f"{child!r}, {marker!r}]))")
    before = time.time()
    res = subprocess.run([sys.executable, "-c", parent, marker], capture_output=True, text=True,
                         check=True)
    found, missing = json.loads(res.stdout)
    assert missing is None
    assert before - 0.05 <= found <= time.time()        # the parent started in this window


def test_timeline_marks_in_order_and_writes_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDB_LAUNCH_TIME", "123.5")
    t = Timeline()
    assert t.marks["launch"] == 123.5 and t.marks["superlink_start"] is None   # no SuperLink here
    t.mark("data_ready")
    t.write(tmp_path / "startup.json")
    t.mark("later")
    t.write(tmp_path / "startup.json")
    saved = json.loads((tmp_path / "startup.json").read_text())
    assert "later" not in saved and saved["server_main"] <= saved["data_ready"]
    assert saved["process_start"] <= saved["server_main"]


def test_startup_table_gives_medians_since_the_launcher_and_the_superlink(monkeypatch, capsys):
    import feddb.startup as st

    def fake(out, home, rc, k=iter(range(10))):
        i = next(k)
        return {"launch": 100.0, "superlink_start": 102.0, "process_start": 105.0,
                "server_main": 108.0, "data_ready": 109.0, "nodes_bound": 112.0 + i,
                "first_round_sent": 112.6 + i,
                "first_round_done": 114.0 + i}

    monkeypatch.setattr(st, "one_run", fake)
    assert st.main(["--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "| round 1 aggregated, evaluated and recorded | 15.0 (14.0-16.0) | 13.0 (12.0-14.0) |" in out
    assert "| SuperLink process started (by `flwr run`) | 2.0 (2.0-2.0) | 0.0 (0.0-0.0) |" in out
    assert st.main(["--repeat", "0"]) == 2


def test_the_lean_app_copy_builds_the_same_fab_without_walking_the_venv(tmp_path):
    """`flwr run` is pointed at a copy without .venv, runs/ and the like: same FAB, byte for byte."""
    from pathlib import Path

    from flwr.cli.build import build_fab_from_disk

    from feddb.launch import PROJECT, lean_app

    (PROJECT / "runs").mkdir(exist_ok=True)          # ignored output: must not reach the copy
    stage = lean_app(PROJECT, tmp_path / "stage")
    copied = {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}
    assert "pyproject.toml" in copied and "strategy/base.py" in copied
    assert not any(p.split("/")[0] in (".venv", ".git", "runs", ".flwr-home") for p in copied)
    assert build_fab_from_disk(stage) == build_fab_from_disk(Path(PROJECT))
