"""The API package (operator/api/) re-exports every public name its modules define, so that
``from kubeinfer.operator import api`` and ``api.NAME`` reach all of them, whichever module holds it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from kubeinfer.operator import api

PACKAGE = Path(api.__file__).parent


def _defined(path: Path) -> set[str]:
    """The public names a module binds at top level (classes, functions, constants, type aliases)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def _from_the_contract() -> set[str]:
    """The names api/__init__.py re-exports from kubeinfer.contract (their one home is there)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and str(node.module).startswith("kubeinfer.contract")
        for alias in node.names
    }


def test_every_public_name_is_exported_once() -> None:
    seen: dict[str, str] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"{api.__name__}.{path.stem}")
        for name in _defined(path):
            assert name not in seen, f"{name} is defined in both {seen[name]} and {path.stem}"
            seen[name] = path.stem
            assert name in api.__all__, f"api.{path.stem}.{name} is not re-exported by api/__init__.py"
            assert getattr(api, name) is getattr(module, name)
    contract = _from_the_contract()
    assert {"GROUP", "PLURAL", "RUNTIME_PORT"} <= contract and not contract & set(seen)
    assert sorted(api.__all__) == sorted([*seen, *contract]), "api.__all__ names something no module defines"
