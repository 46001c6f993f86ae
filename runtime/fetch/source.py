"""Model sources: ``parse_source(uri) -> Source``, one dataclass per scheme (pure: no I/O).

The URIs of ``spec.model.uri`` (the operator) and ``kubeinfer-runtime fetch --source`` (the runtime):

- ``default`` (the bundled MiniLM), a path in the image, ``pvc://<claim>/<path>``: not fetched;
- ``oci://registry/repo:tag`` or ``oci://registry/repo@sha256:<hex>``: not fetched (an image volume);
- ``s3://bucket/key-or-prefix``: the object at that key, else every object under ``prefix/``
  (a trailing ``/`` means a prefix; ``s3://bucket`` is the whole bucket);
- ``https://host/path`` (``http://`` only when allowed): one file, or an archive unpacked
  (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``);
- ``hf://org/repo`` or ``hf://org/repo@revision``: a Hugging Face Hub model repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from kubeinfer.runtime.fetch.redact import redact_url

#: The schemes ``parse_source`` accepts.
SCHEMES = ("s3", "https", "http", "hf", "pvc", "oci")
#: The source that selects the bundled model (``kubeinfer.runtime.config.BUNDLED_MODEL``).
BUNDLED = "default"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_HF_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_OCI = re.compile(r"^[^/\s]+/[^\s@:]+(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class BundledSource:
    """The bundled all-MiniLM-L6-v2 (``default``): nothing to fetch."""

    uri: str = BUNDLED
    fetched: ClassVar[bool] = False


@dataclass(frozen=True)
class LocalSource:
    """A file or directory already in the container (a path in the image): nothing to fetch."""

    uri: str
    path: str
    fetched: ClassVar[bool] = False


@dataclass(frozen=True)
class PvcSource:
    """``pvc://claim/path``: a PersistentVolumeClaim the operator mounts; nothing to fetch."""

    uri: str
    claim: str
    path: str
    fetched: ClassVar[bool] = False


@dataclass(frozen=True)
class OciSource:
    """``oci://registry/repo:tag`` (or ``@sha256:...``): an image volume the kubelet pulls; not fetched."""

    uri: str
    reference: str
    fetched: ClassVar[bool] = False


@dataclass(frozen=True)
class S3Source:
    """``s3://bucket/key``; ``key`` is ``""`` for the whole bucket and ends with ``/`` for a prefix."""

    uri: str
    bucket: str
    key: str
    fetched: ClassVar[bool] = True

    @property
    def is_prefix(self) -> bool:
        """True when the key can only name a prefix (empty, or ending with ``/``)."""
        return self.key == "" or self.key.endswith("/")


@dataclass(frozen=True)
class HttpSource:
    """``https://host/path/name`` (or ``http://``): one file named ``filename``, or an archive."""

    uri: str
    scheme: str
    filename: str
    fetched: ClassVar[bool] = True

    @property
    def url(self) -> str:
        """The URL to request (the URI as given: userinfo and query included)."""
        return self.uri


@dataclass(frozen=True)
class HfSource:
    """``hf://org/repo[@revision]``; ``revision`` None means the repository's default branch."""

    uri: str
    repo_id: str
    revision: str | None
    fetched: ClassVar[bool] = True


Source = BundledSource | LocalSource | PvcSource | OciSource | S3Source | HttpSource | HfSource


def parse_source(uri: str) -> Source:
    """The ``Source`` a model URI names.

    Raises:
        ValueError: the URI is not one of the forms above; the message starts with
            ``model.source '<uri>'`` (the URI redacted: no userinfo, no query) and says what is wrong.
    """
    text = uri.strip()
    if not text:
        raise ValueError("model.source is empty")
    if text == BUNDLED:
        return BundledSource()
    m = _SCHEME.match(text)
    if m is None:
        return LocalSource(uri=text, path=text)
    scheme = m.group(1).lower()
    rest = text[m.end() :]
    if scheme == "s3":
        return _parse_s3(text, rest)
    if scheme in ("https", "http"):
        return _parse_http(text, scheme)
    if scheme == "hf":
        return _parse_hf(text, rest)
    if scheme == "pvc":
        return _parse_pvc(text, rest)
    if scheme == "oci":
        if not _OCI.match(rest):
            raise _invalid(
                text, "expected oci://registry/repository:tag or oci://registry/repository@sha256:<hex>"
            )
        return OciSource(uri=text, reference=rest)
    raise _invalid(
        text, f"unsupported scheme {scheme!r}; expected one of {', '.join(SCHEMES)}, a path or 'default'"
    )


def _invalid(uri: str, why: str) -> ValueError:
    return ValueError(f"model.source {redact_url(uri)!r}: {why}")


def _parse_s3(uri: str, rest: str) -> S3Source:
    bucket, _, key = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise _invalid(
            uri,
            "credentials or ports do not belong in an s3:// URI (credentials: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY from spec.model.credentials; the endpoint: --s3-endpoint)",
        )
    if not _BUCKET.match(bucket):
        raise _invalid(uri, f"{bucket!r} is not a bucket name (3-63 characters: a-z, 0-9, '.', '-', '_')")
    return S3Source(uri=uri, bucket=bucket, key=key)


def _parse_http(uri: str, scheme: str) -> HttpSource:
    try:
        parts = urlsplit(uri)
        host = parts.hostname
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        # the parser's words may quote a part of an unencoded password (as the "port")
        raise _invalid(uri, "not a URL (its host or port does not parse)") from exc
    if not host:
        raise _invalid(uri, "the URL has no host")
    name = unquote(PurePosixPath(parts.path).name) if parts.path and not parts.path.endswith("/") else ""
    if not name or name in (".", "..") or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise _invalid(uri, "the URL's path must end with a file name (e.g. https://host/models/model.onnx)")
    return HttpSource(uri=uri, scheme=scheme, filename=name)


def _parse_hf(uri: str, rest: str) -> HfSource:
    repo, at, revision = rest.partition("@")
    parts = repo.split("/")
    if not 1 <= len(parts) <= 2 or not all(_HF_NAME.match(p) and ".." not in p for p in parts):
        raise _invalid(uri, "expected hf://org/repo or hf://org/repo@revision")
    if at and (not revision or any(c.isspace() for c in revision)):
        raise _invalid(uri, "the revision after '@' is empty or has spaces")
    return HfSource(uri=uri, repo_id=repo, revision=revision if at else None)


def _parse_pvc(uri: str, rest: str) -> PvcSource:
    claim, _, path = rest.partition("/")
    if not _DNS_LABEL.match(claim):
        raise _invalid(uri, f"{claim!r} is not a PersistentVolumeClaim name (a DNS-1123 label)")
    if ".." in PurePosixPath(path).parts:
        raise _invalid(uri, "the path in the claim must not contain '..'")
    return PvcSource(uri=uri, claim=claim, path=path.strip("/"))
