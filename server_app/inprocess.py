"""Moved to feddb.inprocess (the `feddb` command); kept so that `python -m server_app.inprocess` still works."""

import sys

from feddb.inprocess import *  # noqa: F401,F403
from feddb.inprocess import main

if __name__ == "__main__":
    sys.exit(main())
