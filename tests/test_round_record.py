"""A line of metrics.jsonl is one fssl.record.RoundMetrics: written and read back the same, a
method's other notes kept under `method_notes`, and lines of older runs (the trimmed records in
docs/*/runs.tar.xz included) read with the fields they lack at their defaults."""

from __future__ import annotations

import json
import math

from fssl.record import RoundMetrics, Scores, run_summary
from server_app.recorder import method_notes


def test_a_record_reads_back_as_written_with_the_scores_at_the_top_level():
    record = RoundMetrics(
        3,
        Scores(test_accuracy=0.5, test_loss=math.nan, class_accuracy=[0.4, 0.6]),
        lr=0.1,
        **method_notes({"groups": [[0, 1]], "temperature": 2.0}),
    )
    line = json.loads(record.to_json())
    assert list(line)[:4] == ["round", "evaluated", "test_accuracy", "test_loss"]
    assert line["evaluated"] and line["test_loss"] is None  # NaN: null
    assert line["groups"] == [[0, 1]] and line["helpers"] is None
    assert line["method_notes"] == {"temperature": 2.0}
    assert RoundMetrics.from_json(record.to_json()).to_dict() == line
    plain = RoundMetrics(4, **method_notes({})).to_dict()
    assert "method_notes" not in plain and not plain["evaluated"]


def test_an_older_trimmed_line_reads_with_defaults_and_counts_in_the_summary():
    old = {"round": 2, "test_accuracy": 0.8, "val_accuracy": 0.7, "clients": [], "gone": 1}
    record = RoundMetrics.from_dict(old)
    assert record.evaluated and record.scores.test_loss is None and record.timing == {}
    summary = run_summary([RoundMetrics(1), record])
    assert summary["final_test_accuracy"] == 0.8 and summary["selected_round"] == 2
    assert summary["rounds"] == 2 and summary["evaluated_rounds"] == 1
