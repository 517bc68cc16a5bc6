"""Moved to feddb.launch (the `feddb` command); kept so that `python -m server_app.launch` still works."""

import sys

from feddb.launch import *  # noqa: F401,F403
from feddb.launch import main

if __name__ == "__main__":
    sys.exit(main())
