"""Moved to feddb.resources (the `feddb` command); kept so that `python -m server_app.resources` still works."""

import sys

from feddb.resources import *  # noqa: F401,F403
from feddb.resources import main

if __name__ == "__main__":
    sys.exit(main())
