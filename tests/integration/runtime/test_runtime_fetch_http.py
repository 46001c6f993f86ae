"""``kubeinfer-runtime fetch`` of https:// and http:// sources against a real HTTP(S) server started
here (``tests/support/storage.FileServer``): files, archives, the bearer token, 404 at once, 5xx
retried, a stall failing after ``--stall-timeout``, the size limit, sha256, an HTML page refused, TLS,
redaction; through the real command line (exit status, termination message, progress lines) and in
process."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from kubeinfer.runtime.fetch import FetchError, FetchOptions
from kubeinfer.runtime.fetch.errors import HTML_PAGE_CAUSE
from kubeinfer.runtime.fetch.run import fetch

from tests.integration.runtime.conftest import FetchCli
from tests.support.storage import FileServer

pytestmark = pytest.mark.timeout(180)

MODEL = os.urandom(300_000)
SHA = hashlib.sha256(MODEL).hexdigest()


def files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def quiet_fetch(uri: str, dest: Path, **options: object) -> None:
    fetch(
        uri,
        dest,
        FetchOptions(allow_http=True, **options),
        env={},
        stream=io.StringIO(),
        sleep=lambda _s: None,
    )  # type: ignore[arg-type]


def test_a_file_through_the_command_line(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    (file_server.root / "models").mkdir()
    (file_server.root / "models" / "m.onnx").write_bytes(MODEL)
    dest = tmp_path / "mnt" / "models"
    url = file_server.url("models/m.onnx")
    run = fetch_cli("--source", url, "--dest", str(dest), "--allow-http", "--sha256", SHA)
    assert run.returncode == 0, run.stderr
    assert (dest / "m.onnx").read_bytes() == MODEL
    assert files(dest) == [".kubeinfer-fetch.json", "m.onnx"]
    report = json.loads((dest / ".kubeinfer-fetch.json").read_text())
    assert report["source"] == url and report["files"] == 1 and report["bytes"] == len(MODEL)
    assert run.termination.startswith("fetched 1 file, 0.3 MB in ") and run.termination.endswith(
        f" s from {url}\n"
    )
    lines = run.stderr.splitlines()
    assert f"fetch: {url}: 0.3 MB of 0.3 MB (100 %)," in "\n".join(lines)
    assert lines[-1].startswith("fetch: done: 1 file, 0.3 MB in ")


def test_plain_http_needs_allow_http(file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path) -> None:
    (file_server.root / "m.onnx").write_bytes(b"x")
    run = fetch_cli("--source", file_server.url("m.onnx"), "--dest", str(tmp_path / "d"))
    assert run.returncode == 1
    assert run.termination == (
        f"{file_server.url('m.onnx')}: plain http:// is refused without --allow-http "
        "(spec.model.allowInsecureHttp: true)\n"
    )
    assert file_server.requests == []


def test_an_archive_is_unpacked(file_server: FileServer, tmp_path: Path) -> None:
    (file_server.root / "m.tar.gz").write_bytes(tgz({"config.json": b"{}", "onnx/model.onnx": MODEL}))
    quiet_fetch(file_server.url("m.tar.gz"), tmp_path / "d")
    assert files(tmp_path / "d") == [".kubeinfer-fetch.json", "config.json", "onnx", "onnx/model.onnx"]
    assert (tmp_path / "d" / "onnx" / "model.onnx").read_bytes() == MODEL
    report = json.loads((tmp_path / "d" / ".kubeinfer-fetch.json").read_text())
    assert report["files"] == 2 and report["bytes"] == (file_server.root / "m.tar.gz").stat().st_size


def test_an_archive_with_a_member_out_of_the_destination_is_refused(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    (file_server.root / "m.tar.gz").write_bytes(tgz({"config.json": b"{}", "../x": b"evil"}))
    run = fetch_cli("--source", file_server.url("m.tar.gz"), "--dest", str(tmp_path / "d"), "--allow-http")
    assert run.returncode == 1
    assert run.termination == f"{file_server.url('m.tar.gz')}: archive member ../x escapes the destination\n"
    assert files(tmp_path / "d") == [] and not (tmp_path / "x").exists()


def test_the_bearer_token_is_sent_and_its_absence_is_a_401_at_once(
    file_server: FileServer, tmp_path: Path
) -> None:
    (file_server.root / "m.onnx").write_bytes(MODEL)
    file_server.token = "t0ken-for-the-test"
    with pytest.raises(FetchError) as info:
        quiet_fetch(file_server.url("m.onnx"), tmp_path / "a")
    assert info.value.cause == "401 Unauthorized" and len(file_server.requests) == 1
    fetch(
        file_server.url("m.onnx"),
        tmp_path / "b",
        FetchOptions(allow_http=True),
        env={"KUBEINFER_FETCH_BEARER_TOKEN": "t0ken-for-the-test"},
        stream=io.StringIO(),
    )
    assert (tmp_path / "b" / "m.onnx").read_bytes() == MODEL
    assert file_server.requests[-1].authorization == "Bearer t0ken-for-the-test"


def test_a_404_fails_at_once_and_5xx_are_retried(file_server: FileServer, tmp_path: Path) -> None:
    with pytest.raises(FetchError) as info:
        quiet_fetch(file_server.url("missing.onnx"), tmp_path / "a")
    assert info.value.cause == "404 Not Found" and len(file_server.requests) == 1

    (file_server.root / "m.onnx").write_bytes(MODEL)
    file_server.requests.clear()
    file_server.fail_first = 2
    quiet_fetch(file_server.url("m.onnx"), tmp_path / "b")
    assert (tmp_path / "b" / "m.onnx").read_bytes() == MODEL and len(file_server.requests) == 3

    file_server.requests.clear()
    file_server.fail_first, file_server.fail_status = 10, 503
    with pytest.raises(FetchError) as info:
        quiet_fetch(file_server.url("m.onnx"), tmp_path / "c", retries=1)
    assert info.value.cause == "503 Service Unavailable (after 2 attempts)" and len(file_server.requests) == 2
    assert files(tmp_path / "c") == []


def test_a_stalled_server_fails_after_the_stall_timeout(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    (file_server.root / "m.onnx").write_bytes(MODEL)
    file_server.stall_after = 100_000
    dest = tmp_path / "d"
    url = file_server.url("m.onnx")
    run = fetch_cli(
        "--source", url, "--dest", str(dest), "--allow-http", "--stall-timeout", "2", "--retries", "0"
    )
    assert run.returncode == 1, run.stderr
    assert run.termination == f"{url}: stalled: no data for 2 s\n"
    assert 2 <= run.seconds < 30, run.seconds
    assert files(dest) == []  # the partial file is gone


def test_a_size_over_the_limit_is_refused_before_the_body(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    (file_server.root / "m.onnx").write_bytes(MODEL)
    run = fetch_cli(
        "--source",
        file_server.url("m.onnx"),
        "--dest",
        str(tmp_path / "d"),
        "--allow-http",
        "--size-limit",
        "100000",
    )
    assert run.returncode == 1
    assert run.termination.endswith(
        ": 0.3 MB (300000 bytes) to fetch, more than --size-limit 0.1 MB (100000 bytes)\n"
    ), run.termination
    assert files(tmp_path / "d") == []


def test_a_sha256_mismatch_keeps_nothing(file_server: FileServer, tmp_path: Path) -> None:
    (file_server.root / "m.onnx").write_bytes(MODEL)
    wrong = "0" * 64
    with pytest.raises(FetchError) as info:
        quiet_fetch(file_server.url("m.onnx"), tmp_path / "d", sha256=wrong)
    assert info.value.cause == f"sha256 mismatch (expected 000000000000..., got {SHA[:12]}...)"
    assert files(tmp_path / "d") == [] and len(file_server.requests) == 1  # no retry


LOGIN_PAGE = (
    b"\n<!DOCTYPE html>\n<html lang='en'><head><title>Sign in</title></head>"
    b"<body><form method='post' action='/login'><input name='user'></form></body></html>\n"
) * 50  # a login page behind an expired token, served where the model was


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/octet-stream"])
def test_an_html_page_served_as_the_model_is_refused(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path, content_type: str
) -> None:
    """A 200 answer that is an HTML page, said by its Content-Type or only by its body, fails the fetch
    at once (no retry) naming HTML, instead of fetching a file the model's loader cannot parse."""
    (file_server.root / "model.onnx").write_bytes(LOGIN_PAGE)
    file_server.content_types["/model.onnx"] = content_type
    dest = tmp_path / "d"
    url = file_server.url("model.onnx")
    run = fetch_cli("--source", url, "--dest", str(dest), "--allow-http")
    assert run.returncode == 1, run.stderr
    assert run.termination == (
        f"{url}: the server answered an HTML page, not a model (check the URI and the credentials)\n"
    )
    assert files(dest) == [] and len(file_server.requests) == 1  # nothing kept, no retry
    with pytest.raises(FetchError) as info:
        quiet_fetch(url, tmp_path / "e")
    assert info.value.cause == HTML_PAGE_CAUSE and not info.value.transient


def test_an_html_file_asked_for_by_its_name_is_fetched(file_server: FileServer, tmp_path: Path) -> None:
    (file_server.root / "index.html").write_bytes(LOGIN_PAGE)
    file_server.content_types["/index.html"] = "text/html"
    quiet_fetch(file_server.url("index.html"), tmp_path / "d")
    assert (tmp_path / "d" / "index.html").read_bytes() == LOGIN_PAGE


def test_https_with_the_cluster_ca_and_no_downgrade_to_http(tmp_path: Path, fetch_cli: FetchCli) -> None:
    root = tmp_path / "tls-files"
    root.mkdir()
    (root / "m.onnx").write_bytes(MODEL)
    with FileServer(root, tls=True) as tls, FileServer(root) as plain:
        assert tls.ca_file is not None
        env = {"SSL_CERT_FILE": str(tls.ca_file)}
        run = fetch_cli("--source", tls.url("m.onnx"), "--dest", str(tmp_path / "a"), env=env)
        assert run.returncode == 0, run.stderr + run.termination
        assert (tmp_path / "a" / "m.onnx").read_bytes() == MODEL
        untrusted = fetch_cli("--source", tls.url("m.onnx"), "--dest", str(tmp_path / "b"), "--retries", "0")
        assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.termination
        tls.redirects["/moved.onnx"] = plain.url("m.onnx")
        run = fetch_cli("--source", tls.url("moved.onnx"), "--dest", str(tmp_path / "c"), env=env)
        assert run.returncode == 1
        assert (
            run.termination
            == f"{tls.url('moved.onnx')}: redirected to plain http://, refused without --allow-http\n"
        )
        assert plain.requests == []


def test_no_credential_in_the_termination_message_or_the_log(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    file_server.token = "the-real-token-1234"
    source = (
        f"http://user:pa55word@{file_server.url('m.onnx').removeprefix('http://')}?X-Amz-Signature=s1gnature"
    )
    run = fetch_cli(
        "--source", source, "--dest", str(tmp_path / "d"), "--allow-http",
        env={"KUBEINFER_FETCH_BEARER_TOKEN": "wrong-token-5678"},
    )  # fmt: skip
    assert run.returncode == 1
    assert (
        run.termination
        == f"http://***@{file_server.url('m.onnx').removeprefix('http://')}?***: 401 Unauthorized\n"
    )
    for secret in ("pa55word", "s1gnature", "wrong-token-5678", "the-real-token-1234"):
        assert secret not in run.termination and secret not in run.stderr
