"""When two finished runs are a pair: the rule `feddb report`, `feddb claims` and the cause study
all pair seeds by, stated once. A paired difference removes what the two runs share (the seed's
data split, initial model and draws), so the two must share all of it: the seed and the partition,
the kind of device (another one sums floats in another order, and in a chaotic regime that alone
moves a run by points), and the warm-up (the same global model, round by round, entering the
semi-supervised rounds). A run is a record of feddb.report.read_run: its `cfg`, its `rounds` and
its `provenance`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# the configuration a client's data are drawn from (fssl/partition.py, the validation split): keys
# and groups of keys, dotted
PARTITION_KEYS = (
    *("dataset.name", "dataset.num_labeled", "dataset.val_size", "dataset.val_seed"),
    *("partition.", "scenario.", "fl.num_clients"),
)
# the scores (fssl.record.Scores) of each warm-up round's global model: equal only for the same model
WARMUP_KEYS = ("test_accuracy", "val_accuracy", "class_accuracy", "top_class_share")


def device_kind(run: dict[str, Any]) -> str:
    """The kind of device a run computed on: the device type and, where the provenance names it,
    the machine (an H100 and an H200, or an AMD EPYC and an Intel Xeon, sum floats in other
    orders)."""
    prov = run.get("provenance") or {}
    device = str(prov.get("device", "cpu")).split(":")[0]
    hardware = str(prov.get("hardware", "")).split(",")[0]
    return f"{device} ({hardware})" if hardware else device


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested configuration as {dotted key: value}."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def partition_differs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The partition's keys whose values differ between configurations `a` and `b`; a key one of
    them lacks (added by a later version of the project, at the value built in before) is left
    out."""
    fa, fb = flat(a), flat(b)
    return [
        k for k in sorted(fa.keys() & fb.keys()) if k.startswith(PARTITION_KEYS) and fa[k] != fb[k]
    ]


def warmup_differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether the two runs' warm-ups differ: in length, or in a recorded global model."""
    warm = a["cfg"]["train"]["warmup_rounds"]
    if warm != b["cfg"]["train"]["warmup_rounds"]:
        return True
    ka = {r.round: r.scores for r in a["rounds"] if r.round <= warm}
    kb = {r.round: r.scores for r in b["rounds"] if r.round <= warm}
    return ka.keys() != kb.keys() or any(
        getattr(ka[n], k) != getattr(kb[n], k) for n in ka for k in WARMUP_KEYS
    )


def pairable(a: dict[str, Any], b: dict[str, Any], varied: Iterable[str] = ()) -> str | None:
    """None when runs `a` and `b` are a pair, else why not, in words. `varied`: the configuration
    keys the comparison itself flips (the cause study's factors), which may then differ: a
    partition key, or `train.warmup_rounds` for the warm-up. Keys one run's version of the project
    lacked are not held against it."""
    varied = set(varied)
    if a["cfg"]["seed"] != b["cfg"]["seed"]:
        return f"seeds {a['cfg']['seed']} and {b['cfg']['seed']}"
    split = [k for k in partition_differs(a["cfg"], b["cfg"]) if k not in varied]
    if split:
        return f"their partitions differ ({', '.join(split)})"
    if device_kind(a) != device_kind(b):
        return f"they ran on two kinds of device ({device_kind(a)}; {device_kind(b)})"
    if "train.warmup_rounds" not in varied and warmup_differs(a, b):
        return "their warm-ups differ"
    return None
