"""Test helpers over the in-process engine (feddb.inprocess)."""

from __future__ import annotations

from feddb.inprocess import LocalGrid, run_in_process  # noqa: F401


def metrics_without_timing(run_dir) -> list[dict]:
    import json

    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("round_seconds")
        r.pop("timing", None)
        for c in r["clients"]:
            for key in (
                "train_seconds",
                "setup_seconds",
                "reply_seconds",
                "process_seconds",
                "relay_seconds",
            ):
                c.pop(key, None)
        out.append(r)
    return out
