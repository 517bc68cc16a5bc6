"""No function outside tests/ runs over 100 lines (decorators, signature and docstring included):
past that a reader loses the thread, and the function holds parts that want names of their own."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
LIMIT = 100
# the project's code: its packages and the examples in docs/ (tests/ may hold long scenarios)
ROOTS = ("benchmarks", "client_app", "docs", "feddb", "fssl", "server_app", "strategy", "studies")


def long_functions(source: str, name: str, limit: int = LIMIT) -> list[str]:
    """`name:function (lines)` for each function (nested ones too) longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - start + 1
            if lines > limit:
                out.append(f"{name}:{node.name} ({lines} lines)")
    return out


def test_no_function_outside_tests_runs_over_100_lines():
    found = []
    for root in ROOTS:
        for path in sorted((PROJECT / root).rglob("*.py")):
            found += long_functions(path.read_text(), str(path.relative_to(PROJECT)))
    assert found == []


def test_the_check_counts_decorators_and_nested_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 3))
    source = f"@decorated\ndef outer():\n    def inner():\n{body.replace('    ', '        ')}"
    assert long_functions(source, "m") == []  # 1 + 1 + 1 + 97 = 100 lines
    assert long_functions("@more\n" + source, "m") == ["m:outer (101 lines)"]
    assert long_functions(source, "m", limit=LIMIT - 3) == [
        "m:outer (100 lines)",
        "m:inner (98 lines)",
    ]
