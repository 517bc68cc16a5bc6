"""Configuration: Hydra composition of `conf/`, Flower run-config mapping, and validation.

Flower passes flat scalar run-config keys; Hydra is used through its compose API (no argv, no cwd
change) so the same YAML tree drives `flwr run`, the tests and the launcher.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PYPROJECT = CONF_DIR.parent / "pyproject.toml"

GROUPS = ("method", "strategy", "dataset", "partition", "model", "experiment")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


def group_options(group: str) -> list[str]:
    """Names selectable in a config group, e.g. ['fedavg', 'feddb', 'fixmatch'] for 'method'."""
    root = CONF_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def run_config_defaults() -> dict[str, Any]:
    """The run-config keys and their defaults, as pyproject.toml declares them for Flower."""
    import tomllib

    with open(PYPROJECT, "rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


# run-config key -> the Hydra key it sets (the groups set themselves; `overrides` and `resume`
# are handled apart)
RUN_CONFIG_TARGETS = {**{g: g for g in GROUPS}, "dpl": "dpl", "dma": "dma.enabled",
                      "data-path": "dataset.path", "seed": "seed", "output-dir": "output_dir",
                      "num-server-rounds": "num_rounds"}


def given(run_config: dict[str, Any]) -> dict[str, Any]:
    """The keys a run-config sets away from their declared defaults (an empty string, as in run
    configs saved before the keys were typed, also means the default)."""
    defaults = run_config_defaults()
    return {k: v for k, v in run_config.items()
            if v != "" and not (k in defaults and v == defaults[k] and type(v) is type(defaults[k]))}


def run_config_to_overrides(run_config: dict[str, Any]) -> list[str]:
    """Translate Flower run-config keys (pyproject `[tool.flwr.app.config]`) to Hydra overrides.
    A key at its declared default keeps conf/'s value."""
    rc = given(run_config)
    unknown = sorted(set(rc) - set(RUN_CONFIG_TARGETS) - {"overrides", "resume"})
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}: the keys are "
                          f"{', '.join(run_config_defaults())} (pyproject.toml)")
    out: list[str] = []
    for key, target in RUN_CONFIG_TARGETS.items():
        if key in rc:
            value = rc[key]
            out.append(f"{target}={value if key in GROUPS else _hydra_value(value)}")
    extra = rc.get("overrides", "")
    if extra:
        out.extend(shlex.split(str(extra)))
    return out


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # Quote so that paths with '=' or ':' survive Hydra's override grammar.
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def compose(overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose `conf/config.yaml` with Hydra overrides and return a validated plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    _check_group_choices(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides)
        data = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"invalid override in {overrides}: {err}") from err
    finally:
        GlobalHydra.instance().clear()
    validate(data)
    return data


def compose_from_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    return compose(run_config_to_overrides(run_config))


def resolve(run_config: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """The run's configuration and, with `resume=<run dir>`, that directory (its saved config)."""
    resume = str(run_config.get("resume", "") or "")
    if not resume:
        return compose_from_run_config(run_config), None
    others = sorted(k for k in given(run_config) if k != "resume")
    if others:
        raise ConfigError(f"resume continues a run with its saved configuration; remove {others} "
                          "from the run-config")
    run_dir = Path(resume).expanduser().resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"cannot resume '{resume}': {saved} not found; `resume` takes the run "
                          "directory of an earlier run")
    import yaml

    cfg = yaml.safe_load(saved.read_text())
    try:
        validate(cfg)
    except (KeyError, TypeError) as err:
        raise ConfigError(f"{saved} is not a complete configuration ({err!r})") from err
    return cfg, run_dir


def _check_group_choices(overrides: list[str]) -> None:
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+~")
        if sep and key in GROUPS:
            options = group_options(key)
            if value not in options:
                raise ConfigError(
                    f"unknown {key} '{value}': choose one of {', '.join(options)}"
                    f" (run-config key `{key}`)"
                )


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid value for `{key}`: {value!r}; allowed: {allowed}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate(cfg: dict[str, Any]) -> None:
    """Check types and ranges of the resolved configuration before anything runs."""
    fl, tr, dma, server = cfg["fl"], cfg["train"], cfg["dma"], cfg["server"]
    part, model, data = cfg["partition"], cfg["model"], cfg["dataset"]
    require(isinstance(cfg["seed"], int) and not isinstance(cfg["seed"], bool), "seed",
             cfg["seed"], "an integer")
    require(isinstance(cfg["num_rounds"], int) and cfg["num_rounds"] >= 1, "num_rounds",
             cfg["num_rounds"], "an integer >= 1")
    require(isinstance(cfg["dpl"], bool), "dpl", cfg["dpl"], "true or false")
    require(isinstance(dma["enabled"], bool), "dma.enabled", dma["enabled"], "true or false")
    require(cfg["device"] in ("auto", "cpu", "cuda"), "device", cfg["device"], "auto, cpu, cuda")
    require(isinstance(fl["num_clients"], int) and fl["num_clients"] >= 1, "fl.num_clients",
             fl["num_clients"], "an integer >= 1")
    require(is_number(fl["fraction_train"]) and 0 < fl["fraction_train"] <= 1,
             "fl.fraction_train", fl["fraction_train"], "a number in (0, 1]")
    require(is_number(fl["fraction_evaluate"]) and 0 <= fl["fraction_evaluate"] <= 1,
             "fl.fraction_evaluate", fl["fraction_evaluate"], "a number in [0, 1]")
    fixed = fl.get("always_sample", [])        # absent from runs saved before it existed
    require(isinstance(fixed, list) and all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p < fl["num_clients"]
        for p in fixed), "fl.always_sample", fixed,
        "a list of partition ids in [0, fl.num_clients), e.g. [0]")
    for key in ("round_timeout", "node_wait"):
        require(is_number(fl[key]) and fl[key] >= 0, f"fl.{key}", fl[key], "a number >= 0")
    require(isinstance(fl["min_train_clients"], int) and fl["min_train_clients"] >= 1,
             "fl.min_train_clients", fl["min_train_clients"], "an integer >= 1")
    require(is_number(tr["tau"]) and 0 < tr["tau"] <= 1, "train.tau", tr["tau"],
             "a number with 0 < tau <= 1")
    require(tr["mode"] in ("fullbatch", "minibatch"), "train.mode", tr["mode"],
             "fullbatch, minibatch")
    require(tr["lr_schedule"] in ("cosine", "constant"), "train.lr_schedule",
             tr["lr_schedule"], "cosine, constant")
    require(tr["precision"] in ("auto", "fp32", "bf16"), "train.precision", tr["precision"],
             "auto, fp32, bf16")
    require(tr["channels_last"] in ("auto", True, False), "train.channels_last",
             tr["channels_last"], "auto, true, false")
    require(isinstance(tr["compile"], bool), "train.compile", tr["compile"], "true or false")
    require(tr["optimizer_state"] in ("fresh", "client"), "train.optimizer_state",
             tr["optimizer_state"], "fresh, client")
    require(tr["unlabeled_loss_norm"] in ("all", "confident"), "train.unlabeled_loss_norm",
             tr["unlabeled_loss_norm"], "all, confident")
    for key in ("lr", "weight_decay", "lambda_u", "grad_clip", "momentum"):
        require(is_number(tr[key]) and tr[key] >= 0, f"train.{key}", tr[key], "a number >= 0")
    for key in ("local_steps", "warmup_rounds", "local_epochs"):    # local_epochs 0: no steps
        require(isinstance(tr[key], int) and tr[key] >= 0, f"train.{key}", tr[key],
                 "an integer >= 0")
    for key in ("batch_size", "mu", "infer_batch_size"):
        require(isinstance(tr[key], int) and tr[key] >= 1, f"train.{key}", tr[key],
                 "an integer >= 1")
    require(is_number(cfg["app_u"]["gamma"]) and 0 <= cfg["app_u"]["gamma"] < 1, "app_u.gamma",
             cfg["app_u"]["gamma"], "a number in [0, 1)")
    require(cfg["app_u"].get("estimate", "local") in ("local", "literal"), "app_u.estimate",
             cfg["app_u"].get("estimate"), "local, literal")
    require(dma["mode"] in ("softmax", "literal", "exact"), "dma.mode", dma["mode"],
             "softmax, literal, exact")
    require(dma["optimizer"] in ("sgd", "adam"), "dma.optimizer", dma["optimizer"], "sgd, adam")
    require(isinstance(dma["steps"], int) and dma["steps"] >= 0, "dma.steps", dma["steps"],
             "an integer >= 0")
    require(is_number(dma["lr"]) and dma["lr"] > 0, "dma.lr", dma["lr"], "a number > 0")
    require(dma["cap"] is None or (is_number(dma["cap"]) and dma["cap"] >= 1), "dma.cap",
             dma["cap"], "a number >= 1 (each weight <= cap/m), or null for unbounded DMA")
    require(is_number(server["lr"]) and server["lr"] > 0, "server.lr", server["lr"], "a number > 0")
    require(is_number(server["momentum"]) and 0 <= server["momentum"] < 1, "server.momentum",
             server["momentum"], "a number in [0, 1)")
    require(server["weighting"] in ("uniform", "samples"), "server.weighting",
             server["weighting"], "uniform, samples")
    dp = cfg["dp"]
    require(dp["mode"] in ("off", "fixed", "adaptive"), "dp.mode", dp["mode"],
             "off, fixed, adaptive")
    require(is_number(dp["noise_multiplier"]) and dp["noise_multiplier"] >= 0,
             "dp.noise_multiplier", dp["noise_multiplier"], "a number >= 0")
    require(is_number(dp["clipping_norm"]) and dp["clipping_norm"] > 0, "dp.clipping_norm",
             dp["clipping_norm"], "a number > 0")
    require(is_number(dp["target_quantile"]) and 0 < dp["target_quantile"] < 1,
             "dp.target_quantile", dp["target_quantile"], "a number in (0, 1)")
    require(dp["mode"] == "off" or server["momentum"] == 0, "server.momentum",
             server["momentum"], "0 with dp.mode on (noise is added after the server update; a "
             "momentum buffer would carry un-noised updates into later rounds)")
    rb = server["robust"]
    require(rb["clip"] is None or (is_number(rb["clip"]) and rb["clip"] >= 1), "server.robust.clip",
             rb["clip"], "a number >= 1 (x the median update norm), or null")
    require(is_number(rb["trim"]) and 0 <= rb["trim"] < 0.5, "server.robust.trim", rb["trim"],
             "a number in [0, 0.5)")
    require(isinstance(rb["num_malicious"], int) and rb["num_malicious"] >= 0,
             "server.robust.num_malicious", rb["num_malicious"], "an integer >= 0")
    require(rb["num_selected"] is None or (isinstance(rb["num_selected"], int)
                                            and rb["num_selected"] >= 1),
             "server.robust.num_selected", rb["num_selected"], "an integer >= 1, or null")
    require(rb["min_cosine"] is None or (is_number(rb["min_cosine"])
                                          and -1 <= rb["min_cosine"] <= 1),
             "server.robust.min_cosine", rb["min_cosine"], "a number in [-1, 1], or null")
    require(rb["min_cosine_margin"] is None or (is_number(rb["min_cosine_margin"])
                                                 and 0 <= rb["min_cosine_margin"] <= 2),
             "server.robust.min_cosine_margin", rb["min_cosine_margin"],
             "a number in [0, 2], or null")
    require(rb["loss_check"] is None or (is_number(rb["loss_check"]) and rb["loss_check"] >= 0),
             "server.robust.loss_check", rb["loss_check"], "a number >= 0, or null")
    require(rb.get("scope", "deployment") in ("deployment", "always"), "server.robust.scope",
             rb.get("scope"), "deployment, always")
    if "loss_check_scope" in rb:
        raise ConfigError(
            "server.robust.loss_check_scope is gone: server.robust.scope (deployment, always) now "
            "places every defence. A run saved with it ran the norm bound and the agreement filter "
            "in simulations too; resume it with the code it was made with (its provenance.json, "
            "or commit cd84422), or start it anew")
    require(rb.get("loss_check_scale", "lr") in ("lr", "none"), "server.robust.loss_check_scale",
             rb.get("loss_check_scale"), "lr, none")
    cands = rb.get("loss_check_candidates")
    require(cands is None or (isinstance(cands, int) and not isinstance(cands, bool)
                               and cands >= 1),
             "server.robust.loss_check_candidates", cands, "an integer >= 1, or null (all)")
    require(isinstance(rb["loss_check_size"], int) and rb["loss_check_size"] >= 1,
             "server.robust.loss_check_size", rb["loss_check_size"], "an integer >= 1")
    require(server["sizes"] in ("partition", "reported"), "server.sizes", server["sizes"],
             "partition, reported")
    require(server["max_samples"] is None or (isinstance(server["max_samples"], int)
                                               and server["max_samples"] >= 1),
             "server.max_samples", server["max_samples"], "an integer >= 1, or null")
    require(part["mode"] in ("iid", "dirichlet"), "partition.mode", part["mode"],
             "iid, dirichlet")
    if part["mode"] == "dirichlet":
        require(is_number(part["delta"]) and part["delta"] > 0, "partition.delta",
                 part["delta"], "a number > 0 (the Dirichlet concentration delta)")
    ratio = part.get("imbalance_ratio")
    require(ratio is None or (is_number(ratio) and ratio >= 1), "partition.imbalance_ratio", ratio,
             "a number >= 1 (largest over smallest class of the unlabeled pool), or null")
    require(isinstance(part["min_size"], int) and part["min_size"] >= 1, "partition.min_size",
             part["min_size"], "an integer >= 1")
    require(model["norm"] in ("batchstat", "bn", "gn"), "model.norm", model["norm"],
             "batchstat, bn, gn")
    for key in ("nesterov",):
        require(isinstance(tr[key], bool), f"train.{key}", tr[key], "true or false")
    for key in ("flip", "download"):
        require(isinstance(data[key], bool), f"dataset.{key}", data[key], "true or false")
    require(isinstance(data["path"], str), "dataset.path", data["path"], "a path string")
    require(isinstance(cfg["output_dir"], str), "output_dir", cfg["output_dir"], "a path string")
    for key in ("mean", "std"):
        v = data[key]
        require(v is None or (isinstance(v, list) and v and all(is_number(x) for x in v)
                               and (key == "mean" or all(x > 0 for x in v))),
                 f"dataset.{key}", v, "null or a list of numbers per channel (std > 0)")
    from .methods import check_method      # the registry imports this module's checks

    check_method(cfg["method"])
    require(model["name"] in ("cnn", "wrn28_2"), "model.name", model["name"], "cnn, wrn28_2")
    for key in ("width", "gn_groups"):
        require(isinstance(model[key], int) and model[key] >= 1, f"model.{key}", model[key],
                 "an integer >= 1")
    require(isinstance(model.get("hidden", 0), int) and model.get("hidden", 0) >= 0,
             "model.hidden", model.get("hidden"), "an integer >= 0")
    require(is_number(model["bn_momentum"]) and 0 < model["bn_momentum"] <= 1,
             "model.bn_momentum", model["bn_momentum"], "a number in (0, 1]")
    require(is_number(cfg["app_u"]["eps"]) and cfg["app_u"]["eps"] > 0, "app_u.eps",
             cfg["app_u"]["eps"], "a number > 0")
    for key in ("val_size", "val_seed"):
        require(isinstance(data.get(key, 0), int) and data.get(key, 0) >= 0, f"dataset.{key}",
                 data.get(key), "an integer >= 0")
    require(isinstance(data["num_labeled"], int) and data["num_labeled"] >= 1,
             "dataset.num_labeled", data["num_labeled"], "an integer >= 1")
    require(isinstance(cfg["logging"]["tensorboard"], bool), "logging.tensorboard",
             cfg["logging"]["tensorboard"], "true or false")
    require(isinstance(cfg["checkpoint"]["every"], int) and cfg["checkpoint"]["every"] >= 0,
             "checkpoint.every", cfg["checkpoint"]["every"], "an integer >= 0")
    every = cfg["eval"].get("every", 1)
    require(isinstance(every, int) and not isinstance(every, bool) and every >= 1,
             "eval.every", every, "an integer >= 1 (1: evaluate every round)")
    require(isinstance(cfg["eval"]["batch_size"], int) and cfg["eval"]["batch_size"] >= 1,
             "eval.batch_size", cfg["eval"]["batch_size"], "an integer >= 1")
    threads = cfg["eval"].get("threads", "auto")
    require(threads == "auto" or (isinstance(threads, int) and not isinstance(threads, bool)
                                   and threads >= 1),
             "eval.threads", threads, "auto, or an integer >= 1")


# The defences server.robust.scope places, as (config path, what it is), in the order they act.
DEFENCES = (("server.robust.clip", "the norm bound"),
            ("server.robust.min_cosine", "the agreement filter"),
            ("server.robust.loss_check", "the loss check"),
            ("dma.cap", "the DMA cap"))


def _lookup(cfg: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    *parents, key = path.split(".")
    for name in parents:
        cfg = cfg[name]
    return cfg, key


def apply_defence_scope(cfg: dict[str, Any], untrusted_nodes: bool) -> list[str]:
    """Turn off the defences `server.robust.scope` leaves out of this run (in place) and return
    the config paths turned off. They exist for nodes that may be other people's machines; in a
    simulation every client is this app's own code, so the methods run as published unless
    `scope: always`. A saved config.yaml then shows what ran."""
    if untrusted_nodes or cfg["server"]["robust"].get("scope", "deployment") == "always":
        return []
    off = []
    for path, _ in DEFENCES:
        parent, key = _lookup(cfg, path)
        if parent[key] is not None:
            parent[key] = None
            off.append(path)
    return off


def clients_per_round(cfg: dict[str, Any], fraction: float | None = None) -> int:
    """Clients a round samples: round(C * M), at least 1 and at most M (C: fl.fraction_train,
    or `fraction` for federated evaluation)."""
    fl = cfg["fl"]
    fraction = fl["fraction_train"] if fraction is None else fraction
    return max(1, min(fl["num_clients"], round(fraction * fl["num_clients"])))
