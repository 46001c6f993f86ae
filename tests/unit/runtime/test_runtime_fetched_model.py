"""The runtime container's side of a fetched model: single-file loaders take a directory with exactly
one model file (skipping the fetch's report and temporary files), and the fetch report becomes
``kubeinfer_model_fetch_seconds`` / ``kubeinfer_model_fetch_bytes`` and a line of the startup log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kubeinfer.runtime import server as server_module
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.fetch.report import REPORT_NAME, FetchReport, write_report
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.onnx import model_file as onnx_file
from kubeinfer.runtime.models.torchscript import TorchScriptModel
from kubeinfer.runtime.models.torchscript import model_file as torchscript_file
from kubeinfer.runtime.server import RuntimeServer, startup_summary

from tests.unit.runtime.runtime_fakes import FakeModel

pytestmark = pytest.mark.timeout(120)


def fetched_dir(path: Path, *names: str) -> Path:
    """A directory as the fetch step leaves it: ``names``, the report, an interrupted attempt's file."""
    path.mkdir(parents=True)
    for name in names:
        (path / name).write_bytes(b"model")
    write_report(
        path, FetchReport(source="s3://models/m", files=len(names), bytes=5 * len(names), seconds=1.5)
    )
    (path / f".{names[0] if names else 'm.pt'}.abcd.kubeinfer-partial").write_bytes(b"half")
    return path


def test_torchscript_takes_the_one_model_file_of_a_directory(tmp_path: Path) -> None:
    d = fetched_dir(tmp_path / "one", "model.pt", "README.md")
    assert torchscript_file(str(d)) == d / "model.pt"
    assert torchscript_file(str(d / "model.pt")) == d / "model.pt"  # a file, as before
    for suffix in (".ts", ".torchscript", ".pth", ".PT"):
        assert torchscript_file(str(fetched_dir(tmp_path / suffix, f"m{suffix}"))).name == f"m{suffix}"


def test_torchscript_refuses_a_directory_with_none_or_several(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"expected exactly one TorchScript file .* found none"):
        torchscript_file(str(fetched_dir(tmp_path / "none", "config.json")))
    with pytest.raises(FileNotFoundError, match=r"found a\.pt, b\.ts"):
        torchscript_file(str(fetched_dir(tmp_path / "two", "a.pt", "b.ts")))
    with pytest.raises(FileNotFoundError, match="no such TorchScript file or directory"):
        torchscript_file(str(tmp_path / "missing"))


def test_onnx_skips_hidden_files_in_a_directory(tmp_path: Path) -> None:
    d = fetched_dir(tmp_path / "d", "simple.onnx")
    (d / ".simple.onnx").write_bytes(b"hidden")
    assert onnx_file(str(d)) == d / "simple.onnx"


def test_a_torchscript_model_loads_from_a_fetched_directory(tmp_path: Path) -> None:
    from hack.devtools.runtime_tiny import TORCHSCRIPT_IO, tiny_torchscript

    d = fetched_dir(tmp_path / "models")
    tiny_torchscript(d / "model.pt")
    cfg = RuntimeConfig.model_validate(
        {
            "model": {"name": "ts", "source": str(d), "format": "torchscript", **TORCHSCRIPT_IO},
            "device": "cpu",
        }
    )
    model = load_model(cfg)
    assert isinstance(model, TorchScriptModel) and [t.name for t in model.outputs] == ["y", "top"]


def test_the_startup_summary() -> None:
    report = {"model_load_seconds": 2.04, "warmup_seconds": 6.0}
    fetched = FetchReport(source="s3://b/p", files=3, bytes=87_200_000, seconds=4.1)
    assert startup_summary(report, fetched) == "fetch 4.1 s (87.2 MB, 3 files), load 2.0 s, warmup 6.0 s"
    assert startup_summary(report, None) == "load 2.0 s, warmup 6.0 s"


async def test_the_fetch_report_becomes_gauges_and_a_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = fetched_dir(tmp_path / "models", "model.onnx")
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": "fake", "source": str(d)}, "warmup": {"enabled": False}}
    )
    monkeypatch.setattr(server_module, "load_model", lambda _cfg: FakeModel())
    server = RuntimeServer(cfg)
    try:
        with caplog.at_level(logging.INFO, logger="kubeinfer.runtime.server"):
            await server._load_model()
        text = server.metrics.exposition().decode()
        assert 'kubeinfer_model_fetch_seconds{model="fake"} 1.5' in text
        assert 'kubeinfer_model_fetch_bytes{model="fake"} 5.0' in text
        line = "model fetched by the init container: 1 file(s), 0.0 MB in 1.5 s from s3://models/m"
        assert line in caplog.text
        assert "startup: fetch 1.5 s (0.0 MB, 1 file), load 0.5 s, warmup 0.2 s" in caplog.text
    finally:
        server.close()


async def test_no_report_no_fetch_series_and_a_bad_report_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server_module, "load_model", lambda _cfg: FakeModel())
    for name, content in (("plain", None), ("bad", "{not json")):
        d = tmp_path / name
        d.mkdir()
        if content is not None:
            (d / REPORT_NAME).write_text(content)
        cfg = RuntimeConfig.model_validate(
            {"model": {"name": "fake", "source": str(d)}, "warmup": {"enabled": False}}
        )
        server = RuntimeServer(cfg)
        try:
            with caplog.at_level(logging.WARNING, logger="kubeinfer.runtime.server"):
                await server._load_model()
            assert "kubeinfer_model_fetch_seconds{" not in server.metrics.exposition().decode()
        finally:
            server.close()
    assert "not a fetch report" in caplog.text
