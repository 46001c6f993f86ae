"""Model sources: ``parse_source(uri) -> Source``, one dataclass per scheme (pure: no I/O).

Which schemes there are, and which parser reads each, is the registry of source schemes
(``kubeinfer.contract.sources``, shared with the operator): a scheme's row names its parser here
(``parse_s3``, ...; :func:`parse_generic` for a scheme without its own) and its fetch backend.

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

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import PurePosixPath
from typing import ClassVar, cast
from urllib.parse import unquote, urlsplit

from kubeinfer.runtime.fetch.redact import redact_url

from kubeinfer.contract import sources
from kubeinfer.contract.sources import SourceScheme

#: The source that selects the bundled model (``kubeinfer.runtime.config.BUNDLED_MODEL``).
BUNDLED = sources.BUNDLED

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The parsers' own checks: a URI typed on the command line gets a reason for its refusal (the CRD's
# grammars, the rows' uri_pattern, already refused what the operator passes).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_HF_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_OCI = re.compile(r"^[^/\s]+/[^\s@:]+(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class GenericSource:
    """A URI of a scheme whose row names no parser of its own (:func:`parse_generic`): ``rest`` is
    what follows ``scheme://``; fetched as its row says."""

    uri: str
    scheme: str
    rest: str

    @property
    def fetched(self) -> bool:
        """Whether the scheme's row is fetched (False once the row is gone)."""
        row = sources.scheme_named(self.scheme)
        return row is not None and row.fetched


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


Source = (
    BundledSource | LocalSource | PvcSource | OciSource | S3Source | HttpSource | HfSource | GenericSource
)
#: A scheme's parser (its row's ``parser``): ``(uri, scheme, rest after "://") -> Source``, raising
#: ``ValueError`` (:func:`_invalid`) for a URI it refuses.
Parser = Callable[[str, str, str], Source]


def scheme_names() -> tuple[str, ...]:
    """The schemes ``parse_source`` accepts: the registry's fetched schemes, then its mounted ones."""
    return (*sources.fetched_schemes(), *sources.mounted_schemes())


#: The schemes ``parse_source`` accepts when this module is imported (:func:`scheme_names`).
SCHEMES = scheme_names()


@cache
def load(path: str) -> object:
    """The object an import path ``package.module:attribute`` names (a row's parser or backend),
    importing the module on first use.

    Raises:
        ImportError: the module does not import. AttributeError: it has no such attribute.
    """
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def row_of(source: Source) -> SourceScheme:
    """The registry row of ``source``'s scheme.

    Raises:
        LookupError: ``source`` has no scheme (``default``, a path) or its scheme has no row (any more).
    """
    row = sources.scheme_of(source.uri)
    if row is None:
        raise LookupError(f"no source scheme for {type(source).__name__}")
    return row


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
    row = sources.scheme_named(scheme)
    if row is None:
        known = ", ".join(scheme_names())
        raise _invalid(text, f"unsupported scheme {scheme!r}; expected one of {known}, a path or 'default'")
    parser = cast(Parser, load(row.parser))
    return parser(text, scheme, text[m.end() :])


def _invalid(uri: str, why: str) -> ValueError:
    return ValueError(f"model.source {redact_url(uri)!r}: {why}")


def parse_s3(uri: str, scheme: str, rest: str) -> S3Source:
    """``s3://bucket/key`` (a :data:`Parser`)."""
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


def parse_http(uri: str, scheme: str, rest: str) -> HttpSource:
    """``https://host/path/name`` or ``http://...`` (a :data:`Parser`): the URL as given."""
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


def parse_hf(uri: str, scheme: str, rest: str) -> HfSource:
    """``hf://org/repo[@revision]`` (a :data:`Parser`)."""
    repo, at, revision = rest.partition("@")
    parts = repo.split("/")
    if not 1 <= len(parts) <= 2 or not all(_HF_NAME.match(p) and ".." not in p for p in parts):
        raise _invalid(uri, "expected hf://org/repo or hf://org/repo@revision")
    if at and (not revision or any(c.isspace() for c in revision)):
        raise _invalid(uri, "the revision after '@' is empty or has spaces")
    return HfSource(uri=uri, repo_id=repo, revision=revision if at else None)


def parse_pvc(uri: str, scheme: str, rest: str) -> PvcSource:
    """``pvc://claim/path`` (a :data:`Parser`)."""
    claim, _, path = rest.partition("/")
    if not _DNS_LABEL.match(claim):
        raise _invalid(uri, f"{claim!r} is not a PersistentVolumeClaim name (a DNS-1123 label)")
    if ".." in PurePosixPath(path).parts:
        raise _invalid(uri, "the path in the claim must not contain '..'")
    return PvcSource(uri=uri, claim=claim, path=path.strip("/"))


def parse_oci(uri: str, scheme: str, rest: str) -> OciSource:
    """``oci://registry/repository:tag`` or ``...@sha256:<hex>`` (a :data:`Parser`)."""
    if not _OCI.match(rest):
        raise _invalid(
            uri, "expected oci://registry/repository:tag or oci://registry/repository@sha256:<hex>"
        )
    return OciSource(uri=uri, reference=rest)


def parse_generic(uri: str, scheme: str, rest: str) -> GenericSource:
    """Any URI of a scheme that names no parser of its own (a :data:`Parser`): kept whole; its backend
    reads ``rest``. Raises ``ValueError`` when nothing follows ``scheme://``."""
    if not rest:
        raise _invalid(uri, f"nothing after {scheme}://")
    return GenericSource(uri=uri, scheme=scheme, rest=rest)
