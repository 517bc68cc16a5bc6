"""Moved to feddb.attackbench (the `feddb` command); kept so that `python -m server_app.attackbench` still works."""

import sys

from feddb.attackbench import *  # noqa: F401,F403
from feddb.attackbench import main

if __name__ == "__main__":
    sys.exit(main())
