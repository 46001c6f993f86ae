"""``kubeinfer-runtime fetch --ca-file`` (``spec.model.caBundle``): sources behind a private CA, each a
real server with a certificate of a throw-away CA (``hack/pki.py``): https (``FileServer``), s3 (a
MinIO serving TLS from ``--certs-dir``) and hf (the local Hub stand-in). Without the option the fetch
fails at once (no retry) with one line naming the source and the option; with it the model arrives.
A missing or unreadable CA file is refused before any request."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import pytest
from kubeinfer.runtime.fetch.tls import ssl_context

from tests.integration.runtime.conftest import FetchCli
from tests.support.hfhub import LocalHub
from tests.support.storage import FileServer, MinioMissing, MinioServer

pytestmark = pytest.mark.timeout(180)

MODEL = b"onnx model bytes" * 2000
UNTRUSTED = (
    "TLS certificate not trusted (CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate): "
    "a private CA needs --ca-file (spec.model.caBundle)"
)


def test_https_behind_a_private_ca(tmp_path: Path, fetch_cli: FetchCli) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "m.onnx").write_bytes(MODEL)
    with FileServer(root, tls=True) as server:
        assert server.ca_file is not None
        url = server.url("m.onnx")
        refused = fetch_cli("--source", url, "--dest", str(tmp_path / "a"))  # default: 3 retries
        assert refused.returncode == 1
        assert refused.termination == f"{url}: {UNTRUSTED}\n"
        assert "retrying" not in refused.stderr and len(server.requests) == 0
        run = fetch_cli("--source", url, "--dest", str(tmp_path / "b"), "--ca-file", str(server.ca_file))
        assert run.returncode == 0, run.stderr + run.termination
        assert (tmp_path / "b" / "m.onnx").read_bytes() == MODEL
        assert run.termination.startswith("fetched 1 file, ")
        missing = fetch_cli(
            "--source", url, "--dest", str(tmp_path / "c"), "--ca-file", str(tmp_path / "no.crt")
        )
        assert missing.returncode == 1
        assert missing.termination == f"--ca-file {tmp_path / 'no.crt'}: no such file\n"
        (tmp_path / "bad.crt").write_text("not a certificate\n")
        bad = fetch_cli(
            "--source", url, "--dest", str(tmp_path / "d"), "--ca-file", str(tmp_path / "bad.crt")
        )
        assert bad.returncode == 1 and bad.termination.startswith(
            f"--ca-file {tmp_path / 'bad.crt'}: not a PEM"
        )
        assert len(server.requests) == 1  # the one fetch that trusted the CA


def test_the_ca_file_is_trusted_besides_the_public_cas(tmp_path: Path) -> None:
    with FileServer(tmp_path, tls=True) as server:
        assert server.ca_file is not None
        context = ssl_context(str(server.ca_file))
    public = ssl.create_default_context(cafile=certifi.where())
    assert context.cert_store_stats()["x509_ca"] == public.cert_store_stats()["x509_ca"] + 1


def test_s3_behind_a_private_ca(tmp_path: Path, fetch_cli: FetchCli) -> None:
    server = MinioServer(data=tmp_path / "minio" / "data", tls=True)
    try:
        server.start()
    except MinioMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        assert server.ca_file is not None and server.endpoint.startswith("https://")
        server.put("models", {"simple/model.onnx": MODEL, "simple/config.json": b"{}"})
        args = ["--source", "s3://models/simple/", "--s3-endpoint", server.endpoint]
        args += ["--s3-region", "us-east-1", "--s3-addressing-style", "path"]
        refused = fetch_cli(*args, "--dest", str(tmp_path / "a"), env=server.env())
        assert refused.returncode == 1
        assert refused.termination == f"s3://models/simple/: {UNTRUSTED}\n"
        assert "retrying" not in refused.stderr
        scratch = tmp_path / "tmp"  # where the bundle of the public CAs and the file is made
        scratch.mkdir()
        env = {**server.env(), "TMPDIR": str(scratch)}
        run = fetch_cli(*args, "--dest", str(tmp_path / "b"), "--ca-file", str(server.ca_file), env=env)
        assert run.returncode == 0, run.stderr + run.termination
        assert (tmp_path / "b" / "model.onnx").read_bytes() == MODEL
        assert run.termination.startswith("fetched 2 files, ")
        assert list(scratch.iterdir()) == []  # removed after the fetch
    finally:
        server.stop()


def test_hf_behind_a_private_ca(tmp_path: Path, fetch_cli: FetchCli) -> None:
    with LocalHub(tls=True) as hub:
        assert hub.ca_file is not None and hub.endpoint.startswith("https://")
        hub.add("org/tiny", {"main": {"config.json": b"{}", "model.onnx": MODEL}})
        args = ["--source", "hf://org/tiny", "--hf-endpoint", hub.endpoint]
        env = {"HF_HOME": str(tmp_path / "hf-home")}
        refused = fetch_cli(*args, "--dest", str(tmp_path / "a"), env=env)
        assert refused.returncode == 1
        assert refused.termination == f"hf://org/tiny: {UNTRUSTED}\n"
        assert "retrying" not in refused.stderr
        run = fetch_cli(*args, "--dest", str(tmp_path / "b"), "--ca-file", str(hub.ca_file), env=env)
        assert run.returncode == 0, run.stderr + run.termination
        assert (tmp_path / "b" / "model.onnx").read_bytes() == MODEL
