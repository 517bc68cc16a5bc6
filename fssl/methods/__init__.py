"""Methods: one class per algorithm, in one module of this package, registered by name.

A method is a `fssl.methods.base.LocalTrainer` subclass decorated with `@register("<name>")`; its module
and `conf/method/<name>.yaml` are all there is to it (docs/methods.md, "Adding a method"). The class
owns its local training step and hooks, its parameters under `method` (`check_params`), its model
wrapper (`wrap_model`), what it keeps per client between rounds (`keeps`, `client_state`), its
display name, and its server side (`server`: a `MethodServer` subclass, framework-free). A user's method loads by
path, `method.trainer='my_pkg.my_module:MyMethod'` or `'/path/to/file.py:MyMethod'`, and follows
the same interface; the framework asks the registry, never a method's name.

This module imports neither torch nor Flower: the strategy and the launcher's checks read it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import TYPE_CHECKING, Any

from ..checks import ConfigError, choice
from ..plugins import is_path, load

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .base import LocalTrainer

METHODS: dict[str, type] = {}  # registered name -> class (the built-in ones once discovered)
_USER: dict[str, type] = {}  # user paths already loaded

# What a method class must have: the engine's training entry points and the class-level API
# (LocalTrainer provides each; a user's class that is not one is refused naming what it lacks).
REQUIRED = (
    "fit",
    "begin_round",
    "unlabeled_batch",
    "check_params",
    "wrap_model",
    "server_trainer",
    "client_state",
    "uses_unlabeled",
    "display",
    "server",
)


def register(name: str):
    """Class decorator: the method answers to `method.trainer=<name>`."""

    def wrap(cls: type) -> type:
        if name in METHODS and METHODS[name] is not cls:
            raise ValueError(f"method name '{name}' registered twice ({METHODS[name]}, {cls})")
        cls.registered_name = name
        METHODS[name] = cls
        return cls

    return wrap


def discover() -> dict[str, type]:
    """Import every module of this package once, so that each registers its class."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return METHODS


def _load_user(spec: str) -> type:
    if spec in _USER:
        return _USER[spec]
    where, _, cls_name = spec.rpartition(":")
    cls = load(spec, f"method '{spec}'")
    if not isinstance(cls, type):
        raise ConfigError(f"method '{spec}': {where} has no class {cls_name}")
    missing = [a for a in REQUIRED if not hasattr(cls, a)]
    labelling = [h for h in PSEUDO_LABEL_HOOKS if h in vars(cls)]
    if missing:
        base = (
            "fssl.methods.fixmatch.FixMatch (a pseudo-labelling method: its round calls "
            "select and unlabeled_loss)"
            if labelling
            else "fssl.methods.fixmatch.FixMatch for a pseudo-labelling method, "
            "fssl.methods.base.LocalTrainer for labels-only training"
        )
        raise ConfigError(
            f"method '{spec}': class {cls_name} lacks {', '.join(missing)}; subclass {base} "
            "(docs/methods.md, 'Adding a method')"
        )
    uncalled = never_called(cls)
    if uncalled:
        raise ConfigError(
            f"method '{spec}': class {cls_name} defines {', '.join(uncalled)}, which its base "
            f"{cls.__mro__[1].__name__} never calls (only FixMatch's round does): subclass "
            "fssl.methods.fixmatch.FixMatch instead"
        )
    if lacks_idx(cls):
        raise ConfigError(
            f"method '{spec}': {cls_name}.unlabeled_loss takes no `idx`, the rows' image indices "
            "FixMatch's round passes: define it as unlabeled_loss(self, logits, target, mask, "
            "denom, idx=None)"
        )
    _USER[spec] = cls
    return cls


def lacks_idx(cls: type) -> bool:
    """A class whose `unlabeled_loss` (written before the hooks received the images' indices)
    has no `idx` parameter to take them in."""
    hook = getattr(cls, "unlabeled_loss", None)
    if hook is None:
        return False
    params = inspect.signature(hook).parameters.values()
    varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return all(p.name != "idx" and p.kind not in varying for p in params)


# Hooks only FixMatch's round calls (fssl/methods/fixmatch.py), and the entry points through
# which a class of its own could call them instead.
PSEUDO_LABEL_HOOKS = ("select", "unlabeled_loss")
CALLERS = ("fit", "epoch", "step", "begin_round", "unlabeled_batch")


def never_called(cls: type) -> list[str]:
    """The pseudo-labelling hooks a user's class defines that nothing would call: no class in its
    line overrides one of LocalTrainer's callers (a method of this package that does, FixMatch or
    SemiFL, calls `select` in its round; the user's own class may call it from its own)."""
    line = [c for c in cls.__mro__ if c.__module__ not in ("fssl.methods.base", "builtins")]
    if any(name in vars(c) for c in line for name in CALLERS):
        return []
    return [h for h in PSEUDO_LABEL_HOOKS if any(h in vars(c) for c in line)]


def method_class(spec: str) -> type[LocalTrainer]:
    """The class of `method.trainer`: a registered name or a user's path."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(
            "`method.trainer` must name a method (conf/method/*.yaml), or a user method as "
            "method='package.module:Class'"
        )
    if is_path(spec):
        return _load_user(spec)
    if spec not in discover():
        raise ConfigError(
            f"invalid value for `method.trainer`: '{spec}'; allowed: {', '.join(sorted(METHODS))}"
            ", or a user method as 'package.module:Class'"
        )
    return METHODS[spec]


def declared(cls: type | None) -> list[str]:
    """The `method.*` keys a class declares in its `defaults` (a dotted key there is a global
    one, e.g. `train.tau`): `method.<key>=v` sets each without `+`."""
    return sorted(k for k in getattr(cls, "defaults", {}) if "." not in k)


def fill_defaults(m: dict[str, Any]) -> None:
    """The class's `defaults` give the `method.*` values its configuration leaves out (a method
    given by path has no YAML, and conf/method/custom.yaml leaves `pseudo_labels` null for it),
    then pseudo-labels once a round. A user's `method.<key>=...` wins."""
    by_path = is_path(str(m.get("trainer") or ""))
    cls = method_class(m["trainer"]) if m.get("trainer") else None
    for key in declared(cls):
        if key not in m or (by_path and m[key] is None):
            m[key] = cls.defaults[key]
    if by_path and m.get("pseudo_labels") is None:
        m["pseudo_labels"] = "round"


def check_method(m: dict[str, Any]) -> None:
    """`method.trainer` names a method (or loads one) and the method's own parameters are valid.
    A configuration saved when a method's server side was chosen apart (`method.strategy`) is
    refused where that choice no longer exists."""
    cls = method_class(m.get("trainer"))
    choice({"method": m}, "method.pseudo_labels", ("round", "online"), default="round")
    if m.get("strategy", "fedavg") != "fedavg":
        raise ConfigError(
            f"`method.strategy`: '{m['strategy']}' was saved before each method owned its server "
            "side; resume it with the code it was made with (its provenance.json), or start it anew"
        )
    cls.check_params(m)


def make_trainer(
    cfg: dict[str, Any], ds_mean: tuple, ds_std: tuple, device: torch.device
) -> LocalTrainer:
    return method_class(cfg["method"]["trainer"])(cfg, ds_mean, ds_std, device)


def make_model(
    cfg: dict[str, Any], num_classes: int, in_channels: int, method: type | None = None
) -> nn.Module:
    """The configured model, wrapped as the method needs it (FedMatch: sigma + psi). `method`:
    the method's class where the caller has resolved it already."""
    from ..models import build_model

    size = cfg.get("data_meta", {}).get("image_shape", [in_channels, 28, 28])[-1]
    model = build_model(cfg["model"], num_classes, in_channels, size)
    cls = method or method_class(cfg["method"]["trainer"])
    return cls.wrap_model(model, cfg["method"])


def display_name(m: dict[str, Any]) -> str:
    """How reports name the method: its class's `display` (a run saved with a `display` in its
    configuration keeps that one)."""
    return m.get("display") or method_class(m["trainer"]).display


def lost_client_state(cfg: dict, checkpoint_state, in_process: bool) -> str | None:
    """Why resuming would lose what the run's clients keep between rounds, or None: a checkpoint
    holds it only when the nodes ran in the server's process (`feddb local`, a sweep's default
    launcher), and only such a run can give it back (feddb/launch.py and feddb/sweep.py ask).
    `checkpoint_state()`: the checkpoint's state, read only when the clients keep something."""
    kept = method_class(cfg["method"]["trainer"]).kept_between_rounds(cfg)
    if not kept:
        return None
    what = f"its clients keep {' and '.join(kept)} between rounds"
    if not checkpoint_state().get("nodes"):
        return (
            f"{what}, and its checkpoint (not written in process) does not hold them: "
            "start it again"
        )
    if not in_process:
        return f"{what}, which only an in-process run gives back: resume it with `feddb local`"
    return None
