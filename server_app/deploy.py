"""Moved to feddb.deploy (the `feddb` command); kept so that `python -m server_app.deploy` still works."""

import sys

from feddb.deploy import *  # noqa: F401,F403
from feddb.deploy import main

if __name__ == "__main__":
    sys.exit(main())
