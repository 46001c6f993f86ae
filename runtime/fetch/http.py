"""``https://`` (and, when allowed, ``http://``) sources with httpx: one file, or an archive unpacked.

The body is streamed to a temporary file (never held in memory) with
``httpx.Timeout(connect=--connect-timeout, read=--stall-timeout)``: no byte for that long fails the
attempt. ``KUBEINFER_FETCH_BEARER_TOKEN`` is sent as ``Authorization: Bearer``; httpx drops it on a
redirect to another host (a presigned object-store URL, say). A redirect from https to http is
refused unless http is allowed. ``--ca-file``: its CAs are trusted besides the public ones
(``tls.ssl_context``); an untrusted certificate fails at once, naming the option. An HTML page
answered with 200 (``Content-Type: text/html``, or a body that begins as one: a login page) is
refused at once (``htmlpage``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
from kubeinfer.runtime.fetch.context import Context, Fetched, finish_single, single_target
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import Sink
from kubeinfer.runtime.fetch.htmlpage import check_content_type
from kubeinfer.runtime.fetch.retry import transient_status
from kubeinfer.runtime.fetch.source import HttpSource
from kubeinfer.runtime.fetch.tls import certificate_error, ssl_context

from kubeinfer.contract import sources

#: Bytes read from the response at a time.
CHUNK_BYTES = 1 << 20
#: The environment variable whose value is sent as a bearer token.
BEARER_TOKEN_ENV = sources.FETCH_BEARER_TOKEN_ENV


def fetch_http(source: HttpSource, ctx: Context) -> Fetched:
    """Download ``source`` into ``ctx.dest`` (see the module docstring).

    Raises:
        FetchError: ``http://`` not allowed; ``<status> <reason>`` (4xx at once; 5xx and 429 after the
            retries); ``stalled: no data for S s``; ``connect timeout after S s``; a connection error;
            an untrusted certificate (``tls.certificate_error``); a size over the limit; a sha256
            mismatch; an unsafe or corrupt archive; an HTML page (``errors.HTML_PAGE_CAUSE``).
    """
    opts = ctx.options
    if source.scheme == "http" and not opts.allow_http:
        raise FetchError("plain http:// is refused without --allow-http (spec.model.allowInsecureHttp: true)")
    # identity: the file as stored, never compressed on the fly (the sha256 is of the file)
    headers = {"User-Agent": "kubeinfer-fetch", "Accept-Encoding": "identity"}
    token = ctx.env.get(BEARER_TOKEN_ENV)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    timeout = httpx.Timeout(
        connect=opts.connect_timeout,
        read=opts.stall_timeout,
        write=opts.stall_timeout,
        pool=opts.connect_timeout,
    )

    def refuse_downgrade(request: httpx.Request) -> None:
        if request.url.scheme == "http" and not opts.allow_http:
            raise FetchError("redirected to plain http://, refused without --allow-http")

    final, kind = single_target(ctx, source.filename)
    verify: ssl.SSLContext | bool = ssl_context(opts.ca_file) if opts.ca_file else True
    with httpx.Client(
        timeout=timeout,
        headers=headers,
        follow_redirects=True,
        event_hooks={"request": [refuse_downgrade]},
        verify=verify,
    ) as client:
        nbytes = ctx.retry(lambda: _attempt(client, source, final, ctx))
    return finish_single(ctx, final, kind, nbytes)


def _attempt(client: httpx.Client, source: HttpSource, final: Path, ctx: Context) -> int:
    """One GET streamed into ``final`` (the bytes as served: no content decoding); returns the
    bytes written."""
    opts = ctx.options
    try:
        with client.stream("GET", source.url) as response:
            if response.status_code != 200:
                raise FetchError(
                    f"{response.status_code} {response.reason_phrase}".strip(),
                    transient=transient_status(response.status_code),
                )
            check_content_type(final.name, response.headers.get("Content-Type"))
            length = _content_length(response)
            if length is not None:
                ctx.budget.check_total(length)
                ctx.progress.set_total(length)
            with Sink(final, budget=ctx.budget, progress=ctx.progress, sha256=opts.sha256) as sink:
                for chunk in response.iter_raw(CHUNK_BYTES):
                    sink.write(chunk)
                if length is not None and sink.bytes != length:
                    raise FetchError(f"short body: {sink.bytes} of {length} bytes", transient=True)
                sink.commit()
                return sink.bytes
    except httpx.HTTPError as exc:
        raise _transport_error(exc, ctx) from None


def _transport_error(exc: httpx.HTTPError, ctx: Context) -> FetchError:
    """An httpx failure as a transient ``FetchError`` (too many redirects and an untrusted certificate:
    permanent)."""
    opts = ctx.options
    untrusted = certificate_error(exc)
    if untrusted is not None:
        return untrusted
    if isinstance(exc, httpx.ConnectTimeout):
        return FetchError(f"connect timeout after {opts.connect_timeout:g} s", transient=True)
    if isinstance(exc, httpx.ReadTimeout):
        return FetchError(f"stalled: no data for {opts.stall_timeout:g} s", transient=True)
    if isinstance(exc, httpx.TimeoutException):
        return FetchError(f"timeout ({type(exc).__name__})", transient=True)
    if isinstance(exc, httpx.ConnectError):
        return FetchError(f"cannot connect: {ctx.redact(str(exc))}", transient=True)
    if isinstance(exc, httpx.TooManyRedirects):
        return FetchError("too many redirects")
    return FetchError(f"connection broken: {ctx.redact(str(exc)) or type(exc).__name__}", transient=True)


def _content_length(response: httpx.Response) -> int | None:
    """The body's length (bytes as sent) when the server states it."""
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
