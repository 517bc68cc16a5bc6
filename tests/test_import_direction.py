"""Dependencies point down: benchmarks, studies -> feddb -> server_app, client_app -> strategy ->
fssl. The core imports neither Flower nor the apps; a strategy knows nothing of the apps; the two
apps know nothing of each other or of the user's tools; the user's tools know nothing of the
instruments (benchmarks/, studies/), which know nothing of each other. No module imports itself
through others. Every import counts, including those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]

# package -> the top-level modules it must never import
INSTRUMENTS = {"benchmarks", "studies"}
FORBIDDEN = {
    "fssl": {"flwr", "strategy", "server_app", "client_app", "feddb", *INSTRUMENTS},
    "strategy": {"server_app", "client_app", "feddb", *INSTRUMENTS},
    "client_app": {"server_app", "feddb", *INSTRUMENTS},
    "server_app": {"client_app", "feddb", *INSTRUMENTS},
    "feddb": INSTRUMENTS,
    "benchmarks": {"studies"},
    "studies": {"benchmarks"},
}


def imported_modules(source: str) -> set[str]:
    """Top-level names of every module a source imports (relative imports stay in the package)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def violations(package: str) -> list[str]:
    out = []
    for path in sorted((PROJECT / package).rglob("*.py")):
        bad = imported_modules(path.read_text()) & FORBIDDEN[package]
        out += [f"{path.relative_to(PROJECT)} imports {name}" for name in sorted(bad)]
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package):
    assert violations(package) == []


def test_the_check_sees_upward_imports_anywhere_in_a_file():
    source = (
        "import numpy\n\ndef f():\n    from flwr.app import Message\n    import server_app.app\n"
    )
    assert imported_modules(source) & FORBIDDEN["fssl"] == {"flwr", "server_app"}
    assert imported_modules("from .config import require\n") == set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports (relative ones resolved; `from pkg import mod` is the
    module when `pkg.mod` is one), inside functions included."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            subs: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            root = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*root, *(node.module.split(".") if node.module else [])])
            bases, subs = [base], [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg
        out.update(sub for sub in subs if sub in known)
        if len([sub for sub in subs if sub in known]) < len(subs) or not subs:
            out.update(base for base in bases if base in known)
        out.discard(module_name(path))
    return out


def import_circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    files = [p for package in FORBIDDEN for p in sorted((PROJECT / package).rglob("*.py"))]
    known = {module_name(p) for p in files}
    graph = {module_name(p): project_imports(p, known) for p in files}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    assert import_circles() == []


def test_the_circle_check_sees_a_circle_through_a_function(tmp_path, monkeypatch):
    for name, source in {
        "a.py": "def f():\n    from b import g\n",
        "b.py": "from a import f\n",
    }.items():
        (tmp_path / "fssl" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "fssl" / name).write_text(source.replace("from ", "from fssl."))
    monkeypatch.setattr(__import__(__name__), "PROJECT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "FORBIDDEN", {"fssl": set()})
    assert import_circles() == [["fssl.a", "fssl.b"]]


# What a ClientApp process may not load: each is paid again by every message a SuperNode answers
# (Flower 1.41 starts a fresh ClientApp process per message), and none is needed to train.
NOT_IN_A_CLIENT = (
    "hydra",
    "omegaconf",
    "matplotlib",
    "pandas",
    "scipy",
    "yaml",
    "ray",
    "tensorboard",
    "mlflow",
    "wandb",
    "datasets",
    "flwr_datasets",
    "PIL",
    "torchvision",
    "feddb",
    "server_app",
)


def loaded_by(module: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `module`."""
    import subprocess
    import sys

    probe = (
        f"import sys, {module}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_the_client_app_imports_only_what_a_client_needs():
    """Flower starts a process per message: the ClientApp module itself loads Flower and the
    reply contract, not torch (the work, client_app.work, loads once per resident process)."""
    app = loaded_by("client_app.app")
    assert "flwr" in app and "client_app" in app  # the probe saw the app's imports
    assert sorted(app & {"torch", "torchvision", "scipy", *NOT_IN_A_CLIENT}) == []
    work = loaded_by("client_app.work")
    assert "torch" in work and "flwr" in work
    assert sorted(work & set(NOT_IN_A_CLIENT)) == []


def test_the_attack_code_stays_off_a_normal_clients_path():
    import subprocess
    import sys

    probe = "import sys, client_app.work\nprint('client_app.attacks' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_the_users_tools_stay_within_4500_lines():
    """feddb/ holds what a user runs; the instruments live in benchmarks/ and studies/. (4,000
    until runs had identities: the checks sweeps and reports make of them took 230 more, what a
    run is living in fssl/identity.py; 4,250 until a report took a study's plan, feddb/plan.py,
    and a resume gave clients back what they keep: 220 more.)"""
    lines = sum(len(p.read_text().splitlines()) for p in (PROJECT / "feddb").glob("*.py"))
    assert lines <= 4500, lines


def test_the_server_app_does_not_load_the_superlinks_state():
    """A deployed ServerApp talks to the SuperLink over gRPC: Flower's simulation grid module, and
    the SuperLink's database layers it pulls in, would add seconds to its start."""
    app = loaded_by("server_app.app")
    assert "torch" in app and "flwr" in app
    assert sorted(app & {"sqlalchemy", "alembic", "fastapi"}) == []
