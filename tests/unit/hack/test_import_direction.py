"""Dependencies point one way: tests/ may import hack/ and bench/, never the reverse.

hack/ (the demo, the local cluster) and bench/ run outside pytest; the helpers they share with the
tests live in hack/devtools/. import-linter covers only the ``kubeinfer`` package, so this test
parses every module under hack/ and bench/ and fails on any import of ``tests``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHECKED = ("hack", "bench")


def imports_of_tests(source: str) -> list[tuple[int, str]]:
    """(line, module) of every ``import tests...`` / ``from tests... import`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "tests" or name.startswith("tests.")]
    return found


def test_the_check_sees_every_form_of_import() -> None:
    source = (
        "import tests\n"
        "import os, tests.support.cluster\n"
        "from tests.support import cluster\n"
        "def f():\n"
        "    from tests import conftest\n"
        "import testsuite\n"
        "from hack.devtools import prom\n"
    )
    assert imports_of_tests(source) == [
        (1, "tests"),
        (2, "tests.support.cluster"),
        (3, "tests.support"),
        (5, "tests"),
    ]


def test_hack_and_bench_never_import_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for folder in CHECKED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, module in imports_of_tests(path.read_text())
    ]
    assert offenders == [], "move what they need to hack/devtools/:\n" + "\n".join(offenders)
