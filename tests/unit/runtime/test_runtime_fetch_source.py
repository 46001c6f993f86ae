"""Model URIs: ``parse_source`` gives each scheme its dataclass and refuses the rest naming
``model.source``, never repeating a credential of the URI."""

from __future__ import annotations

import pytest
from kubeinfer.runtime.fetch.source import (
    BundledSource,
    HfSource,
    HttpSource,
    LocalSource,
    OciSource,
    PvcSource,
    S3Source,
    parse_source,
)

pytestmark = pytest.mark.timeout(30)


def test_the_sources_that_are_not_fetched() -> None:
    assert parse_source("default") == BundledSource()
    assert parse_source("/models/bert") == LocalSource(uri="/models/bert", path="/models/bert")
    assert parse_source("pvc://models/bert/v1/") == PvcSource(
        uri="pvc://models/bert/v1/", claim="models", path="bert/v1"
    )
    assert parse_source("pvc://models") == PvcSource(uri="pvc://models", claim="models", path="")
    digest = "sha256:" + "a" * 64
    assert parse_source(f"oci://reg.example.com:5000/models/bert@{digest}") == OciSource(
        uri=f"oci://reg.example.com:5000/models/bert@{digest}",
        reference=f"reg.example.com:5000/models/bert@{digest}",
    )
    assert parse_source("oci://ghcr.io/org/bert:v1").reference == "ghcr.io/org/bert:v1"
    assert not any(
        s.fetched
        for s in (
            parse_source("default"),
            parse_source("/m"),
            parse_source("pvc://c"),
            parse_source("oci://r/m:1"),
        )
    )


def test_s3_keys_prefixes_and_buckets() -> None:
    one = parse_source("s3://models/bert/model.onnx")
    assert one == S3Source(uri="s3://models/bert/model.onnx", bucket="models", key="bert/model.onnx")
    assert not one.is_prefix and one.fetched
    assert parse_source("s3://models/bert").key == "bert"  # an object or a prefix: the fetch finds out
    assert parse_source("s3://models/bert/").is_prefix
    whole = parse_source("s3://models")
    assert isinstance(whole, S3Source) and whole.key == "" and whole.is_prefix


def test_https_names_a_file_and_keeps_the_url_as_given() -> None:
    src = parse_source("https://user:pw@host.example.com:8443/a/m%20v1.tar.gz?X-Amz-Signature=abc")
    assert isinstance(src, HttpSource)
    assert src.scheme == "https" and src.filename == "m v1.tar.gz"
    assert src.url == "https://user:pw@host.example.com:8443/a/m%20v1.tar.gz?X-Amz-Signature=abc"
    assert parse_source("http://10.0.0.1/m.onnx") == HttpSource(
        uri="http://10.0.0.1/m.onnx", scheme="http", filename="m.onnx"
    )


def test_hf_repositories_and_revisions() -> None:
    assert parse_source("hf://org/repo") == HfSource(uri="hf://org/repo", repo_id="org/repo", revision=None)
    assert parse_source("hf://org/repo@v2").revision == "v2"
    assert parse_source("hf://org/repo@refs/pr/1").revision == "refs/pr/1"
    assert parse_source("hf://gpt2").repo_id == "gpt2"
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert parse_source(f"hf://sentence-transformers/all-MiniLM-L6-v2@{sha}").revision == sha


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("", "empty"),
        ("gs://bucket/model", "unsupported scheme 'gs'"),
        ("s3://Bad_Bucket!/x", "is not a bucket name"),
        ("s3://key:secret@bucket/x", "credentials or ports do not belong"),
        ("https://host/", "must end with a file name"),
        ("https://host", "must end with a file name"),
        ("https://host/dir/..", "must end with a file name"),
        ("https://host/.hidden", "must end with a file name"),
        ("https:///m.onnx", "has no host"),
        ("https://host:notaport/m.onnx", "not a URL"),
        ("hf://", "expected hf://org/repo"),
        ("hf://a/b/c", "expected hf://org/repo"),
        ("hf://org/../x", "expected hf://org/repo"),
        ("hf://org/repo@", "revision after '@' is empty"),
        ("pvc://Not_A_Claim/x", "is not a PersistentVolumeClaim name"),
        ("pvc://claim/../etc", "must not contain '..'"),
        ("oci://justaname", "expected oci://registry/repository"),
    ],
)
def test_refusals_name_model_source_and_say_why(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"model\.source") as info:
        parse_source(uri)
    assert why in str(info.value)


def test_a_refusal_never_repeats_the_credentials_of_the_uri() -> None:
    with pytest.raises(ValueError) as info:
        parse_source("https://alice:hunter2@host/?token=s3cr3t")
    message = str(info.value)
    assert "hunter2" not in message and "s3cr3t" not in message and "alice" not in message
    assert "https://***@host/?***" in message
