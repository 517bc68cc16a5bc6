"""Moved to feddb.sweep (the `feddb` command); kept so that `python -m server_app.sweep` still works."""

import sys

from feddb.sweep import *  # noqa: F401,F403
from feddb.sweep import main

if __name__ == "__main__":
    sys.exit(main())
