"""Moved to feddb.report (the `feddb` command); kept so that `python -m server_app.report` still works."""

import sys

from feddb.report import *  # noqa: F401,F403
from feddb.report import main

if __name__ == "__main__":
    sys.exit(main())
