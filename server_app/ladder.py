"""Moved to feddb.ladder (the `feddb` command); kept so that `python -m server_app.ladder` still works."""

import sys

from feddb.ladder import *  # noqa: F401,F403
from feddb.ladder import main

if __name__ == "__main__":
    sys.exit(main())
