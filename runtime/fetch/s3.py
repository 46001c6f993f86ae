"""``s3://bucket/key-or-prefix`` sources with boto3 (AWS S3, MinIO, any S3-compatible store).

A key that names one object is that file (an archive is unpacked, as for https); otherwise every
object under ``key/`` (``list_objects_v2``, paginated) is downloaded to its path below the prefix.
A key ending with ``/`` is a prefix; ``s3://bucket`` is the whole bucket. Each object is streamed
(``get_object``, 1 MiB reads) into a temporary file; up to ``WORKERS`` objects at once.

The client: ``endpoint_url`` (``--s3-endpoint``), ``region_name`` (``--s3-region``), the
addressing style (``--s3-addressing-style``), botocore's ``connect_timeout`` and
``read_timeout`` = the stall timeout, and no retries of botocore's own (``max_attempts`` 1): the
fetch retries transient failures itself, and a 403 or 404 fails at once. Credentials:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` when set, else boto3's
default chain (IRSA, workload identity, an instance profile). ``--ca-file``: botocore's ``verify``
is a bundle of the public CAs and that file (``tls.combined_bundle``), for the whole fetch; an untrusted
certificate fails at once, naming the option.
"""

from __future__ import annotations

import contextlib
import posixpath
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
import botocore.exceptions as bexc
from botocore.config import Config
from kubeinfer.runtime.fetch.context import Context, Fetched, finish_single, single_target
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import Sink, safe_path
from kubeinfer.runtime.fetch.htmlpage import check_content_type
from kubeinfer.runtime.fetch.retry import transient_status
from kubeinfer.runtime.fetch.source import S3Source
from kubeinfer.runtime.fetch.tls import certificate_error, combined_bundle

if TYPE_CHECKING:
    from pathlib import Path

#: Bytes read from an object's body at a time.
CHUNK_BYTES = 1 << 20
#: Objects of a prefix downloaded at once.
WORKERS = 4
#: S3 error codes that another attempt may not meet (besides HTTP 5xx and 429).
TRANSIENT_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling"}
)
#: Error codes that mean "no object at this key" (a HEAD-less GET answers NoSuchKey).
MISSING_KEY = frozenset({"NoSuchKey", "404", "NotFound"})


@dataclass(frozen=True)
class S3Object:
    """An object to download: its key, its size (bytes) and where it goes under the destination."""

    key: str
    size: int
    relative: str


class _NoSuchKey(Exception):
    """The key names no object (it may still be a prefix)."""


def make_client(ctx: Context, verify: str | None = None) -> Any:
    """The boto3 S3 client for ``ctx.options`` and the credentials in ``ctx.env`` (see the module
    docstring); ``verify``: the CA bundle file to verify the endpoint with (None: botocore's own)."""
    opts = ctx.options
    config = Config(
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.stall_timeout,
        retries={"max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": opts.s3_addressing_style or "auto"},
        user_agent_extra="kubeinfer-fetch",
    )
    key_id, secret = ctx.env.get("AWS_ACCESS_KEY_ID"), ctx.env.get("AWS_SECRET_ACCESS_KEY")
    credentials: dict[str, str] = {}
    if key_id and secret:
        credentials = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
        if ctx.env.get("AWS_SESSION_TOKEN"):
            credentials["aws_session_token"] = ctx.env["AWS_SESSION_TOKEN"]
    session = boto3.session.Session(region_name=opts.s3_region or ctx.env.get("AWS_REGION") or None)
    return session.client(
        "s3", endpoint_url=opts.s3_endpoint or None, config=config, verify=verify, **credentials
    )


def fetch_s3(source: S3Source, ctx: Context) -> Fetched:
    """Download ``source`` into ``ctx.dest`` (see the module docstring).

    Raises:
        FetchError: ``<status> <code>`` of S3 (``403 AccessDenied``, ``403 SignatureDoesNotMatch``,
            ``404 NoSuchBucket``: at once; 5xx, 429, SlowDown after the retries);
            ``no object at this key or prefix (404 NoSuchKey)``; ``stalled: no data for S s``; a
            connection error; missing credentials; a size over the limit; a sha256 mismatch (one
            object only: ``--sha256`` with a prefix is refused); an unsafe key or archive; an
            untrusted certificate (``tls.certificate_error``); an HTML page, by the object's
            ``ContentType`` or its first bytes (``errors.HTML_PAGE_CAUSE``: a gateway's login page).
    """
    with contextlib.ExitStack() as stack:
        bundle = stack.enter_context(combined_bundle(ctx.options.ca_file)) if ctx.options.ca_file else None
        return _fetch(make_client(ctx, bundle), source, ctx)


def _fetch(client: Any, source: S3Source, ctx: Context) -> Fetched:
    if not source.is_prefix:
        filename = posixpath.basename(source.key)
        final, kind = single_target(ctx, filename)
        try:
            nbytes = ctx.retry(lambda: _download(client, source.bucket, source.key, final, ctx, single=True))
        except _NoSuchKey:
            pass
        else:
            return finish_single(ctx, final, kind, nbytes)
    prefix = source.key if source.is_prefix else source.key + "/"
    objects = ctx.retry(lambda: _list(client, source.bucket, prefix, ctx))
    if not objects:
        raise FetchError("no object at this key or prefix (404 NoSuchKey)")
    if ctx.options.sha256:
        raise FetchError(f"--sha256 names one file, and this is a prefix of {len(objects)} objects")
    total = sum(o.size for o in objects)
    ctx.budget.check_total(total)
    ctx.progress.set_total(total)
    ctx.log(f"fetch: {ctx.label}: {len(objects)} object(s) under {prefix or 'the bucket'}")
    nbytes = _download_all(client, source.bucket, objects, ctx)
    return Fetched(files=len(objects), bytes=nbytes)


def _list(client: Any, bucket: str, prefix: str, ctx: Context) -> list[S3Object]:
    """Every object under ``prefix`` (directory markers, keys ending with ``/``, skipped)."""
    out: list[S3Object] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):
                    continue
                relative = key[len(prefix) :]
                safe_path(
                    ctx.dest, relative, "object key"
                )  # refuse '..' and absolute keys before any download
                out.append(S3Object(key=key, size=int(item.get("Size", 0)), relative=relative))
    except Exception as exc:
        raise _error(exc, ctx) from None
    return out


def _download_all(client: Any, bucket: str, objects: list[S3Object], ctx: Context) -> int:
    """Download ``objects`` with up to ``WORKERS`` threads; the first failure cancels the rest."""

    def one(obj: S3Object) -> int:
        final = safe_path(ctx.dest, obj.relative, "object key")
        return ctx.retry(
            lambda: _download(client, bucket, obj.key, final, ctx, single=False),
            label=f"{ctx.label} {obj.key}",
        )

    with ThreadPoolExecutor(max_workers=min(WORKERS, len(objects)), thread_name_prefix="fetch-s3") as pool:
        futures = [pool.submit(one, obj) for obj in objects]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()  # those not started; the pool waits for the running ones
    for future in futures:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:
            raise exc
    return sum(f.result() for f in futures)


def _download(client: Any, bucket: str, key: str, final: Path, ctx: Context, *, single: bool) -> int:
    """One ``get_object`` streamed into ``final``; returns the bytes written. ``single``: the source's
    one object (its size is checked against the limit here, and ``--sha256`` applies).

    Raises:
        _NoSuchKey: no object at ``key``.
        FetchError: anything else (``_error``).
    """
    try:
        response = client.get_object(Bucket=bucket, Key=key)
    except bexc.ClientError as exc:
        if _code(exc) in MISSING_KEY:
            raise _NoSuchKey(key) from None
        raise _error(exc, ctx) from None
    except Exception as exc:
        raise _error(exc, ctx) from None
    body = response["Body"]
    try:
        check_content_type(final.name, response.get("ContentType"))
        length = int(response.get("ContentLength", 0))
        if single:
            ctx.budget.check_total(length)
            ctx.progress.set_total(length)
        sha256 = ctx.options.sha256 if single else None
        with Sink(final, budget=ctx.budget, progress=ctx.progress, sha256=sha256) as sink:
            for chunk in body.iter_chunks(CHUNK_BYTES):
                sink.write(chunk)
            if sink.bytes != length:
                raise FetchError(f"short body: {sink.bytes} of {length} bytes", transient=True)
            sink.commit()
            return sink.bytes
    except FetchError:
        raise
    except Exception as exc:
        raise _error(exc, ctx) from None
    finally:
        body.close()


def _code(exc: bexc.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _error(exc: Exception, ctx: Context) -> FetchError:
    """``exc`` (boto3/botocore) as a one-line ``FetchError``, transient or not."""
    opts = ctx.options
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, bexc.ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        code = _code(exc) or "error"
        transient = transient_status(status) or code in TRANSIENT_CODES
        return FetchError(f"{status} {code}" if status else code, transient=transient)
    untrusted = certificate_error(exc)
    if untrusted is not None:
        return untrusted
    if isinstance(exc, bexc.ConnectTimeoutError):
        return FetchError(f"connect timeout after {opts.connect_timeout:g} s", transient=True)
    if isinstance(exc, bexc.ReadTimeoutError):
        return FetchError(f"stalled: no data for {opts.stall_timeout:g} s", transient=True)
    if isinstance(exc, bexc.EndpointConnectionError):
        return FetchError(
            f"cannot connect to {ctx.redact(str(exc.kwargs.get('endpoint_url', '')))}", transient=True
        )
    if isinstance(exc, (bexc.ConnectionError, bexc.HTTPClientError, bexc.IncompleteReadError)):
        return FetchError(f"connection broken: {ctx.redact(str(exc))}", transient=True)
    if isinstance(exc, (bexc.NoCredentialsError, bexc.PartialCredentialsError)):
        return FetchError(
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (spec.model.credentials) "
            "or give the pod a workload identity"
        )
    if isinstance(exc, bexc.BotoCoreError):
        return FetchError(f"{type(exc).__name__}: {ctx.redact(str(exc))}")
    raise exc
