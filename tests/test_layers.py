"""The package's imports run one way: sources -> analysis -> policy -> actions -> daemon -> commands.

A module that imports one above it drags the layers above into the pure
core (the policy reading the config, the daemon needing the demo) and makes
the tree lie about the architecture; this test names each such import.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "guardian"

# lower ranks are imported by higher ones, never the reverse; same rank may import each other
RANKS = {
    "__init__": 0, "sample": 0, "clock": 0, "logs": 0, "state": 0, "ticker": 0, "sdnotify": 0, "listener": 0, "http1": 0,
    "sources": 1,
    "analysis": 2,
    "policy": 3,
    "actions": 4, "gateway": 4, "notify": 4, "snapshot": 4, "sim": 4,
    "config": 5, "exporter": 5, "status_json": 5, "summary_line": 5,
    "pipeline": 6, "record": 6,
    "daemon": 7,
    "commands": 8, "cli": 8, "__main__": 8,
}  # fmt: skip


def _room(module: str) -> str:
    """The top-level room of ``guardian.X.Y`` (``X``); the package itself is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "guardian":
            if node.module == "guardian":  # from guardian import config, logs
                found += [(node.lineno, f"guardian.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "guardian"]
    return found


def test_every_module_has_a_rank() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert rooms - set(RANKS) == set(), "new top-level modules need a rank here"


def test_imports_only_run_downward() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _room("guardian." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for line, module in _imports(path):
            there = _room(module)
            if there in RANKS and RANKS[there] > RANKS[here]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {module}")
    assert upward == []
