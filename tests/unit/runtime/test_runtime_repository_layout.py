"""The model repository's two layouts (``<model>/runtime.yaml`` and the flat ``<model>.yaml`` of a
ModelPool's ConfigMap mounted whole, with the kubelet's ``..data`` link), and a model added after start
found on its first request and on the repository index, without loading anything."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import HTTPError
from kubeinfer.runtime.repository import LoadError, ModelRepository, model_config

CONFIG = "model:\n  source: {source}\n  format: onnx\nwarmup:\n  enabled: false\n"


def _kubelet_configmap(root: Path, files: dict[str, str]) -> None:
    """``files`` laid out as the kubelet mounts a ConfigMap without items: the data in a timestamped
    directory, ``..data`` linking to it, and each key a link through ``..data``."""
    stamp = root / "..2026_12_05_23_00_00.000000001"
    stamp.mkdir(exist_ok=True)
    for key, text in files.items():
        (stamp / key).write_text(text)
    data = root / "..data"
    if data.is_symlink():
        data.unlink()
    data.symlink_to(stamp.name)
    for key in files:
        if not (root / key).is_symlink():
            (root / key).symlink_to(f"..data/{key}")


@pytest.fixture
def repository(tmp_path: Path) -> Iterator[ModelRepository]:
    root = tmp_path / "models"
    root.mkdir()
    (root / "dir-model").mkdir()
    (root / "dir-model" / "runtime.yaml").write_text(CONFIG.format(source="model.onnx"))
    (root / "notes.txt").write_text("not a model")
    (root / ".hidden.yaml").write_text(CONFIG.format(source="x.onnx"))
    _kubelet_configmap(root, {"flat-a.yaml": CONFIG.format(source="a.onnx")})
    repo = ModelRepository(RuntimeConfig.model_validate({"repository": {"path": str(root)}}))
    yield repo
    shutil.rmtree(repo._workdir, ignore_errors=True)


def test_both_layouts_are_models_and_kubelet_files_are_not(repository: ModelRepository) -> None:
    assert repository.scan() == ["dir-model", "flat-a"]


def test_a_relative_source_resolves_against_the_files_directory(repository: ModelRepository) -> None:
    root = repository.root
    flat = model_config(root / "flat-a.yaml", "flat-a")
    assert flat.model.name == "flat-a" and flat.model.source == str(root / "a.onnx")
    nested = model_config(root / "dir-model" / "runtime.yaml", "dir-model")
    assert nested.model.source == str(root / "dir-model" / "model.onnx")
    assert flat.server.port == 0 and flat.repository is None  # no port of its own


def test_a_model_process_stops_without_the_pods_shutdown_delay(repository: ModelRepository) -> None:
    # an InferenceService's runtime.yaml keeps a pod serving 5 s after SIGTERM (its endpoints leave the
    # Services meanwhile); an evicted model's process has no endpoints, and its memory counts until it exits
    path = repository.root / "flat-a.yaml"
    path.unlink()
    path.write_text(CONFIG.format(source="a.onnx") + "server:\n  shutdown_delay_seconds: 5\n")
    assert model_config(path, "flat-a").server.shutdown_delay_seconds == 0


def test_a_flat_file_naming_another_model_is_refused(repository: ModelRepository) -> None:
    path = repository.root / "other.yaml"
    path.write_text("model:\n  name: someone-else\n")
    with pytest.raises(LoadError, match="is not the file's name 'other'"):
        model_config(path, "other")


def test_a_model_the_kubelet_adds_later_is_found_on_request_and_index(repository: ModelRepository) -> None:
    repository.scan()
    with pytest.raises(HTTPError, match="unknown model"):
        repository._model("flat-b", None)
    _kubelet_configmap(
        repository.root,
        {"flat-a.yaml": CONFIG.format(source="a.onnx"), "flat-b.yaml": CONFIG.format(source="b.onnx")},
    )
    assert repository._model("flat-b", None).path == repository.root / "flat-b.yaml"
    (repository.root / "flat-c.yaml").write_text(CONFIG.format(source="c.onnx"))
    index = asyncio.run(repository.repository_index())
    assert [m["name"] for m in index] == ["dir-model", "flat-a", "flat-b", "flat-c"]
    assert {m["state"] for m in index} == {"UNAVAILABLE"}


def test_a_directory_wins_over_a_flat_file_of_the_same_name(repository: ModelRepository) -> None:
    (repository.root / "dir-model.yaml").write_text(CONFIG.format(source="elsewhere.onnx"))
    repository.scan()
    assert repository._model("dir-model", None).path == repository.root / "dir-model" / "runtime.yaml"


def test_the_index_carries_kubeinfers_keys(tmp_path: Path) -> None:
    """Beside Triton's four keys: resident bytes (loaded only), last use (wall clock, whole seconds), the
    counts, and the latest load's error while it stands (gone once a load is asked again)."""
    root = tmp_path / "models"
    root.mkdir()
    (root / "m.yaml").write_text(CONFIG.format(source="m.onnx"))
    repo = ModelRepository(
        RuntimeConfig.model_validate({"repository": {"path": str(root)}}), wall_clock=lambda: 1796526000.7
    )
    try:
        repo.scan()
        model = repo._models["m"]
        (entry,) = asyncio.run(repo.repository_index())
        assert entry == {
            "name": "m",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "",
            "residentBytes": 0,
            "loads": 0,
            "loadFailures": 0,
            "evictions": 0,
        }
        repo._load_failed(model, "cannot read m.onnx")
        model.used_at = repo._wall_clock()
        (entry,) = asyncio.run(repo.repository_index())
        assert entry["loadError"] == "cannot read m.onnx" and entry["loadFailures"] == 1
        assert entry["lastUsed"] == "2026-12-06T03:00:00Z"
        model.failed_at = None  # what a repository load does before it tries again
        assert "loadError" not in asyncio.run(repo.repository_index())[0]
        model.state, model.nbytes = "READY", 123
        assert asyncio.run(repo.repository_index())[0]["residentBytes"] == 123
    finally:
        shutil.rmtree(repo._workdir, ignore_errors=True)
