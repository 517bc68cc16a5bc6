"""Configuration: Hydra composition of `conf/`, Flower run-config mapping, and validation.

Flower passes flat scalar run-config keys; Hydra is used through its compose API (no argv, no cwd
change) so the same YAML tree drives `flwr run`, the tests and the launcher.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from .checks import (
    GROUPS,
    RUN_CONFIG_TARGETS,
    ConfigError,
    boolean,
    choice,
    integer,
    integers,
    lookup,
    mapping,
    number,
    numbers,
    path_string,
)
from .identity import IDENTITY_KEYS, selection_of
from .methods import check_method, declared, fill_defaults, method_class
from .partition import POOL_ORDERS
from .plugins import is_path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PYPROJECT = CONF_DIR.parent / "pyproject.toml"


def group_options(group: str) -> list[str]:
    """Names selectable in a config group, e.g. ['cnn', 'wrn28_2'] for 'model'."""
    root = CONF_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def run_config_defaults() -> dict[str, Any]:
    """The run-config keys and their defaults, as pyproject.toml declares them for Flower."""
    import tomllib

    with open(PYPROJECT, "rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


def given(run_config: dict[str, Any]) -> dict[str, Any]:
    """The keys a run-config sets away from their declared defaults (an empty string, as in run
    configs saved before the keys were typed, also means the default)."""
    defaults = run_config_defaults()
    return {
        k: v
        for k, v in run_config.items()
        if v != "" and not (k in defaults and v == defaults[k] and type(v) is type(defaults[k]))
    }


def run_config_to_overrides(run_config: dict[str, Any]) -> list[str]:
    """Translate Flower run-config keys (pyproject `[tool.flwr.app.config]`) to Hydra overrides.
    A key at its declared default keeps conf/'s value."""
    rc = given(run_config)
    unknown = sorted(set(rc) - set(RUN_CONFIG_TARGETS) - {"overrides", "resume", *IDENTITY_KEYS})
    if unknown:
        raise ConfigError(
            f"unknown run-config key(s) {unknown}: the keys are "
            f"{', '.join(run_config_defaults())} (pyproject.toml)"
        )
    selection_of(str(rc.get("selection", "")))  # a selection that is not key=value: refused here
    out: list[str] = []
    for key, target in RUN_CONFIG_TARGETS.items():
        if key in rc:
            value = rc[key]
            if key == "method" and isinstance(value, str) and ":" in value:
                out.extend(user_method(value))
                continue
            out.append(f"{target}={value if key in GROUPS else _hydra_value(value)}")
    extra = rc.get("overrides", "")
    if extra:
        out.extend(shlex.split(str(extra)))
    return out


def user_method(spec: str) -> list[str]:
    """`method='pkg.module:Class'` (or '/path/file.py:Class'): the defaults of
    conf/method/custom.yaml with the class as the trainer, named after it."""
    name = spec.rpartition(":")[2]
    return [
        "method=custom",
        f"method.trainer={_hydra_value(spec)}",
        f"method.name={_hydra_value(name)}",
    ]


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # Quote so that paths with '=' or ':' survive Hydra's override grammar.
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def compose(overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose `conf/config.yaml` with Hydra overrides and return a validated plain dict."""
    overrides = list(overrides or [])
    cls = chosen_method(overrides)
    keys = declared(cls)
    _check_group_choices(overrides, keys)
    data = _hydra(set_declared(overrides, keys), cls)
    for item in overrides:  # `++key=value` sets a key that exists; it may not add one
        name = item.partition("=")[0]
        if name.startswith("++") and not (
            name[2:] == "partition.partitioner"
            or name[2:].startswith(PREFIXES)
            or method_key(name[2:]) in keys
        ):
            base = compose([o for o in overrides if not o.startswith("++")])
            try:
                parent, key = lookup(base, name[2:])
                parent[key]
            except (KeyError, TypeError):
                raise ConfigError(
                    f"override {item!r} adds `{name[2:]}`, a key the configuration does not "
                    "have (a typo?): the keys are in conf/config.yaml and docs/configuration.md"
                ) from None
    fill_defaults(data["method"])
    apply_class_globals(data, overrides)
    validate(data)
    return data


def _hydra(overrides: list[str], cls: type | None = None) -> dict[str, Any]:
    """Hydra's composition of conf/ with `overrides`, resolved (`cls`: the chosen method's class,
    whose declared keys an unknown `method.<key>`'s message names)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(override_error(err, cls)) from err
    finally:
        GlobalHydra.instance().clear()


def method_key(name: str) -> str | None:
    """`temperature` for `method.temperature` (or `method.temperature.x`); None outside method."""
    return name.split(".")[1] if name.startswith("method.") else None


def chosen_method(overrides: list[str]) -> type | None:
    """The method class the overrides choose, read without composing: `method.trainer=...`, else
    the trainer in the YAML of `method=<name>` (or of config.yaml's default); None where there is
    none yet (an unknown group option or a bad override is refused later, with its message)."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except HydraException:
        return None
    choices = {o.key_or_group: o.value() for o in parsed if not o.is_delete()}
    trainer = choices.get("method.trainer")
    if trainer is None:
        name = choices.get("method") or default_choice("method")
        path = CONF_DIR / "method" / f"{name}.yaml"
        if not isinstance(name, str) or not path.is_file():
            return None
        trainer = (yaml.safe_load(path.read_text()).get("method") or {}).get("trainer")
    return method_class(trainer) if trainer else None


def default_choice(group: str) -> str | None:
    """conf/config.yaml's choice for a config group (e.g. `feddb` for `method`)."""
    import yaml

    entries = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["defaults"]
    return next((e[group] for e in entries if isinstance(e, dict) and group in e), None)


def set_declared(overrides: list[str], keys: list[str]) -> list[str]:
    """The overrides with each `method.<key>=v` (or `+method.<key>=v`) of a key the class
    declares as `++method.<key>=v`: Hydra sets it whether or not the method's YAML has it."""
    out = []
    for item in overrides:
        name = item.partition("=")[0]
        declared_key = "=" in item and not name.startswith("~") and method_key(name.lstrip("+"))
        out.append("++" + item.lstrip("+") if declared_key in keys else item)
    return out


def apply_class_globals(data: dict[str, Any], overrides: list[str]) -> None:
    """The dotted keys of the class's `defaults` (e.g. `train.tau`), applied as its YAML would
    be: a key the command line sets, or the experiment preset sets, keeps that value."""
    trainer = data["method"].get("trainer")
    cls = method_class(trainer) if trainer else None
    dotted = {k: v for k, v in getattr(cls, "defaults", {}).items() if "." in k}
    if not dotted:
        return
    for path in dotted:
        try:
            parent, key = lookup(data, path)
            known = isinstance(parent, dict) and key in parent and not path.startswith("method.")
        except (KeyError, TypeError):
            known = False
        if not known:
            raise ConfigError(
                f"{cls.__name__}.defaults sets `{path}`, a key the configuration does not have "
                "(a typo?): the keys are in conf/config.yaml (a method's own go undotted)"
            )
    given = {o.partition("=")[0].lstrip("+~") for o in overrides}
    later = set_after_method(data["method"], dotted, overrides)
    for path, value in dotted.items():
        if path not in given and path not in later:
            parent, key = lookup(data, path)
            parent[key] = value  # as the method's YAML would have set it


UNSET = "<feddb: not set after the method>"


def set_after_method(method: dict[str, Any], paths: dict[str, Any], overrides: list[str]):
    """The `paths` that a config merged after the method's YAML (the experiment preset) sets:
    composed once more with a method group option that marks each of them unset (a value equal
    to conf/config.yaml's is still the preset's)."""
    from hydra.core.config_store import ConfigStore

    node: dict[str, Any] = {"method": dict(method)}
    for path in paths:
        *parents, key = path.split(".")
        inner = node
        for name in parents:
            inner = inner.setdefault(name, {})
        inner[key] = UNSET
    ConfigStore.instance().store(group="method", name="_class_probe", node=node, package="_global_")
    groups = [o for o in overrides if "." not in o.partition("=")[0]]
    probe = _hydra([o for o in groups if not o.startswith("method=")] + ["method=_class_probe"])
    return {p for p in paths if value_at(probe, p) != UNSET}


def value_at(cfg: dict[str, Any], path: str) -> Any:
    parent, key = lookup(cfg, path)
    return parent[key]


def override_error(err: Exception, cls: type | None = None) -> str:
    """Hydra's complaint about an override in one line, without the advice to add the key with
    `+` (refused: a typo would pass unnoticed); a `method.<key>` one names the keys the method's
    class declares (`cls`), and how to declare one."""
    first = str(err).strip().splitlines()[0]
    unknown = re.match(r"Could not override '([^']+)'", first)
    if unknown and unknown.group(1).startswith("method.") and cls is not None:
        return (
            f"unknown key `{unknown.group(1)}` in overrides (a typo?): method {cls.__name__} "
            f"declares {', '.join(declared(cls)) or 'no keys'} in its class's `defaults` (and "
            "its YAML's, if any, in conf/method/); to add one, declare it in the class's `defaults`"
        )
    if unknown:
        return (
            f"unknown key `{unknown.group(1)}` in overrides (a typo?): the keys are in "
            "conf/config.yaml and docs/configuration.md"
        )
    return f"invalid override: {first}"


def compose_from_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    return compose(run_config_to_overrides(run_config))


def resolve(run_config: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """The run's configuration and, with `resume=<run dir>`, that directory (its saved config)."""
    resume = str(run_config.get("resume", "") or "")
    if not resume:
        cfg = compose_from_run_config(run_config)
        check_output_dir(cfg.get("output_dir") or "")
        return cfg, None
    others = sorted(k for k in given(run_config) if k != "resume")
    if others:
        raise ConfigError(
            f"resume continues a run with its saved configuration; remove {others} "
            "from the run-config"
        )
    run_dir = Path(resume).expanduser().resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(
            f"cannot resume '{resume}': {saved} not found; `resume` takes the run "
            "directory of an earlier run"
        )
    if not ended_a_round(run_dir):
        raise ConfigError(
            f"cannot resume '{resume}': the run ended no round (it failed at start-up); start it "
            f"again with the command that made it (output-dir='{run_dir}' takes it again)"
        )
    import yaml

    cfg = yaml.safe_load(saved.read_text())
    try:
        validate(cfg)
    except (KeyError, TypeError) as err:
        raise ConfigError(f"{saved} is not a complete configuration ({err!r})") from err
    return cfg, run_dir


def check_output_dir(out: str) -> None:
    """A new run's directory must not hold another run (nothing of a run that ended a round is
    ever overwritten) nor anything else (files of the user's own), and must be creatable: no
    regular file on its path, a writable place. A run that never ended a round (a start-up
    failure) leaves nothing to keep: the same command may take its directory again."""
    if not out:
        return
    path = Path(out).expanduser().absolute()
    if (path / "config.yaml").is_file() and ended_a_round(path):
        raise ConfigError(
            f"output-dir '{out}' holds a run ({path / 'config.yaml'}): resume it with "
            f"resume='{path}', or choose another directory"
        )
    if path.is_dir() and not (path / "config.yaml").is_file() and any(path.iterdir()):
        first = sorted(p.name for p in path.iterdir())[0]
        raise ConfigError(
            f"output-dir '{out}' holds files that are not a run of this project (e.g. {first}), "
            "which the run would overwrite: choose a new or empty directory"
        )
    for part in [path, *path.parents]:
        if part.exists() and not part.is_dir():
            raise ConfigError(f"output-dir '{out}': {part} is a file, not a directory")
        if part.is_dir():
            if not os.access(part, os.W_OK | os.X_OK) or str(part).startswith("/proc"):
                raise ConfigError(
                    f"output-dir '{out}': cannot write in {part}; choose a directory you can write"
                )
            return


def resume_hint(run_dir: str | None, command: list[str]) -> str:
    """The one line of a run stopped by a signal: how to go on. `command`: the one that started
    it (`feddb run ...`), whose --run-config the line replaces with resume=<run_dir>."""
    if not run_dir:
        return "interrupted before the run had a directory: nothing to resume"
    path, kept = Path(run_dir), []
    for arg in command:
        if kept and kept[-1] == "--run-config":
            kept.pop()
        elif not arg.startswith("--run-config="):
            kept.append(arg)
    if any((path / name).is_file() for name in ("checkpoint.pt", "checkpoint.prev.pt")):
        resume = f"\"resume='{path}'\"" if shlex.quote(str(path)) == str(path) else ""
        resume = resume or shlex.quote(f"resume={shlex.quote(str(path))}")  # an unusual path
        return f"interrupted; resume with: {shlex.join(kept)} --run-config {resume}"
    if not ended_a_round(path):
        return f"interrupted before its first round: the same command starts it again in {path}"
    return (
        f"interrupted before its first checkpoint (checkpoint.every): {path} keeps its rounds; "
        "start it again with another output-dir"
    )


def interrupted_exit(err: KeyboardInterrupt, run_dir: str | None, command: list[str]) -> int:
    """A launcher stopped by a signal: its one line (resume_hint) and its exit status, 128 + the
    signal (fssl.profiling.Interrupted; 130, SIGINT's, for a plain KeyboardInterrupt)."""
    print(resume_hint(run_dir, command), file=sys.stderr, flush=True)
    return getattr(err, "code", 130)


def ended_a_round(run_dir: Path) -> bool:
    """A round's record in metrics.jsonl, or a checkpoint: the run is one to keep."""
    metrics = run_dir / "metrics.jsonl"
    return (metrics.is_file() and bool(metrics.read_text().strip())) or any(
        (run_dir / name).is_file() for name in ("checkpoint.pt", "checkpoint.prev.pt")
    )


# Where a `+key=value` override may add a key: the keyword arguments of a strategy and of a Flower
# Datasets partitioner (and the partitioner's name, absent from the Dirichlet presets), and a
# user's method's own parameters.
EXTENSIBLE = ("strategy.params.", "partition.params.", "partition.partitioner", "method.params.")
PREFIXES = tuple(e for e in EXTENSIBLE if e.endswith("."))


def _check_group_choices(overrides: list[str], keys: list[str]) -> None:
    # a method given by path has no YAML listing its keys: `+method.<key>` sets one of them, as
    # it sets a key a built-in method's class declares (`keys`)
    by_path = any(o.startswith("method.trainer=") and ":" in o for o in overrides)
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.lstrip("+~") in REMOVED:
            raise ConfigError(f"{key.lstrip('+~')} is gone: {REMOVED[key.lstrip('+~')]}")
        name = key.lstrip("+")
        extensible = (
            name == "partition.partitioner"
            or name.startswith(PREFIXES)
            or (by_path and name.startswith("method."))
            or method_key(name) in keys
        )
        if key.startswith("+") and not key.startswith("++") and not extensible:
            raise ConfigError(
                f"override {item!r} adds `{key.lstrip('+')}`, a key the configuration does not "
                "have (a typo?): the keys are in conf/config.yaml and docs/configuration.md; new "
                f"keys are taken only under {', '.join(EXTENSIBLE)} (and method. for a method "
                "given by path, or a key its class declares in `defaults`)"
            )
        key = key.lstrip("+~")
        if sep and key in GROUPS:
            options = group_options(key)
            if value not in options:
                raise ConfigError(
                    f"unknown {key} '{value}': choose one of {', '.join(options)}"
                    f" (run-config key `{key}`)"
                )


# Declarative checks: each key's rule is stated once, as a call such as
# `number(cfg, "train.tau", low=0, high=1, open_low=True)`, which looks the value up by its dotted
# path and, when the value breaks the rule, raises a message that words the same rule:
#     invalid value for `train.tau`: 1.5; allowed: a number with 0 < tau <= 1
# A call may name several paths that share the rule; it returns the value (a tuple for several).
# Besides the rule, every helper takes
#     default   the value of a key absent from runs saved before it existed (without a default,
#               an absent key is a KeyError: not a complete configuration)
#     nullable  null is allowed too (a string says what null means, e.g. "all")
#     also      values allowed besides the rule's, e.g. ("auto",)
#     note      words that follow the rule's description, e.g. "(1: evaluate every round)"

# Keys that are gone -> why, and what to do with a saved run that has one.
REMOVED = {
    "server.robust.loss_check_scope": "server.robust.scope (deployment, always) now places every defence. A run saved with it "
    "ran the norm bound and the agreement filter in simulations too; resume it with the code "
    "it was made with (its provenance.json, or commit cd84422), or start it anew",
}


def refuse_removed(cfg: dict[str, Any]) -> None:
    """A key of REMOVED in cfg (a run saved before it went) stops the run with its reason."""
    for path, why in REMOVED.items():
        parent, key = lookup(cfg, path)
        if key in parent:
            raise ConfigError(f"{path} is gone: {why}")


def validate(cfg: dict[str, Any]) -> None:
    """Check types and ranges of the resolved configuration before anything runs (see above);
    the first value out of range, in this order, stops it."""
    refuse_removed(cfg)
    check_run(cfg)
    check_federation(cfg)
    check_training(cfg)
    check_server(cfg)
    check_partition(cfg)
    check_model_and_data(cfg)
    check_method(cfg["method"])
    check_logging_and_eval(cfg)


def check_run(cfg: dict[str, Any]) -> None:
    """The run itself: seed, rounds, the method's two switches, device, output directory."""
    integer(cfg, "seed", low=0, high=2**32 - 1)  # numpy's seeds are 32-bit
    integer(cfg, "num_rounds", low=1)
    boolean(cfg, "dpl", "dma.enabled")  # the method's two switches
    if (
        choice(cfg, "dpl_prior", ("local", "global"), default="local") == "global"
        and not cfg["dpl"]
    ):
        raise ConfigError(
            "dpl_prior=global sets what DPL divides by, and DPL is off in this run: add "
            "dpl=true, or drop dpl_prior"
        )
    choice(cfg, "device", ("auto", "cpu", "cuda"))
    path_string(cfg, "output_dir")


def check_federation(cfg: dict[str, Any]) -> None:
    """fl.*: the clients, their sampling and how long to wait for them."""
    clients = integer(cfg, "fl.num_clients", low=1)
    number(cfg, "fl.fraction_train", low=0, high=1, open_low=True)
    number(cfg, "fl.fraction_evaluate", low=0, high=1)
    integers(
        cfg,
        "fl.always_sample",
        low=0,
        high=clients,
        open_high=True,
        default=[],
        note=f"(partition ids, e.g. [0]; {clients} = fl.num_clients)",
    )
    number(cfg, "fl.round_timeout", "fl.node_wait", low=0)
    least = integer(cfg, "fl.min_train_clients", low=1)
    if least > clients_per_round(cfg):
        raise ConfigError(
            f"fl.min_train_clients={least} is more than the {clients_per_round(cfg)} clients a "
            f"round samples (fl.fraction_train={cfg['fl']['fraction_train']} x "
            f"fl.num_clients={cfg['fl']['num_clients']}): every round would keep the global "
            "model; lower fl.min_train_clients, or raise fl.fraction_train or fl.num_clients"
        )
    integer(cfg, "fl.max_failed_rounds", low=0, default=3)


def check_training(cfg: dict[str, Any]) -> None:
    """train.*, app_u.* and dma.*: the clients' training and the server's DMA."""
    choice(cfg, "train.mode", ("fullbatch", "minibatch"))
    choice(cfg, "train.lr_schedule", ("cosine", "constant"))
    choice(cfg, "train.precision", ("auto", "fp32", "bf16"))
    choice(cfg, "train.channels_last", ("auto", True, False))
    choice(cfg, "train.optimizer_state", ("fresh", "client"))
    choice(cfg, "train.unlabeled_loss_norm", ("all", "confident"))
    choice(cfg, "train.forward", ("joint", "separate"), default="joint")
    boolean(cfg, "train.compile", "train.nesterov")
    number(cfg, "train.tau", low=0, high=1, open_low=True)
    number(
        cfg,
        "train.lr",
        "train.weight_decay",
        "train.lambda_u",
        "train.grad_clip",
        "train.momentum",
        low=0,
    )
    integer(cfg, "train.local_steps", "train.warmup_rounds", "train.local_epochs", low=0)
    integer(cfg, "train.batch_size", "train.mu", "train.infer_batch_size", low=1)

    number(cfg, "app_u.gamma", low=0, high=1, open_high=True)
    choice(cfg, "app_u.estimate", ("local", "literal"), default="local")
    number(cfg, "app_u.eps", low=0, open_low=True)

    choice(cfg, "dma.mode", ("softmax", "literal", "exact"))
    choice(cfg, "dma.optimizer", ("sgd", "adam"))
    integer(cfg, "dma.steps", low=0)
    number(cfg, "dma.lr", low=0, open_low=True)
    number(cfg, "dma.cap", low=1, note="(each weight <= cap/m)", nullable="unbounded DMA")


def check_server(cfg: dict[str, Any]) -> None:
    """server.* (the update and its defences) and dp.*."""
    number(cfg, "server.lr", low=0, open_low=True)
    number(cfg, "server.momentum", low=0, high=1, open_high=True)
    for key, allowed in (("weighting", ()), ("warmup_weighting", (None,))):
        if not is_path(cfg["server"].get(key)):  # else a user's policy (strategy.validate)
            choice(cfg, f"server.{key}", (*allowed, "uniform", "samples"))
    choice(cfg, "server.sizes", ("partition", "reported"))
    integer(cfg, "server.max_samples", "server.robust.num_selected", low=1, nullable=True)

    choice(cfg, "server.robust.scope", ("deployment", "always"), default="deployment")
    number(cfg, "server.robust.clip", low=1, note="(x the median update norm)", nullable=True)
    number(cfg, "server.robust.trim", low=0, high=0.5, open_high=True)
    integer(cfg, "server.robust.num_malicious", low=0)
    number(cfg, "server.robust.min_cosine", low=-1, high=1, nullable=True)
    number(cfg, "server.robust.min_cosine_margin", low=0, high=2, nullable=True)
    number(cfg, "server.robust.loss_check", low=0, nullable=True)
    choice(cfg, "server.robust.loss_check_scale", ("lr", "none"), default="lr")
    integer(cfg, "server.robust.loss_check_candidates", low=1, default=None, nullable="all")
    integer(cfg, "server.robust.loss_check_size", low=1)

    if choice(cfg, "dp.mode", ("off", "fixed", "adaptive")) != "off":
        choice(
            cfg,
            "server.momentum",
            (0,),
            note="with dp.mode on (noise is added after the "
            "server update; a momentum buffer would carry un-noised updates into later rounds)",
        )
    number(cfg, "dp.noise_multiplier", low=0)
    number(cfg, "dp.clipping_norm", low=0, open_low=True)
    number(cfg, "dp.target_quantile", low=0, high=1, open_low=True, open_high=True)


def check_partition(cfg: dict[str, Any]) -> None:
    """partition.* and the scenario: who holds which images."""
    mode = choice(cfg, "partition.mode", ("iid", "dirichlet", "flwr"))
    if mode == "dirichlet":
        number(
            cfg, "partition.delta", low=0, open_low=True, note="(the Dirichlet concentration delta)"
        )
    if mode == "flwr":
        check_flower_partitioner(cfg)
    number(
        cfg,
        "partition.imbalance_ratio",
        low=1,
        default=None,
        nullable=True,
        note="(largest over smallest class of the unlabeled pool)",
    )
    integer(cfg, "partition.min_size", low=1)
    # runs saved before pool_order existed are in index order
    choice(cfg, "partition.pool_order", POOL_ORDERS, default="index")
    check_scenario(cfg)


def check_model_and_data(cfg: dict[str, Any]) -> None:
    """model.* and dataset.*."""
    choice(cfg, "model.name", ("cnn", "wrn28_2"))
    choice(cfg, "model.norm", ("batchstat", "bn", "gn"))
    integer(cfg, "model.width", "model.gn_groups", low=1)
    integer(cfg, "model.hidden", low=0, default=0)
    number(cfg, "model.bn_momentum", low=0, high=1, open_low=True)

    path_string(cfg, "dataset.path")
    boolean(cfg, "dataset.flip", "dataset.download")
    numbers(cfg, "dataset.mean", nonempty=True, note="(one per channel)", nullable=True)
    numbers(
        cfg,
        "dataset.std",
        low=0,
        open_low=True,
        nonempty=True,
        note="(one per channel)",
        nullable=True,
    )
    integer(cfg, "dataset.num_labeled", low=1)
    integer(cfg, "dataset.val_size", "dataset.val_seed", low=0, default=0)


def check_logging_and_eval(cfg: dict[str, Any]) -> None:
    """logging.*, checkpoint.* and eval.*: what the run writes, and when it evaluates."""
    boolean(cfg, "logging.tensorboard")
    path_string(
        cfg,
        "logging.mlflow",
        default=None,
        nullable="off",
        note="(an MLflow tracking URI such as sqlite:///runs/mlflow.db, or a directory)",
    )
    boolean(cfg, "logging.wandb", default=False, note="(Weights & Biases, offline)")
    path_string(cfg, "logging.wandb_dir", default=None, nullable="the run directory")
    path_string(cfg, "logging.group", default="", note='(the name of a group of runs; "": feddb)')
    integer(cfg, "checkpoint.every", low=0)
    integer(cfg, "eval.every", low=1, default=1, note="(1: evaluate every round)")
    integer(cfg, "eval.batch_size", low=1)
    integer(cfg, "eval.threads", low=1, default="auto", also=("auto",))


def check_scenario(cfg: dict[str, Any]) -> None:
    """Where the labels live (conf/scenario/), and the settings that need labels where there are
    none. Runs saved before scenarios existed are labels_at_clients."""
    from .partition import SCENARIOS

    if "scenario" not in cfg:
        return
    clients = cfg["fl"]["num_clients"]
    name = choice(cfg, "scenario.name", SCENARIOS)
    integer(cfg, "scenario.server_epochs", low=0, nullable="train.local_epochs", default=None)
    if name == "labels_at_partial_clients":
        least = cfg["fl"]["min_train_clients"]
        labeled = integer(
            cfg,
            "scenario.labeled_clients",
            low=least,
            high=clients - 1,
            note=f"(the clients that hold the labels: a labels-only round trains them alone, "
            f"and one with fewer than fl.min_train_clients={least} replies keeps the global "
            f"model; fl.num_clients={clients})",
        )
        if cfg["dp"]["mode"] != "off" and labeled < clients_per_round(cfg):
            raise ConfigError(
                f"dp.mode={cfg['dp']['mode']} sizes its noise for {clients_per_round(cfg)} "
                f"clients a round, but labels-only rounds of labels_at_partial_clients train "
                f"the {labeled} labeled clients alone (scenario.labeled_clients), so their noise "
                "would be too small: raise scenario.labeled_clients, or lower fl.fraction_train"
            )
    if name == "labels_at_server":
        number(
            cfg,
            "fl.fraction_evaluate",
            low=0,
            high=0,
            note="in scenario labels_at_server (federated evaluation runs on the clients' "
            "labels, and they hold none)",
        )
    check_scenario_method(cfg, name)


def check_scenario_method(cfg: dict[str, Any], name: str) -> None:
    """Settings of a scenario or a method that cannot act where the labels are not, named."""
    sc, method = cfg["scenario"], cfg["method"]["name"]
    for key, home in (
        ("server_epochs", "labels_at_server"),
        ("labeled_clients", "labels_at_partial_clients"),
    ):
        if sc.get(key) is not None and name != home:
            raise ConfigError(
                f"scenario.{key}={sc[key]} applies to scenario {home} only, and this run's is "
                f"{name} (method {method}): drop it, or set scenario={home}"
            )
    if (
        cfg["method"].get("static_bn")
        and cfg["model"]["norm"] == "bn"
        and name != "labels_at_server"
    ):
        raise ConfigError(
            f"method {method} in scenario {name}: method.static_bn recomputes BatchNorm "
            "statistics on the server's labeled images, and the server holds none here: set "
            "method.static_bn=false (running statistics), or scenario=labels_at_server"
        )
    rounds, warmup = cfg["num_rounds"], cfg["train"]["warmup_rounds"]
    cls = method_class(cfg["method"]["trainer"])
    semi, defined_for = cls.uses_unlabeled, getattr(cls, "scenarios", None)
    if defined_for is not None and name not in defined_for:
        raise ConfigError(
            f"method {method} is defined for scenario {' or '.join(defined_for)}, and this "
            f"run's is {name}: set scenario={defined_for[0]}, or choose another method"
        )
    dp = cfg["dp"]["mode"]
    for switch, on, shown in (
        ("dpl", cfg["dpl"], "dpl=true"),
        ("dma", cfg["dma"]["enabled"], "dma=true"),
        ("dp", dp != "off", f"dp.mode={dp}"),
    ):
        if on and switch in getattr(cls, "refuses", {}):
            raise ConfigError(f"{shown} with method {method}: {cls.refuses[switch]}")
    if cfg["dpl"] and not semi:
        raise ConfigError(
            f"dpl=true with method {method}: DPL debiases pseudo-labels, and {method} trains on "
            "labels only and makes none; drop dpl, or choose a pseudo-labelling method"
        )
    if name == "labels_at_server" and semi and warmup >= rounds:
        raise ConfigError(
            f"method {method} in scenario labels_at_server: train.warmup_rounds={warmup} >= "
            f"num_rounds={rounds}, and a labels-only round is the server's alone, so no client "
            "would ever train: lower train.warmup_rounds, or run method=fedavg (the server alone)"
        )


def check_flower_partitioner(cfg: dict[str, Any]) -> None:
    """partition.partitioner is one of Flower Datasets' label partitioners and it can be built with
    partition.params (it is built here, so a bad value stops the run before any data is read)."""
    from .partition import FLOWER_PARTITIONERS, check_partitioner

    name = choice(cfg, "partition.partitioner", FLOWER_PARTITIONERS)
    params = mapping(cfg, "partition.params", default={}, nullable="no parameters") or {}
    clients = cfg["fl"]["num_clients"]
    try:
        check_partitioner(name, dict(params), clients, cfg["seed"])
    except ValueError as err:
        raise ConfigError(f"partition.params: {err}") from err


# The defences server.robust.scope places, as (config path, what it is), in the order they act.
DEFENCES = (
    ("server.robust.clip", "the norm bound"),
    ("server.robust.min_cosine", "the agreement filter"),
    ("server.robust.loss_check", "the loss check"),
    ("dma.cap", "the DMA cap"),
)


def apply_defence_scope(cfg: dict[str, Any], untrusted_nodes: bool) -> list[str]:
    """Turn off the defences `server.robust.scope` leaves out of this run (in place) and return
    the config paths turned off. They exist for nodes that may be other people's machines; in a
    simulation every client is this app's own code, so the methods run as published unless
    `scope: always`. A saved config.yaml then shows what ran."""
    if untrusted_nodes or cfg["server"]["robust"].get("scope", "deployment") == "always":
        return []
    off = []
    for path, _ in DEFENCES:
        parent, key = lookup(cfg, path)
        if parent[key] is not None:
            parent[key] = None
            off.append(path)
    return off


def warmup_note(cfg: dict[str, Any]) -> str | None:
    """What to say before a run of a semi-supervised method whose rounds all fall inside the
    labels-only warm-up (it would train on labels alone), or None."""
    rounds, warmup = cfg["num_rounds"], cfg["train"]["warmup_rounds"]
    if warmup < rounds or not method_class(cfg["method"]["trainer"]).uses_unlabeled:
        return None
    return (
        f"all {rounds} rounds fall inside the labels-only warm-up (train.warmup_rounds="
        f"{warmup}): {cfg['method']['name']} trains on the labels alone in this run; give more "
        f"rounds than {warmup}, or set train.warmup_rounds"
    )


def sweep_warmup_note(run_configs: dict[str, str], parse: Any) -> str | None:
    """What to say before a sweep whose rows (`run_configs`: each row's run-config, read by
    `parse`) train on labels alone in every round of their runs, or None. A row that does not
    compose is left to its run, which says why."""
    inside: dict[str, dict[str, Any]] = {}
    for row, text in run_configs.items():
        try:
            cfg = compose_from_run_config(parse(text))
        except (ConfigError, ValueError):
            continue
        if warmup_note(cfg):
            inside[row] = cfg
    if not inside:
        return None
    cfg = next(iter(inside.values()))
    return (
        f"row(s) {', '.join(inside)}: all {cfg['num_rounds']} rounds fall inside the labels-only "
        f"warm-up (train.warmup_rounds={cfg['train']['warmup_rounds']}), so they train on the "
        "labels alone; raise num-server-rounds in run_config, or lower train.warmup_rounds "
        "(run_config=\"overrides='train.warmup_rounds=0'\")"
    )


def clients_per_round(cfg: dict[str, Any], fraction: float | None = None) -> int:
    """Clients a round samples: round(C * M), at least 1 and at most M (C: fl.fraction_train,
    or `fraction` for federated evaluation)."""
    fl = cfg["fl"]
    fraction = fl["fraction_train"] if fraction is None else fraction
    return max(1, min(fl["num_clients"], round(fraction * fl["num_clients"])))
