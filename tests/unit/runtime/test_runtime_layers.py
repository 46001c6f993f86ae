"""The runtime's layers contract (pyproject.toml, ``id = "runtime-layers"``) holds on the tree as it
is, and import-linter reports it broken when an import against the layers is planted in a copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.timeout(120)


def lint(tmp_path: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the contract over a copy of the runtime (as ``make lint`` lays it out: a ``kubeinfer/`` tree),
    with ``plant`` = (module file under runtime/, import line) appended to one module."""
    pkg = tmp_path / "lintroot" / "kubeinfer"
    pkg.mkdir(parents=True)
    shutil.copy(ROOT / "kubeinfer" / "__init__.py", pkg / "__init__.py")
    (pkg / "contract").symlink_to(ROOT / "kubeinfer" / "contract")
    shutil.copytree(ROOT / "runtime", pkg / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "operator").symlink_to(ROOT / "operator")
    if plant is not None:
        module, line = plant
        with (pkg / "runtime" / module).open("a") as f:
            f.write(f"\n{line}  # planted\n")
    cmd = [
        str(LINT_IMPORTS),
        "--no-cache",
        "--no-logo",
        "--contract",
        "runtime-layers",
        str(ROOT / "pyproject.toml"),
    ]
    return subprocess.run(cmd, cwd=pkg.parent, capture_output=True, text=True, timeout=100, check=False)


def test_the_tree_keeps_the_runtime_layers(tmp_path: Path) -> None:
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "KEPT" in result.stdout and "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("dataplane.py", "import kubeinfer.runtime.rest"),  # the data plane calls no transport
        ("batching.py", "from kubeinfer.runtime import dataplane"),  # the batcher knows no data plane
        ("models/base.py", "import kubeinfer.runtime.batching"),  # a model knows no batcher
        ("executor.py", "import kubeinfer.runtime.batching"),  # the threads sit under the batcher
        ("rest.py", "import kubeinfer.runtime.ipc"),  # sibling transports are independent
        ("grpc_server.py", "import kubeinfer.runtime.server"),  # a transport does not reach up
        ("fetch/run.py", "import kubeinfer.runtime.rest"),  # the fetch step knows no server or transport
        ("models/base.py", "import kubeinfer.runtime.fetch.report"),  # models and fetch are independent
    ],
)
def test_a_planted_import_against_the_layers_breaks_the_contract(
    tmp_path: Path, module: str, line: str
) -> None:
    result = lint(tmp_path, (module, line))
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout and "0 kept, 1 broken" in result.stdout
