"""cProfile of an app's calls when FEDDB_PROFILE names a directory (`feddb overhead --profile`):
each process adds its calls to `<dir>/<side>-<pid>.prof`."""

from __future__ import annotations

import cProfile
import functools
import os
from collections.abc import Callable

_PROFILES: dict[str, cProfile.Profile] = {}


def profiled(side: str) -> Callable:
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            directory = os.environ.get("FEDDB_PROFILE")
            if not directory:
                return fn(*args, **kwargs)
            prof = _PROFILES.setdefault(side, cProfile.Profile())
            prof.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.disable()
                prof.dump_stats(os.path.join(directory, f"{side}-{os.getpid()}.prof"))
        return wrapper
    return decorate
