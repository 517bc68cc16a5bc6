"""A user's method by path (the worked examples in docs/examples/: a soft-weighting method, and a
soft-target one with per-image state): loaded by file or module with its class's defaults and no
YAML, checked before anything runs, trained by the project's clients in the in-process engine
(pseudo-labels online, DPL and DMA on), through a real `flwr run` started from a directory outside
the project (pseudo-labels once a round, DPL on), and through a sweep of the two and its report;
their own per-client figures and a non-zero pseudo-label ratio reach metrics.jsonl and the
report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from itertools import takewhile
from pathlib import Path

import pytest
import torch
from conftest import TINY, flower_pids

from fssl.checks import ConfigError
from fssl.config import run_config_to_overrides
from fssl.instruction import Instruction
from fssl.methods import method_class
from fssl.methods.fixmatch import FixMatch
from fssl.runtime import client_data_for, data_meta, dataset_for
from server_app.config import compose

PROJECT = Path(__file__).resolve().parents[1]
EXAMPLE = PROJECT / "docs" / "examples" / "confidence_weighted.py"
SPEC = f"{EXAMPLE}:ConfidenceWeighted"
SOFT = PROJECT / "docs" / "examples" / "soft_targets.py"


def user_cfg(*extra: str) -> dict:
    overrides = run_config_to_overrides({"method": SPEC})
    cfg = compose(TINY + overrides + ["train.tau=0.3", *extra])
    cfg["data_meta"] = data_meta(dataset_for(cfg))
    return cfg


def test_a_user_method_loads_by_file_and_by_module_with_its_class_defaults(monkeypatch):
    by_file = method_class(SPEC)
    assert issubclass(by_file, FixMatch) and by_file.display == "FixMatch (confidence-weighted)"
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    by_module = method_class("confidence_weighted:ConfidenceWeighted")
    assert by_module.__name__ == "ConfidenceWeighted"
    cfg = user_cfg()
    assert cfg["method"]["name"] == "ConfidenceWeighted" and cfg["method"]["trainer"] == SPEC
    assert cfg["train"]["lr"] == compose(TINY + ["method=fixmatch"])["train"]["lr"]  # its family's
    # no YAML: its class's defaults, and the user's value where given
    assert cfg["method"]["pseudo_labels"] == "online" and cfg["method"]["power"] == 2.0
    assert user_cfg("+method.power=3")["method"]["power"] == 3


def test_its_own_parameters_are_checked_and_its_weights_change_training():
    with pytest.raises(ConfigError, match=r"`method.power`: -1"):
        compose(run_config_to_overrides({"method": SPEC, "overrides": "+method.power=-1"}))

    def fit(cfg):
        from fssl.methods import make_model, make_trainer

        torch.manual_seed(0)
        model = make_model(cfg, 10, 1)
        t = make_trainer(
            cfg, cfg["data_meta"]["mean"], cfg["data_meta"]["std"], torch.device("cpu")
        )
        return t.fit(model, client_data_for(cfg, 1, torch.device("cpu")), Instruction(0.1, seed=7))

    weighted = fit(user_cfg("train.tau=0.95", "train.warmup_rounds=0"))
    assert 0 < weighted["method"]["mean_weight"] < 1  # its own figure of the round
    assert weighted["pseudo_label_count"] > 0 and 0 < weighted["pseudo_label_ratio"] < 1
    plain = compose(TINY + ["method=fixmatch", "train.tau=0.95", "method.pseudo_labels=online"])
    plain["data_meta"] = data_meta(dataset_for(plain))
    assert fit(plain)["loss_unsup"] != weighted["loss_unsup"]


def test_a_soft_target_method_runs_in_the_in_process_engine_with_dpl_and_dma(tmp_path, monkeypatch):
    """`feddb local` from the user's own directory, the method imported as a module there; its
    targets made online (its default), its record per image kept across its rounds."""
    from feddb.inprocess import main as local_main

    method = outside(tmp_path, SOFT)
    monkeypatch.chdir(method.parent)
    monkeypatch.syspath_prepend(str(method.parent))
    out = tmp_path / "run"
    rc = (
        "method='my_method:SharpenedTargets' dpl=true dma=true num-server-rounds=2 "
        f"output-dir='{out}' overrides='{' '.join(TINY)} train.warmup_rounds=1'"
    )
    assert local_main(["--run-config", rc]) == 0
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and rounds[1]["dma"]  # DMA composes with it
    assert rounds[0]["clients"][0]["method"] == {}  # the warm-up round makes no targets
    assert rounds[0]["pseudo_label_ratio"] == 0 and rounds[1]["pseudo_label_ratio"] > 0
    for c in rounds[1]["clients"]:  # its figures: of the round's steps, and of its images
        assert c["pseudo_label_ratio"] > 0 and 0 < c["method"]["ever_kept"] <= 1
        assert 0 < c["method"]["target_entropy"] < 2.31  # sharpened: below log(10)


def user_env(tmp_path: Path) -> dict[str, str]:
    from feddb.resources import free_port

    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env.update(
        FLWR_HOME=str(tmp_path / "home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
    )
    return env


def outside(tmp_path: Path, example: Path = EXAMPLE, name: str = "my_method") -> Path:
    """An example copied into the user's own directory, not the project's."""
    mine = tmp_path / "my_project"
    mine.mkdir(exist_ok=True)
    shutil.copy(example, mine / f"{name}.py")
    return mine / f"{name}.py"


@pytest.mark.slow
def test_a_soft_target_method_trains_through_flwr_run_from_outside_the_project(tmp_path):
    """Its targets made once a round from the received model (three epochs a round: an averaged
    model is confident enough for some), DPL dividing them before they are sharpened; its
    declared key set without `+`."""
    method = outside(tmp_path, SOFT)
    out = tmp_path / "run"
    env = user_env(tmp_path)
    rc = (
        f"method='{method}:SharpenedTargets' dpl=true num-server-rounds=2 "
        f"output-dir='{out}' overrides='fl.num_clients=2 fl.fraction_train=1.0 "
        "dataset.num_labeled=200 train.warmup_rounds=1 train.local_epochs=3 train.tau=0.4 "
        "method.temperature=0.5 method.pseudo_labels=round'"
    )
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        res = subprocess.run(
            [flwr, "run", str(PROJECT), "--stream", "--run-config", rc],
            cwd=method.parent,
            env=env,
            text=True,
            capture_output=True,
            timeout=400,
        )
    finally:
        for pid in flower_pids(tmp_path / "home"):
            os.kill(pid, 15)
    log = res.stdout[-3000:] + res.stderr[-3000:]
    assert (out / "metrics.jsonl").is_file(), log  # (`flwr run --stream` exits 0 on failure too)
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and len(rounds[1]["clients"]) == 2, log
    for c in rounds[1]["clients"]:
        assert c["pseudo_label_ratio"] > 0 and 0 < c["method"]["ever_kept"] <= 1
    import yaml

    text = (out / "config.yaml").read_text()
    saved = yaml.safe_load(text)
    assert saved["method"]["name"] == "SharpenedTargets" and saved["method"]["temperature"] == 0.5
    assert saved["method"]["pseudo_labels"] == "round" and saved["train"]["tau"] == 0.4
    # DPL ran; the method's own default (off) beside it, and the file says which is which
    assert saved["dpl"] is True and saved["method"]["dpl"] is False
    assert text.startswith("# The run's resolved configuration. It ran with DPL as `dpl` says")


def test_a_sweep_runs_methods_by_path_side_by_side_and_the_report_names_them(tmp_path):
    """`feddb sweep` takes the methods' paths as rows (in process, from outside the project), and
    `feddb report` names their runs by the classes' display names and tables their own figures
    and pseudo-label ratios."""
    weighted = f"{outside(tmp_path)}:ConfidenceWeighted"
    soft = f"{outside(tmp_path, SOFT, 'my_soft')}:SharpenedTargets"
    out = tmp_path / "sweep"
    overrides = f"{' '.join(TINY)} train.warmup_rounds=0 model.width=8"
    cmd = [
        sys.executable,
        "-m",
        "feddb.sweep",
        "-m",
        f"row={soft},{weighted}",
        "seed=0",
        f"out={out}",
        "launcher=[python,-m,feddb.inprocess]",
        f"run_config=num-server-rounds=2 overrides='{overrides}'",
    ]
    res = subprocess.run(
        cmd, cwd=tmp_path / "my_project", env=user_env(tmp_path), text=True, capture_output=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = sorted(p.parent.parent.name for p in out.rglob("s0/summary.json"))
    assert runs[0].startswith("ConfidenceWeighted-") and runs[1].startswith("SharpenedTargets-")
    from feddb.report import main as report

    assert report([str(out), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "results.md").read_text()
    assert "FixMatch (confidence-weighted) | mean_weight |" in text
    assert "Sharpened soft targets | ever_kept |" in text
    assert "Sharpened soft targets | target_entropy |" in text
    lines = text.splitlines()  # the pseudo-label table: each method's ratio, % (mean(std))
    head = next(i for i, line in enumerate(lines) if "pseudo-label ratio, %" in line)
    column = lines[head].split(" | ").index("pseudo-label ratio, % (same rounds)")
    table = [line.split(" | ") for line in takewhile(str.strip, lines[head + 2 :])]
    ratios = {cells[1]: float(cells[column].partition("(")[0]) for cells in table}
    assert ratios.keys() == SHOWN and all(r > 0 for r in ratios.values()), ratios


SHOWN = {"FixMatch (confidence-weighted)", "Sharpened soft targets"}


def test_a_class_whose_hooks_its_base_never_calls_is_refused_and_told_its_base(tmp_path):
    (tmp_path / "wrong.py").write_text(
        "from fssl.methods.base import LocalTrainer\n\n\n"
        "class OnLabelsOnly(LocalTrainer):\n"
        "    def select(self, probs, idx, learn, raw=None):\n"
        "        return probs.max(1)[1], probs.max(1)[0]\n\n\n"
        "class NoHooks:\n"
        "    def select(self, probs, idx, learn, raw=None):\n"
        "        return None\n"
    )
    with pytest.raises(ConfigError, match="defines select, which its base LocalTrainer never"):
        method_class(f"{tmp_path / 'wrong.py'}:OnLabelsOnly")
    with pytest.raises(ConfigError, match="subclass fssl.methods.fixmatch.FixMatch \\(a pseudo"):
        method_class(f"{tmp_path / 'wrong.py'}:NoHooks")


def test_a_run_inside_the_warm_up_says_so_before_it_starts(tmp_path, capsys):
    from feddb.inprocess import main as local_main

    rc = f"num-server-rounds=1 output-dir='{tmp_path / 'run'}' overrides='{' '.join(TINY)}'"
    assert local_main(["--run-config", rc]) == 0  # the default preset: 10 warm-up rounds
    out = capsys.readouterr().out
    warning = out.index("rounds fall inside the labels-only warm-up (train.warmup_rounds=10)")
    assert warning < out.index("[feddb] round   1")


def test_a_deployed_node_runs_a_user_method_only_where_its_operator_allowed_it(tmp_path):
    """A method by path runs code from the node's disk that the installed app does not hold: a
    SuperNode with its own data refuses it unless its node_config allows that path."""
    from test_client_app import _run

    from fssl.data import write_client_files
    from fssl.runtime import partition_for

    cfg = compose(TINY + run_config_to_overrides({"method": SPEC}) + ["train.tau=0.1"])
    part = partition_for(cfg)
    files = write_client_files(dataset_for(cfg), part.labeled, part.unlabeled, tmp_path)
    own = {"data-path": str(files[1])}
    _, refused = _run(cfg, pid=1, node_config=own)  # an error reply, its traceback in it
    assert refused.has_error() and "PermissionError" in refused.error.reason
    assert "allow-methods" in refused.error.reason
    _, allowed = _run(cfg, pid=1, node_config={**own, "allow-methods": SPEC})
    assert not allowed.has_error(), allowed.error.reason if allowed.has_error() else ""
    _, simulated = _run(cfg, pid=1)  # a simulation's nodes are the user's own processes
    assert not simulated.has_error()


def test_a_subclass_of_a_method_that_calls_select_may_define_it(tmp_path):
    """SemiFL's round calls `select` too: a user's SemiFL with its own rule is not refused."""
    (tmp_path / "semi.py").write_text(
        "from fssl.methods.semifl import SemiFL\n\n\n"
        "class MySemi(SemiFL):\n"
        "    def select(self, probs, idx, learn, raw=None):\n"
        "        return super().select(probs, idx, learn, raw)\n"
    )
    assert method_class(f"{tmp_path / 'semi.py'}:MySemi").__name__ == "MySemi"


def test_keys_a_class_declares_are_set_without_plus_and_its_train_defaults_yield(tmp_path):
    """`defaults` declares `method.<key>`s (set as any key is) and the global keys its YAML could
    set: those act where the YAML would, under the experiment preset and the command line."""
    (tmp_path / "tempered.py").write_text(
        "from fssl.methods.fixmatch import FixMatch\n\n\n"
        "class Tempered(FixMatch):\n"
        '    defaults = {"temperature": 0.4, "train.tau": 0.8}\n'
    )
    base = [*TINY[:-1], *run_config_to_overrides({"method": f"{tmp_path}/tempered.py:Tempered"})]
    cfg = compose(base)  # (TINY[-1] sets train.tau)
    assert cfg["method"]["temperature"] == 0.4 and cfg["train"]["tau"] == 0.8
    cfg = compose([*base, "method.temperature=0.5", "train.tau=0.7"])
    assert cfg["method"]["temperature"] == 0.5 and cfg["train"]["tau"] == 0.7
    assert compose([*base, "+method.temperature=0.6"])["method"]["temperature"] == 0.6
    # the preset sets 0.95, conf/config.yaml's value too: still the preset's
    assert compose([*base, "experiment=miniature_authors_exact"])["train"]["tau"] == 0.95
    with pytest.raises(ConfigError) as err:
        compose([*base, "method.nonsense=1"])
    assert str(err.value).startswith("unknown key `method.nonsense` in overrides (a typo?): ")
    assert "Tempered declares temperature in its class's `defaults`" in str(err.value)
    assert "declare it in the class's `defaults`" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "typo.py").write_text(
        "from fssl.methods.fixmatch import FixMatch\n\n\n"
        "class Typo(FixMatch):\n"
        '    defaults = {"train.tua": 0.8}\n'
    )
    with pytest.raises(ConfigError, match=r"Typo.defaults sets `train.tua`, a key the conf"):
        compose([*TINY, *run_config_to_overrides({"method": f"{tmp_path}/typo.py:Typo"})])


def test_a_built_in_method_takes_the_keys_its_class_declares(monkeypatch):
    monkeypatch.setattr(FixMatch, "defaults", {"temperature": 0.4})
    assert compose([*TINY, "method=fixmatch"])["method"]["temperature"] == 0.4
    cfg = compose([*TINY, "method=fixmatch", "method.temperature=0.5"])
    assert cfg["method"]["temperature"] == 0.5
    cfg = compose([*TINY, "method=fixmatch", "+method.temperature=0.6"])
    assert cfg["method"]["temperature"] == 0.6
    with pytest.raises(ConfigError, match=r"method FixMatch declares temperature in its class"):
        compose([*TINY, "method=fixmatch", "method.nonsense=1"])
    with pytest.raises(ConfigError, match=r"adds `method.nonsense`, a key the configuration"):
        compose([*TINY, "method=fixmatch", "+method.nonsense=1"])
