"""Where Triton's ``perf_analyzer`` is on this machine, for the tests and the benchmarks.

``make setup`` installs it as ``.cache/bin/perf_analyzer`` (hack/setup.sh step 10,
``hack/perf-analyzer.pins``): a wrapper that runs the ``perf-analyzer`` wheel's binary through a Debian
trixie glibc sysroot (it needs a newer glibc than the machine's). ``$KUBEINFER_PERF_ANALYZER`` names
another one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where ``make setup`` puts the perf_analyzer wrapper.
PERF_ANALYZER = ROOT / ".cache" / "bin" / "perf_analyzer"
#: The environment variable naming another perf_analyzer.
PERF_ANALYZER_ENV = "KUBEINFER_PERF_ANALYZER"


class PerfAnalyzerMissing(RuntimeError):
    """No runnable perf_analyzer: the message says which was tried and to run ``make setup``."""


def find_perf_analyzer() -> Path:
    """``.cache/bin/perf_analyzer``, else ``$KUBEINFER_PERF_ANALYZER``, checked with ``--version``
    (perf_analyzer 2.60 has no ``--help``).

    Raises:
        PerfAnalyzerMissing: neither exists, or the one found does not run.
    """
    candidates = [PERF_ANALYZER]
    if os.environ.get(PERF_ANALYZER_ENV):
        candidates.append(Path(os.environ[PERF_ANALYZER_ENV]))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            done = subprocess.run(
                [str(path), "--version"], capture_output=True, text=True, timeout=60, check=False
            )
            if done.returncode == 0 and "Perf Analyzer Version" in done.stdout + done.stderr:
                return path
            raise PerfAnalyzerMissing(
                f"{path} --version failed (exit {done.returncode}): {(done.stdout + done.stderr)[-500:]}; "
                "run `make setup` (hack/setup.sh step 10 installs perf_analyzer)"
            )
    raise PerfAnalyzerMissing(
        f"perf_analyzer is missing ({PERF_ANALYZER}; ${PERF_ANALYZER_ENV} not set or not a binary): "
        "run `make setup` (hack/setup.sh step 10 installs it)"
    )
