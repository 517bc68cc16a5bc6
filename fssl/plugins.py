"""The one way a user's code comes in: a class by path, `package.module:Class` or
`/path/to/file.py:Class`, for every place that takes one (a method, `strategy.target`,
`server.weighting`, `server.robust.rule`). Each caller checks what it gets; this module only
finds it, and says in one line why it could not. No Flower, no torch."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from .checks import ConfigError


def is_path(spec: Any) -> bool:
    """`pkg.module:Class` or `/path/file.py:Class`: a user's class, not a registered name."""
    return isinstance(spec, str) and ":" in spec


def load(spec: str, what: str) -> Any:
    """The object `spec` names. `what` opens every error line (e.g. "method 'x.py:Mine'"); an
    import that fails or exits is the user's to fix, and raises ConfigError saying so."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ConfigError(
            f"{what}: write a user's class as 'package.module:Class' or '/path/to/file.py:Class'"
        )
    module = _import(where, what)
    found = getattr(module, name, None)
    if found is None:
        raise ConfigError(f"{what}: {where} has no class {name}")
    return found


def _import(where: str, what: str) -> Any:
    """The user's module, by file or by name; a file loads once per process (by its path)."""
    name = where
    try:
        if not where.endswith(".py"):
            return importlib.import_module(where)
        path = Path(where).expanduser()
        if not path.is_file():
            raise ConfigError(f"{what}: file {path} not found")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        name = f"feddb_user_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # before it runs: a dataclass in it looks itself up there
        module_spec.loader.exec_module(module)
        return module
    except (ConfigError, KeyboardInterrupt):
        raise
    except SystemExit as err:
        sys.modules.pop(name, None)  # half-imported: a later load tries again
        raise ConfigError(
            f"{what}: {where} exits at import (SystemExit({err.code!r})); a module given by "
            "path only defines its class: put the sys.exit() under `if __name__ == '__main__':`"
        ) from None
    except BaseException as err:  # the user's module: any failure to import is theirs to fix
        sys.modules.pop(name, None)
        raise ConfigError(
            f"{what}: cannot import {where} ({type(err).__name__}: {err}); "
            "is it on PYTHONPATH (or give its file path)?"
        ) from None
