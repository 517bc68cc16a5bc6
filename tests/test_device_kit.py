"""The device kit (devicekit/): a GPU session's finished runs come back as their small files, in
parts under the size a returned file may have."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from devicekit.gpu_sweep import pack


def fake_run(root, name: str, finished: bool) -> None:
    run = root / "exact" / "mnist10k_dir0.1" / name / "s0"
    (run / "tensorboard").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"round": 1}\n' * 50)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "identity.json").write_text("{}")
    (run / "provenance.json").write_text("{}")
    (run / "checkpoint.pt").write_bytes(os.urandom(50_000))
    (run / "checkpoint.pt.sha256").write_text("0" * 64)
    (run / "label_distribution.png").write_bytes(os.urandom(5_000))
    (run / "tensorboard" / "events.out").write_bytes(os.urandom(5_000))
    if finished:
        (run / "summary.json").write_text('{"final_test_accuracy": 0.9}')


def test_finished_runs_come_back_as_their_small_files_in_parts(tmp_path):
    root = tmp_path / "runs"
    for i in range(3):
        fake_run(root, f"row{i}", finished=True)
    fake_run(root, "unfinished", finished=False)
    parts, runs = pack(root, tmp_path / "out", part_bytes=300)
    assert len(runs) == 3 and len(parts) > 1
    assert all(p.stat().st_size <= 300 for p in parts)
    data = b"".join(p.read_bytes() for p in sorted(parts))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        names = sorted(tar.getnames())
    small = ["config.yaml", "identity.json", "metrics.jsonl", "provenance.json", "summary.json"]
    assert names == sorted(
        f"runs/exact/mnist10k_dir0.1/row{i}/s0/{f}" for i in range(3) for f in small
    )


def test_runs_that_need_more_parts_than_return_are_refused_with_a_line(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "row", finished=True)
    with pytest.raises(SystemExit, match="over 1 parts of"):
        pack(root, tmp_path / "out", part_bytes=100, max_parts=1)
