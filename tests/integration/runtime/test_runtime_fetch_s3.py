"""``kubeinfer-runtime fetch`` of s3:// sources against a real MinIO server (``make setup`` builds
it; the ``minio_server`` fixture fails without it): a prefix of several files, one object, an
archive object, wrong credentials, a missing bucket or key, sha256, the size limit, path-style
addressing, an endpoint that does not answer."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.runtime.fetch import FetchError, FetchOptions
from kubeinfer.runtime.fetch import s3 as s3_backend
from kubeinfer.runtime.fetch.errors import HTML_PAGE_CAUSE
from kubeinfer.runtime.fetch.run import fetch

from tests.integration.runtime.conftest import FetchCli
from tests.support.storage import MinioServer, free_port

pytestmark = pytest.mark.timeout(180)

BERT = {
    "bert/config.json": b'{"hidden_size": 8}',
    "bert/tokenizer.json": b"{}" * 100,
    "bert/1_Pooling/config.json": b"{}",
    "bert/model.safetensors": bytes(range(256)) * 400,
    "bert/": b"",  # a directory marker, as consoles make them
}
ONNX = b"onnx model bytes" * 1000


def files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.fixture(scope="module")
def store(minio_server: MinioServer) -> MinioServer:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.onnx")
        info.size = len(ONNX)
        tar.addfile(info, io.BytesIO(ONNX))
    minio_server.put("models", {**BERT, "simple/model.onnx": ONNX, "packed/model.tar.gz": buf.getvalue()})
    minio_server.put("empty", {})
    return minio_server


def options(store: MinioServer, **kw: Any) -> FetchOptions:
    return FetchOptions(s3_endpoint=store.endpoint, s3_region="us-east-1", s3_addressing_style="path", **kw)


def quiet_fetch(
    uri: str, dest: Path, store: MinioServer, env: dict[str, str] | None = None, **kw: Any
) -> None:
    fetch(uri, dest, options(store, **kw), env=store.env() if env is None else env, stream=io.StringIO())


def test_a_prefix_of_several_files_through_the_command_line(
    store: MinioServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    dest = tmp_path / "mnt" / "models"
    run = fetch_cli(
        "--source", "s3://models/bert", "--dest", str(dest),
        "--s3-endpoint", store.endpoint, "--s3-region", "us-east-1", "--s3-addressing-style", "path",
        env=store.env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.termination
    assert files(dest) == [
        ".kubeinfer-fetch.json",
        "1_Pooling",
        "1_Pooling/config.json",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    for key, data in BERT.items():
        if not key.endswith("/"):
            assert (dest / key.removeprefix("bert/")).read_bytes() == data
    total = sum(len(v) for v in BERT.values())
    assert json.loads((dest / ".kubeinfer-fetch.json").read_text())["bytes"] == total
    assert run.termination.startswith("fetched 4 files, 0.1 MB in ") and run.termination.endswith(
        " s from s3://models/bert\n"
    )
    assert "fetch: s3://models/bert: 4 object(s) under bert/" in run.stderr
    assert store.secret_key not in run.stderr + run.termination


def test_one_object_and_an_archive_object(store: MinioServer, tmp_path: Path) -> None:
    quiet_fetch(
        "s3://models/simple/model.onnx", tmp_path / "a", store, sha256=hashlib.sha256(ONNX).hexdigest()
    )
    assert files(tmp_path / "a") == [".kubeinfer-fetch.json", "model.onnx"]
    assert (tmp_path / "a" / "model.onnx").read_bytes() == ONNX
    quiet_fetch("s3://models/packed/model.tar.gz", tmp_path / "b", store)
    assert files(tmp_path / "b") == [".kubeinfer-fetch.json", "model.onnx"]


@pytest.mark.parametrize(
    ("uri", "env_change", "cause"),
    [
        ("s3://models/bert", {"AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}, "403 SignatureDoesNotMatch"),
        ("s3://models/bert/", {"AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}, "403 SignatureDoesNotMatch"),
        ("s3://models/bert", {"AWS_ACCESS_KEY_ID": "nobody"}, "403 InvalidAccessKeyId"),
        ("s3://no-such-bucket/bert", {}, "404 NoSuchBucket"),
        ("s3://models/no/such/key", {}, "no object at this key or prefix (404 NoSuchKey)"),
        ("s3://empty", {}, "no object at this key or prefix (404 NoSuchKey)"),
    ],
)
def test_refusals_are_one_line_and_at_once(
    store: MinioServer, fetch_cli: FetchCli, tmp_path: Path, uri: str, env_change: dict[str, str], cause: str
) -> None:
    run = fetch_cli(
        "--source", uri, "--dest", str(tmp_path / "d"), "--s3-endpoint", store.endpoint,
        env={**store.env(), **env_change},
    )  # fmt: skip
    assert run.returncode == 1
    assert run.termination == f"{uri}: {cause}\n"
    assert "retrying" not in run.stderr  # a 4xx is not retried
    assert files(tmp_path / "d") == []


def test_sha256_mismatch_and_sha256_with_a_prefix(store: MinioServer, tmp_path: Path) -> None:
    with pytest.raises(FetchError) as info:
        quiet_fetch("s3://models/simple/model.onnx", tmp_path / "a", store, sha256="ab" * 32)
    assert info.value.cause.startswith("sha256 mismatch (expected abababababab..., got ")
    assert files(tmp_path / "a") == []
    with pytest.raises(FetchError, match="--sha256 names one file, and this is a prefix of 4 objects"):
        quiet_fetch("s3://models/bert", tmp_path / "b", store, sha256="ab" * 32)


LOGIN_PAGE = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form></form></body></html>\n"


def test_an_html_page_stored_as_the_model_is_refused(store: MinioServer, tmp_path: Path) -> None:
    """An object that is an HTML page (by its ContentType, or its body only) where a model file is
    named fails the fetch naming HTML; an object named as HTML in a prefix is fetched as it is."""
    client = store.client()
    client.put_object(Bucket="models", Key="login/typed/model.onnx", Body=LOGIN_PAGE, ContentType="text/html")
    client.put_object(Bucket="models", Key="login/body/model.onnx", Body=LOGIN_PAGE)
    for key in ("login/typed/model.onnx", "login/body/model.onnx", "login/body"):
        dest = tmp_path / key.replace("/", "-")
        with pytest.raises(FetchError) as info:
            quiet_fetch(f"s3://models/{key}", dest, store)
        assert info.value.cause == HTML_PAGE_CAUSE and files(dest) == []
    client.put_object(Bucket="models", Key="login/page/index.html", Body=LOGIN_PAGE, ContentType="text/html")
    quiet_fetch("s3://models/login/page", tmp_path / "page", store)
    assert (tmp_path / "page" / "index.html").read_bytes() == LOGIN_PAGE


def test_a_prefix_over_the_size_limit_is_refused_before_any_download(
    store: MinioServer, tmp_path: Path
) -> None:
    total = sum(len(v) for v in BERT.values())
    with pytest.raises(FetchError) as info:
        quiet_fetch("s3://models/bert", tmp_path / "d", store, size_limit=100_000)
    assert (
        info.value.cause == f"0.1 MB ({total} bytes) to fetch, more than --size-limit 0.1 MB (100000 bytes)"
    )
    assert files(tmp_path / "d") == []


def test_path_style_addressing_names_the_bucket_in_the_path(
    store: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls: list[str] = []
    real = s3_backend.make_client

    def spying(ctx: Any, verify: str | None = None) -> Any:
        client = real(ctx, verify)
        client.meta.events.register("before-send.s3", lambda request, **_: urls.append(request.url))
        return client

    monkeypatch.setattr(s3_backend, "make_client", spying)
    quiet_fetch("s3://models/simple/model.onnx", tmp_path / "d", store)
    assert urls and all(u.startswith(f"{store.endpoint}/models/") for u in urls), urls


def test_an_endpoint_that_does_not_answer_is_retried_then_named(store: MinioServer, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    sleeps: list[float] = []
    with pytest.raises(FetchError) as info:
        fetch(
            "s3://models/bert",
            tmp_path / "d",
            FetchOptions(s3_endpoint=dead, retries=2, connect_timeout=2),
            env=store.env(),
            stream=io.StringIO(),
            sleep=sleeps.append,
        )
    assert info.value.transient and sleeps == [1, 2]
    assert info.value.cause == f"cannot connect to {dead}/models/bert (after 3 attempts)"
