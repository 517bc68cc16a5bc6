"""Every path and `python -m` module the documentation names exists in the repository.

Scanned: README.md, docs/**/*.md, the comments of conf/**/*.yaml, and the string literals
(docstrings included) of the Python packages. Checked:

- repository-relative paths (`docs/x.md`, `conf/a/b.yaml`, `fssl/x.py`, `tests/test_x.py::name`,
  `scripts/...`, `notes/...`), whose first component is one of ROOTS, and top-level documents
  named in capitals (`README.md`, `SPEC.md`);
- markdown links to relative files (resolved from the page that links), and their `#anchors`
  where they point into a markdown page;
- `python -m <module>` invocations: a module of the repository must exist as a file or package,
  any other must be importable (`importlib.util.find_spec`).

Ignored: URLs, absolute paths, `~`, `$VARS`, globs, `<placeholders>`, output paths (after `--out`,
`--json`, `out=`, `output-dir=`) and anything under runs/, whose directories a run makes.
Pure text processing: nothing is imported from the project.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fssl", "client_app", "server_app", "strategy", "feddb", "benchmarks", "studies")
# First components that make a token a repository path. Fixed, not read from the tree, so that a
# reference to a directory that has gone (scripts/, notes/) is still seen as one.
ROOTS = (
    "docs",
    "conf",
    "tests",
    "scripts",
    "notes",
    "fssl",
    "client_app",
    "server_app",
    "strategy",
    "feddb",
    "benchmarks",
    "studies",
    ".ci",
)
README_LIMIT = 8192

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+|\bmailto:\S+|\bwww\.\S+", re.I)
PATH = re.compile(
    r"(?<![\w./~$@{<>=:-])"  # not inside a longer path, a URL or a variable
    r"(?P<path>(?:" + "|".join(re.escape(r) for r in ROOTS) + r")/[\w./-]*)"
    r"(?P<test>::\w+)?"
    r"(?P<next>.?)"
)
# `=` may precede a path (PYTHONPATH=docs/examples, sweep=...) but only after a KEY of capitals
ASSIGNED = re.compile(
    r"(?<![\w./~$@{<>-])[A-Z_][A-Z0-9_]*=(?P<path>(?:"
    + "|".join(re.escape(r) for r in ROOTS)
    + r")/[\w./-]*)"
)
TOP_DOC = re.compile(r"(?<![\w./~$@-])(?P<path>[A-Z][A-Z0-9_-]*\.md)\b")
MODULE = re.compile(r"\bpython[\d.]*\s+-m\s+(?P<module>[A-Za-z_][\w.]*)")
LINK = re.compile(r"!?\[[^\]\n]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
OUTPUT_ARG = re.compile(r"(?:--out|--json|--output|\bout=|\boutput-dir=)['\"]?\s*$")
PLACEHOLDER_NEXT = set("<{*?[$")


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _yaml_comments(path: Path) -> str:
    """The comments of a YAML file (a `#` at the start or after a space, outside quotes)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1].isspace()):
                lines.append(line[i + 1 :])
                break
        else:
            lines.append("")
    return "\n".join(lines)


def _python_strings(path: Path) -> str:
    """The string literals of a module, one a line block (f-strings' literal parts apart)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
    return "\n\n".join(parts)


def _sources(group: str) -> list[tuple[Path, str]]:
    if group == "README.md":
        return [(ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8"))]
    if group == "docs":
        return [(p, p.read_text(encoding="utf-8")) for p in sorted((ROOT / "docs").rglob("*.md"))]
    if group == "conf":
        return [(p, _yaml_comments(p)) for p in sorted((ROOT / "conf").rglob("*.yaml"))]
    if group == "python":
        return [
            (p, _python_strings(p))
            for pkg in PACKAGES
            for p in sorted((ROOT / pkg).rglob("*.py"))
            if "__pycache__" not in p.parts
        ]
    raise ValueError(group)


def _exists(rel: str) -> bool:
    return (ROOT / rel.rstrip("/")).exists() if rel.strip("/") else True


def _repo_module(module: str) -> bool | None:
    """True/False for a module of this repository, None for one from elsewhere."""
    parts = module.split(".")
    if not (
        (ROOT / parts[0]).is_dir() or (ROOT / f"{parts[0]}.py").is_file() or parts[0] in PACKAGES
    ):
        return None
    base = ROOT.joinpath(*parts)
    return (
        base.with_suffix(".py").is_file()
        or (base / "__init__.py").is_file()
        or (base / "__main__.py").is_file()
    )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def missing_references(group: str) -> list[str]:
    """'file:line: reference (why)' for every reference of `group` that does not resolve."""
    missing = []
    for path, text in _sources(group):
        rel_file = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{rel_file}:{lineno}"
            if group == "python":
                where = f"{rel_file} (a string literal)"
            clean = URL.sub(" ", line)
            found = [
                (m.group("path"), m.group("test"), m.group("next"), m.start())
                for m in PATH.finditer(clean)
            ]
            found += [
                (m.group("path"), None, "", m.start("path")) for m in ASSIGNED.finditer(clean)
            ]
            for ref, test, nxt, start in found:
                ref = ref.rstrip(".")
                if nxt in PLACEHOLDER_NEXT or ref.endswith("/...") or "..." in ref:
                    continue
                if OUTPUT_ARG.search(clean[:start]):
                    continue
                if not _exists(ref):
                    missing.append(f"{where}: {ref} (no such file or directory)")
                elif test and f"def {test[2:]}(" not in (ROOT / ref).read_text(encoding="utf-8"):
                    missing.append(f"{where}: {ref}{test} (no such test)")
            for m in TOP_DOC.finditer(clean):
                if not _exists(m.group("path")):
                    missing.append(f"{where}: {m.group('path')} (no such file at the top level)")
            for m in MODULE.finditer(clean):
                module = m.group("module").rstrip(".")
                ok = _repo_module(module)
                if ok is None:
                    try:
                        ok = importlib.util.find_spec(module) is not None
                    except (ImportError, ValueError):
                        ok = False
                if not ok:
                    missing.append(f"{where}: python -m {module} (no such module)")
            if path.suffix == ".md":
                for m in LINK.finditer(line):
                    target = m.group("target").strip("<>")
                    if URL.match(target) or target.startswith(("#", "/", "~", "$")):
                        continue
                    file_part, _, anchor = target.partition("#")
                    dest = (path.parent / file_part).resolve()
                    if not dest.exists():
                        missing.append(f"{where}: link {target} (no such file)")
                    elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                        missing.append(f"{where}: link {target} (no such heading)")
            if path.suffix == ".md":  # same-page anchors
                for m in re.finditer(r"\]\(#(?P<anchor>[^)\s]+)\)", line):
                    if m.group("anchor") not in _anchors(path):
                        missing.append(f"{where}: link #{m.group('anchor')} (no such heading)")
    return missing


@pytest.mark.parametrize("group", ["README.md", "docs", "conf", "python"])
def test_every_named_path_and_module_exists(group):
    missing = missing_references(group)
    assert not missing, (
        f"{len(missing)} reference(s) in {group} to paths or modules that do not "
        "exist in the repository:\n  " + "\n  ".join(missing)
    )


def test_readme_is_at_most_8_kib():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes, over {README_LIMIT}: move detail "
        "into the docs/ page it belongs to"
    )


def test_the_scanner_sees_what_it_should():
    """The patterns catch a missing path, module and link, and leave placeholders alone."""
    line = (
        "see docs/nope.md, `python -m server_app.nope`, [x](nope.md), "
        "runs/<name>/x, /tmp/docs/a, $PWD/docs/b, docs/*.json, --out docs/new, "
        "http://example.com/docs/c.md, SPEC_NOPE.md"
    )
    assert [
        m.group("path")
        for m in PATH.finditer(URL.sub(" ", line))
        if m.group("next") not in PLACEHOLDER_NEXT
    ] == ["docs/nope.md", "docs/new"]
    assert OUTPUT_ARG.search(line[: line.index("docs/new")])
    assert [m.group("module") for m in MODULE.finditer(line)] == ["server_app.nope"]
    assert _repo_module("server_app.nope") is False and _repo_module("fssl.config") is True
    assert [m.group("target") for m in LINK.finditer(line)] == ["nope.md"]
    assert [m.group("path") for m in TOP_DOC.finditer(line)] == ["SPEC_NOPE.md"]
    assert _slug("The paper's claims, tested") == "the-papers-claims-tested"
    assert _slug("Configuration (`conf/`)") == "configuration-conf"


# Pages a project command writes (feddb claims, feddb report, tests/test_bad_inputs.py): apart
# from the word budget, which is for the pages people write.
GENERATED = {
    "docs/claims/claims.md",
    "docs/running/bad_inputs.md",
    *(f"docs/{d}/results.md" for d in ("methods_study", "miniature", "partitioners")),
    *(f"docs/{d}/results.md" for d in ("scenarios", "strategies", "softmatch", "global_prior")),
    "docs/uda/results.md",
    "docs/partial_clients/results.md",
}


def test_the_docs_stay_reference_pages_within_their_word_budget():
    """README ≤ 900 words; README and every hand-written page under docs/ ≤ 20,000 together."""
    pages = [p for p in _markdown_files() if p.relative_to(ROOT).as_posix() not in GENERATED]
    words = {p.relative_to(ROOT).as_posix(): len(p.read_text().split()) for p in pages}
    assert words["README.md"] <= 900, words["README.md"]
    assert sum(words.values()) <= 20_000, sorted(words.items(), key=lambda kv: -kv[1])[:5]
    assert all((ROOT / g).is_file() for g in GENERATED)  # the list names real pages
