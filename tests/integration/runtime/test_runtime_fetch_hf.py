"""``kubeinfer-runtime fetch`` of hf:// sources: huggingface_hub's snapshot_download against a local
Hub stand-in (``tests/support/hfhub.py``; why not a mirror such as olah: its docstring): allow
patterns, revisions, a missing revision or repository, a private repository and its token, a gated
one, the size limit; offline (``HF_HUB_OFFLINE=1``, as ``make test`` sets it, does not stop a fetch)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from kubeinfer.runtime.fetch import FetchError, FetchOptions
from kubeinfer.runtime.fetch.errors import HTML_PAGE_CAUSE
from kubeinfer.runtime.fetch.run import fetch

from tests.integration.runtime.conftest import FetchCli
from tests.support.hfhub import LocalHub, commit_of

pytestmark = pytest.mark.timeout(180)

MAIN = {
    "config.json": b'{"hidden_size": 8}',
    "tokenizer.json": b"{}" * 50,
    "model.safetensors": bytes(range(256)) * 100,
    "pytorch_model.bin": b"p" * 5000,
    "onnx/model.onnx": b"o" * 3000,
    "1_Pooling/config.json": b"{}",
    "README.md": b"# tiny",
}
V1 = {"config.json": b'{"hidden_size": 4}', "model.safetensors": b"v1"}
PATTERNS = ["*.json", "*.safetensors", "1_Pooling/*"]


def files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.fixture
def hub(local_hub: LocalHub) -> LocalHub:
    local_hub.add("org/tiny", {"main": MAIN, "v1": V1})
    local_hub.add("org/private", {"main": {"config.json": b"{}"}}, private=True)
    local_hub.add("org/gated", {"main": {"config.json": b"{}"}}, gated=True)
    return local_hub


def quiet_fetch(uri: str, dest: Path, hub: LocalHub, env: dict[str, str] | None = None, **kw: object) -> None:
    opts = FetchOptions(hf_endpoint=hub.endpoint, retries=0, **kw)  # type: ignore[arg-type]
    fetch(uri, dest, opts, env=env or {}, stream=io.StringIO())


def test_allow_patterns_download_only_what_they_match(
    hub: LocalHub, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    dest = tmp_path / "mnt" / "models"
    args = ["--source", "hf://org/tiny", "--dest", str(dest), "--hf-endpoint", hub.endpoint]
    for pattern in PATTERNS:
        args += ["--allow-pattern", pattern]
    run = fetch_cli(*args, env={"HF_HOME": str(tmp_path / "hf-home")})
    assert run.returncode == 0, run.stderr + run.termination
    assert files(dest) == [
        ".kubeinfer-fetch.json",
        "1_Pooling",
        "1_Pooling/config.json",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]  # no pytorch_model.bin, onnx/, README.md; no .cache or scratch left
    for name in ("config.json", "model.safetensors", "1_Pooling/config.json"):
        assert (dest / name).read_bytes() == MAIN[name]
    downloaded = {p.split("/resolve/", 1)[1] for m, p in hub.requests if m == "GET" and "/resolve/" in p}
    assert downloaded == {
        f"{commit_of('org/tiny', 'main')}/{n}"
        for n in ("config.json", "tokenizer.json", "model.safetensors", "1_Pooling/config.json")
    }
    report = json.loads((dest / ".kubeinfer-fetch.json").read_text())
    assert report["files"] == 4 and report["bytes"] == sum(len(MAIN[n]) for n in downloaded_names(downloaded))
    assert run.termination.startswith("fetched 4 files, 0.0 MB in ") and run.termination.endswith(
        " s from hf://org/tiny\n"
    )
    assert not (tmp_path / "hf-home").exists()  # the Hub's cache stayed in the destination, then went


def downloaded_names(paths: set[str]) -> list[str]:
    return [p.split("/", 1)[1] for p in paths]


def test_a_revision_by_tag_and_by_commit(hub: LocalHub, tmp_path: Path) -> None:
    quiet_fetch("hf://org/tiny@v1", tmp_path / "a", hub)
    assert (tmp_path / "a" / "config.json").read_bytes() == V1["config.json"]
    assert files(tmp_path / "a") == [".kubeinfer-fetch.json", "config.json", "model.safetensors"]
    quiet_fetch(f"hf://org/tiny@{commit_of('org/tiny', 'v1')}", tmp_path / "b", hub)
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == b"v1"


@pytest.mark.parametrize(
    ("uri", "env", "cause"),
    [
        ("hf://org/tiny@v9", {}, "revision not found"),
        (
            "hf://org/missing",
            {},
            "repository not found (a private repository needs HF_TOKEN: spec.model.credentials)",
        ),
        (
            "hf://org/private",
            {},
            "repository not found (a private repository needs HF_TOKEN: spec.model.credentials)",
        ),
        (
            "hf://org/private",
            {"HF_TOKEN": "hf_wrong_token_abcdef"},
            "repository not found, or HF_TOKEN has no access to it",
        ),
        (
            "hf://org/gated",
            {},
            "gated repository: accept its conditions on the Hub with the account whose HF_TOKEN is set",
        ),
    ],
)
def test_refusals_are_one_line(
    hub: LocalHub, fetch_cli: FetchCli, tmp_path: Path, uri: str, env: dict[str, str], cause: str
) -> None:
    run = fetch_cli("--source", uri, "--dest", str(tmp_path / "d"), "--hf-endpoint", hub.endpoint, env=env)
    assert run.returncode == 1, run.stderr
    assert run.termination == f"{uri}: {cause}\n"
    assert "retrying" not in run.stderr and "hf_wrong_token_abcdef" not in run.stderr
    assert files(tmp_path / "d") == []


def test_a_private_repository_with_its_token(hub: LocalHub, fetch_cli: FetchCli, tmp_path: Path) -> None:
    run = fetch_cli(
        "--source", "hf://org/private", "--dest", str(tmp_path / "d"), "--hf-endpoint", hub.endpoint,
        env={"HF_TOKEN": hub.token},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.termination
    assert (tmp_path / "d" / "config.json").read_bytes() == b"{}"
    assert hub.token not in run.stderr + run.termination


def test_patterns_that_match_nothing_and_the_size_limit(hub: LocalHub, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"no file to download: nothing matches --allow-pattern \*\.gguf"):
        quiet_fetch("hf://org/tiny", tmp_path / "a", hub, allow_patterns=("*.gguf",))
    hub.requests.clear()
    with pytest.raises(FetchError, match=r"to fetch, more than --size-limit 0.0 MB \(1000 bytes\)"):
        quiet_fetch("hf://org/tiny", tmp_path / "b", hub, size_limit=1000)
    assert not [p for m, p in hub.requests if m == "GET" and "/resolve/" in p]  # refused before any download
    assert files(tmp_path / "b") == []


def test_a_file_that_is_an_html_page_is_refused_and_deleted(local_hub: LocalHub, tmp_path: Path) -> None:
    page = b"\n<!doctype html><html><head><title>Sign in</title></head></html>\n"
    local_hub.add("org/login", {"main": {"config.json": b"{}", "model.safetensors": page, "doc.html": page}})
    with pytest.raises(FetchError) as info:
        quiet_fetch("hf://org/login", tmp_path / "d", local_hub)
    assert info.value.cause == HTML_PAGE_CAUSE
    assert not (tmp_path / "d" / "model.safetensors").exists()
