"""The two containers of a fetched model, as processes: ``kubeinfer-runtime fetch`` fills a directory
from an HTTP server, then ``kubeinfer-runtime serve`` loads the one ``.onnx`` file in it (the
report and the rest skipped), serves it, and exports the report as ``kubeinfer_model_fetch_*``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx
from tests.integration.runtime.conftest import FetchCli
from tests.support.storage import FileServer

pytestmark = pytest.mark.timeout(300)


def test_a_fetched_onnx_model_is_served_with_its_fetch_figures(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    model = simple_onnx(file_server.root / "simple.onnx")
    dest = tmp_path / "mnt" / "models"
    run = fetch_cli("--source", file_server.url("simple.onnx"), "--dest", str(dest), "--allow-http")
    assert run.returncode == 0, run.stderr + run.termination
    size = model.stat().st_size
    cfg = RuntimeConfig.model_validate(
        {
            "model": {"name": "simple", "source": str(dest), "format": "onnx"},
            "device": "cpu",
            "batching": {"max_batch_size": 4, "max_queue_delay_seconds": 0.005},
        }
    )
    with RuntimeProcess(cfg, ready_timeout=120) as rt:
        metrics = rt.metrics_text()
        assert re.search(rf'^kubeinfer_model_fetch_bytes\{{model="simple"\}} {size}\.0$', metrics, re.M), (
            metrics
        )
        seconds = re.search(r'^kubeinfer_model_fetch_seconds\{model="simple"\} (\S+)$', metrics, re.M)
        assert seconds is not None and 0 <= float(seconds.group(1)) < 60
        status, _ = rt.get("/v2/models/simple")
        assert status == 200
        log = rt.log_text()
        assert "model fetched by the init container: 1 file(s)" in log and "startup: fetch " in log
        # its own process: what the load left is frozen out of garbage collection before ready
        frozen = re.search(r"; (\d+) objects of the load frozen out of garbage collection", log)
        assert frozen is not None and int(frozen.group(1)) > 10_000, log
