"""kstatus, the real one: ``sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute`` (what Flux and
cli-utils read an object's health with), run on objects from the API server.

The small Go program in ``tests/support/kstatus_go`` is built on first use into ``.cache/bin/kstatus``
(``go build``; the Go toolchain is the one ``make setup`` uses for hack/; modules come through the Go
proxy), again when its sources are newer.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "support" / "kstatus_go"
BINARY = ROOT / ".cache" / "bin" / "kstatus"


def binary() -> Path:
    """The built kstatus program (built now when missing or stale). Skips the test without Go."""
    newest = max(p.stat().st_mtime for p in SOURCE.iterdir())
    if BINARY.exists() and BINARY.stat().st_mtime >= newest:
        return BINARY
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        pytest.skip("no Go toolchain to build the kstatus checker")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(BINARY), "."], cwd=SOURCE, check=True, timeout=900)
    return BINARY


def compute(obj: dict[str, Any]) -> tuple[str, str]:
    """kstatus's ``(status, message)`` of one object: ``InProgress``, ``Failed``, ``Current``, ..."""
    out = subprocess.run(
        [str(binary())], input=json.dumps([obj]), capture_output=True, text=True, check=True, timeout=60
    )
    (result,) = json.loads(out.stdout)
    return str(result["status"]), str(result["message"])
