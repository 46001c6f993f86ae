"""The benchmark scripts under bench/ as modules, for the unit tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as the module ``name`` (once: a second call returns the same module).

    The scripts import each other by name (``import autoscaler_sim``), so bench/ goes on ``sys.path``.

    Raises:
        FileNotFoundError: when there is no such script.
    """
    if name in sys.modules:
        return sys.modules[name]
    path = BENCH / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(path)
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
