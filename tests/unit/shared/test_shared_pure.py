"""kubeinfer/shared/ imports only the standard library (and itself), and both the runtime and the
activator use it: the one home of the mechanisms they share."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            out.append(str(node.module))
    return out


def test_shared_imports_only_the_standard_library() -> None:
    imported = [m for path in sorted((ROOT / "kubeinfer" / "shared").glob("*.py")) for m in _imports(path)]
    outside = [
        m
        for m in imported
        if m.split(".")[0] not in {*sys.stdlib_module_names, "__future__"}
        and not m.startswith("kubeinfer.shared")
    ]
    assert imported and outside == []


@pytest.mark.parametrize("side", ["runtime", "activator"])
def test_runtime_and_activator_import_the_hold_from_its_one_home(side: str) -> None:
    importers = [
        path
        for path in sorted((ROOT / side).rglob("*.py"))
        if any(m.startswith("kubeinfer.shared.hold") for m in _imports(path))
    ]
    assert importers, f"{side}/ does not use kubeinfer.shared.hold"
