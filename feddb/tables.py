"""`feddb tables`: the README's and docs' measured tables, rendered from the files commands wrote.

    feddb tables            # rewrite every generated table (README.md, docs/)
    feddb tables --check    # exit 1 naming each page whose tables differ from their files

A generated table sits between `<!-- feddb tables: benchmarks.speed:table measurements/x.json -->`
and `<!-- end of generated table -->`: the function its command prints with, called with the
parsed files (JSON, or CSV as a list of rows; paths relative to the page), renders it."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import re
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^<!-- feddb tables: ([\w.]+):(\w+)((?: \S+)+) -->$")
END = "<!-- end of generated table -->"


class TableError(ValueError):
    """A marker without its end, function or files, or files its function cannot render."""


def render(page: Path) -> str:
    """The page with every generated table rendered afresh from its files."""
    lines, out, i = page.read_text().split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        m, i = BEGIN.match(lines[i]), i + 1
        if not m:
            continue
        where = f"{page}:{i}"
        end = next((j for j in range(i, len(lines)) if lines[j] == END or BEGIN.match(lines[j])), i)
        if lines[end : end + 1] != [END]:
            raise TableError(f"{where}: no '{END}' after the table's first marker")
        files = [page.parent / n for n in m.group(3).split()]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise TableError(f"{where}: no measurement file {', '.join(missing)}")
        try:
            make = getattr(importlib.import_module(m.group(1)), m.group(2))
        except (ImportError, AttributeError):
            raise TableError(f"{where}: no function {m.group(1)}:{m.group(2)}") from None
        try:
            out += [make(*(parsed(f) for f in files)), END]
        except (ValueError, KeyError, TypeError) as err:  # a file that is not the function's
            raise TableError(
                f"{where}: {m.group(1)}:{m.group(2)} cannot render it: {err!r}"
            ) from None
        i = end + 1
    return "\n".join(out)


def parsed(f: Path) -> object:
    """A measurement file: JSON, or a CSV (`feddb claims`' claims.csv) as its rows."""
    text = f.read_text()
    return list(csv.DictReader(text.splitlines())) if f.suffix == ".csv" else json.loads(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feddb tables", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if any differs")
    ap.add_argument("--root", default=str(PROJECT), help="the project whose docs/ to render")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    docs, stale = Path(args.root) / "docs", []
    try:
        if not docs.is_dir():
            raise TableError(f"no docs/ in {args.root}: give --root the project's directory")
        pages = [docs.parent / "README.md", *sorted(docs.rglob("*.md"))]
        rendered = {page: render(page) for page in pages if page.is_file()}
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for page, text in rendered.items():
        if text != page.read_text():
            stale.append(page)
            print(f"{page}: generated tables {'differ' if args.check else 'rewritten'}")
            if not args.check:
                page.write_text(text)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
