"""No import points up kvtop's floors: a package imports only from its own floor or lower ones, transport no kvtop.

Every `import` is read from the source with `ast` (those inside functions and under `TYPE_CHECKING` too), so
the test takes a second or two and starts no process.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FLOORS = (
    ("model",),
    ("sources",),
    ("views",),
    ("record", "sidecar", "export"),
    ("attach", "cluster"),
    ("source",),
    ("tui",),
    ("bench",),
    ("cli", "__main__"),
)
"""kvtop's packages, lowest first. `attach` (the dashboard's model server) reads recordings and `cluster` (the
embedded cluster) writes them: both sit above `record`. `kvtop/__init__.py` (`__version__`) is open to all."""
FLOOR = {package: floor for floor, packages in enumerate(FLOORS, start=1) for package in packages}


@dataclass(frozen=True)
class Import:
    """One import of a kvtop or transport module: where it is and what it names."""

    path: str
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def imports(path: Path, root: Path = REPO) -> list[Import]:
    """Every module of kvtop or transport that `path` imports, wherever the import stands in the file."""
    name = path.relative_to(root).with_suffix("").parts
    package = name[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            above = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*above, *([node.module] if node.module else [])])
            modules = [f"{module}.{alias.name}" if module == "kvtop" else module for alias in node.names]
        else:
            continue
        found += [
            Import(str(path.relative_to(root)), node.lineno, module)
            for module in dict.fromkeys(modules)
            if module.split(".")[0] in ("kvtop", "transport")
        ]
    return found


def package_of(module: str) -> str:
    """The kvtop package a module of kvtop belongs to (`kvtop.cli.when` -> `cli`; `kvtop` itself -> "")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__version__" else ""


def upward(root: Path = REPO) -> list[str]:
    """Each import that points up the floors (or out of transport into kvtop), and each package with no floor."""
    found = []
    for path in sorted((root / "transport").rglob("*.py")):
        found += [
            f"{hit} (transport imports no kvtop)" for hit in imports(path, root) if hit.module.startswith("kvtop")
        ]
    for path in sorted((root / "kvtop").rglob("*.py")):
        if path.parent == root / "kvtop" and path.stem == "__init__":
            continue
        own = path.relative_to(root / "kvtop").parts[0].removesuffix(".py")
        if own not in FLOOR:
            found.append(f"{path.relative_to(root)}: kvtop.{own} has no floor (add it to FLOORS)")
            continue
        for hit in imports(path, root):
            target = package_of(hit.module) if hit.module.startswith("kvtop") else ""
            if target and target != own and FLOOR.get(target, len(FLOORS) + 1) > FLOOR[own]:
                floor = FLOOR.get(target, "none")
                found.append(f"{hit} ({own} is on floor {FLOOR[own]}, {target} on floor {floor})")
    return found


def test_no_import_points_up_the_floors() -> None:
    """Every kvtop package has a floor and imports only from its own or lower ones; transport imports no kvtop."""
    assert upward() == []


def test_the_scan_sees_imports_in_functions_under_type_checking_and_relative_ones(tmp_path: Path) -> None:
    """An upward import inside a function, under `TYPE_CHECKING`, or written relative, is named with its line."""
    (tmp_path / "transport").mkdir()
    views = tmp_path / "kvtop" / "views"
    views.mkdir(parents=True)
    (views / "table.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from kvtop import __version__\n"
        "from kvtop.model import cluster\n"
        "if TYPE_CHECKING:\n"
        "    from kvtop.record.writer import Recorder\n"
        "def run():\n"
        "    import kvtop.cli.app\n"
        "    from ..tui import frame\n"
        "    from . import times\n"
    )

    assert upward(tmp_path) == [
        "kvtop/views/table.py:5 imports kvtop.record.writer (views is on floor 3, record on floor 4)",
        "kvtop/views/table.py:7 imports kvtop.cli.app (views is on floor 3, cli on floor 9)",
        "kvtop/views/table.py:8 imports kvtop.tui (views is on floor 3, tui on floor 7)",
    ]
