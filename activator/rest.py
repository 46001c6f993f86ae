"""The REST front: an ASGI app (Starlette) that forwards every request to its target's replica (httpx).

The target comes from the ``Host`` header (``Targets.resolve``); an unknown host is 404. A request for a
target with a ready replica is forwarded at once; otherwise it is held (``Gate``) and forwarded once a
replica is ready. Everything but the hop-by-hop headers passes both ways untouched, ``Authorization``
included: the runtime checks the bearer token, so its 401 reaches the client as it sent it. The response
streams back as the runtime writes it (server-sent events included), its encoding kept.

The activator's own answers use the Open Inference Protocol's error shape, ``{"error": message}``: 404 for
an unknown host, 503 with ``Retry-After`` for a full queue, 504 naming the replica's stage when a request's
deadline passes while held, 502 when the replica cannot be reached. Its own routes live under
``/activator/`` (``healthz``, ``readyz``, ``status``), apart from the runtime's ``/v2/health/*`` and
``/metrics``, which are forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx
from kubeinfer.activator.gate import Gate, refused
from kubeinfer.activator.targets import Endpoint
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive

from kubeinfer.shared.hold import HoldTimeout, Overflow, retry_after_header, seconds_from_us

__all__ = ["HOP_BY_HOP", "rest_app", "rest_parameters"]

#: Headers of one connection, not of the request (RFC 9110 7.6.1); ``host`` and ``content-length`` are
#: set again for the upstream request.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
T = TypeVar("T")


class ClientLeftError(Exception):
    """The client closed the connection while its request was held."""


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The v2 protocol's error response: ``{"error": message}`` with ``status``."""
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def rest_parameters(headers: Mapping[str, str], body: bytes) -> tuple[object, float | None]:
    """The OIP ``priority`` and ``timeout`` (as seconds) of an inference request body, JSON or Triton's
    binary form (the JSON header is the first ``Inference-Header-Content-Length`` bytes); (None, None)
    for a body that is not a JSON object (the runtime answers what is wrong with it)."""
    length = headers.get("inference-header-content-length")
    head = body
    if length is not None:
        with contextlib.suppress(ValueError):
            head = body[: int(length)]
    try:
        doc = json.loads(head)
    except ValueError:
        return None, None
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        return None, None
    return params.get("priority"), seconds_from_us(params.get("timeout"))


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the body was read: nothing else arrives before that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result; raises ``ClientLeftError`` (``work`` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientLeftError
    return task.result()


def rest_app(
    gate: Gate,
    *,
    upstream_timeout_s: float = 300.0,
    status: Callable[[], dict[str, Any]] | None = None,
    ready: Callable[[], bool] | None = None,
) -> Starlette:
    """The REST front's ASGI app.

    Args:
        gate: targets and the hold.
        upstream_timeout_s: the longest wait for the replica's response (seconds, per read).
        status: what ``GET /activator/status`` answers (default: the held requests per target).
        ready: whether ``GET /activator/readyz`` answers 200 (else 503; default: always ready), e.g.
            once the Kubernetes targets have listed every kind once.
    """
    client: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        nonlocal client
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(upstream_timeout_s, connect=10.0), limits=limits
        ) as c:
            client = c
            yield

    def held_status() -> dict[str, Any]:
        return {
            "targets": {
                key: {"held": h.requests, "held_bytes": h.nbytes}
                for key in gate.hold.targets()
                for h in [gate.hold.held(key)]
            }
        }

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"live": True})

    async def readyz(_request: Request) -> Response:
        ok = ready is None or ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def show_status(_request: Request) -> Response:
        return JSONResponse((status or held_status)())

    async def forward(request: Request) -> Response:
        host = request.headers.get("host", "")
        target = gate.targets.resolve(host)
        if target is None:
            return error(404, f"no InferenceService is served at host '{host[:100]}' through this activator")
        body = await request.body()
        endpoint = gate.targets.endpoint(target) or await _held(gate, request, target, body)
        if isinstance(endpoint, Response):
            return endpoint
        assert client is not None, "the app's lifespan did not run"
        return await _proxy(client, request, endpoint, body, target)

    return Starlette(
        routes=[
            Route("/activator/healthz", healthz, methods=["GET"]),
            Route("/activator/readyz", readyz, methods=["GET"]),
            Route("/activator/status", show_status, methods=["GET"]),
            Route("/{path:path}", forward, methods=_METHODS),
        ],
        lifespan=lifespan,
    )


async def _held(gate: Gate, request: Request, target: str, body: bytes) -> Endpoint | Response:
    """Hold ``request`` until ``target`` has a replica: its endpoint, or the activator's own answer."""
    priority, timeout_s = rest_parameters(request.headers, body) if body else (None, None)
    wait = gate.endpoint(target, nbytes=len(body), priority=priority, timeout_s=timeout_s)
    try:
        return await _unless_client_leaves(request.receive, wait)
    except Overflow as exc:
        refused("REST 503", target, exc.message)
        return error(503, exc.message, {"Retry-After": retry_after_header(exc.retry_after_s)})
    except HoldTimeout as exc:
        refused("REST 504", target, exc.message)
        return error(504, exc.message)
    except ClientLeftError:
        return Response(status_code=499)  # nobody reads it: the connection is gone


async def _proxy(
    client: httpx.AsyncClient, request: Request, endpoint: Endpoint, body: bytes, target: str
) -> Response:
    """Send ``request`` to ``endpoint`` and stream its response back (502 if it cannot be reached)."""
    headers = [
        (k, v)
        for k, v in request.headers.raw
        if k.decode("latin-1").lower() not in HOP_BY_HOP and k.lower() not in (b"host", b"content-length")
    ]
    query = request.url.query.encode("latin-1")
    url = httpx.URL(scheme="http", host=endpoint.host, port=endpoint.http_port, path=request.url.path)
    if query:
        url = url.copy_with(query=query)
    upstream = client.build_request(request.method, url, headers=headers, content=body)
    try:
        resp = await client.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        message = f"{target}: its replica at {endpoint.http} could not be reached: {type(exc).__name__}"
        refused("REST 502", target, message)
        return error(502, message)
    out = StreamingResponse(
        resp.aiter_raw(), status_code=resp.status_code, background=BackgroundTask(resp.aclose)
    )
    out.raw_headers = [(k, v) for k, v in resp.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP]
    return out
