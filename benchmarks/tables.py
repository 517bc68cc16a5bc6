"""The docs' measured tables, rendered from the files the benchmarks wrote.

    feddb tables            # rewrite every generated table under docs/
    feddb tables --check    # exit 1 naming each table that differs from its files (the tests run it)

A generated table sits between two markers in a page; the first names the kind of table and the
measurement files it is made from, relative to the page:

    <!-- feddb tables: bench measurements/bench_cpu_small.json -->
    | measure | project | reference | ratio |
    ...
    <!-- end of generated table -->

Each kind is rendered by the function of the command that measured it (`feddb bench --json`,
`feddb throughput --out`, `feddb overhead --deployment --json`), the same table the command
prints, so a figure in the docs is the file's figure, never one typed by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^<!-- feddb tables: (\S+)((?: \S+)+) -->$")
END = "<!-- end of generated table -->"


def bench(files: list[dict]) -> str:
    from benchmarks.speed import table

    return table(files[0])


def throughput(files: list[dict]) -> str:
    """One measurement, or a time-sliced one and one under MPS shown beside it."""
    from benchmarks.throughput import table

    first, *rest = files
    cfg = first["config"]
    return table(
        first["results"],
        cfg["sweep_runs"],
        cfg.get("full_rounds") or full_rounds(cfg["experiment"]),
        mps=rest[0]["results"] if rest else None,
    )


def full_rounds(experiment: str) -> int:
    """The rounds of a run of the experiment (files written before they recorded it)."""
    from server_app.config import compose

    return int(compose([f"experiment={experiment}"])["num_rounds"])


def deployment_overhead(files: list[dict]) -> str:
    from benchmarks.deployoverhead import table

    return table(files[0])


KINDS: dict[str, Callable[[list[dict]], str]] = {
    "bench": bench,
    "throughput": throughput,
    "deployment-overhead": deployment_overhead,
}


class TableError(ValueError):
    """A marker names an unknown kind or a file that is not there, or has no end marker."""


def render(page: Path) -> str:
    """The page with every generated table rendered afresh from its files."""
    lines = page.read_text().split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        m = BEGIN.match(lines[i])
        i += 1
        if not m:
            continue
        kind, names = m.group(1), m.group(2).split()
        if kind not in KINDS:
            raise TableError(
                f"{page}:{i}: unknown table kind '{kind}'; choose from {', '.join(KINDS)}"
            )
        end = next((j for j in range(i, len(lines)) if lines[j] == END), None)
        if end is None:
            raise TableError(f"{page}:{i}: no '{END}' after the table's first marker")
        out += [KINDS[kind](measurements(page, names, i)), END]
        i = end + 1
    return "\n".join(out)


def measurements(page: Path, names: list[str], line: int) -> list[dict]:
    files = [page.parent / n for n in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise TableError(f"{page}:{line}: no measurement file {', '.join(missing)}")
    return [json.loads(f.read_text()) for f in files]


def pages(root: Path) -> list[Path]:
    """The pages under docs/ that hold a generated table."""
    return sorted(
        p
        for p in (root / "docs").rglob("*.md")
        if any(BEGIN.match(x) for x in p.read_text().split("\n"))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feddb tables", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if any differs")
    ap.add_argument("--root", default=str(PROJECT), help="the project whose docs/ to render")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    stale = []
    for page in pages(Path(args.root)):
        try:
            text = render(page)
        except TableError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if text != page.read_text():
            stale.append(page)
            if not args.check:
                page.write_text(text)
    verb = "differ from their files (run `feddb tables`)" if args.check else "rewritten"
    for page in stale:
        print(f"{page}: generated tables {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
