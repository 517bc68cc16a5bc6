"""Moved to feddb.benchmark (`feddb bench`); kept so that `python scripts/benchmark.py` still works."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from feddb.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
