"""The floor of ``bench/frontend_bench.py``: the apps that answer every ``POST /v2/models/{name}/infer`` with
one fixed 100-byte JSON response (no model, no decoding), for each HTTP server the bench measures.

- ``starlette_app()``: a Starlette app with the one route, as ``kubeinfer-runtime`` builds its own (the
  runtime's app is Starlette too): served by uvicorn (``frontend_bench.floor_server``, the runtime's
  HTTP stack) and by granian's ASGI interface (``granian --factory frontend_floor:starlette_app``);
- ``rsgi_app``: the same answer through granian's own interface, RSGI, with no framework at all (no
  routing: every request gets it), what granian costs with no Python framework on top.

Imported by the granian worker process too (granian's ``--working-dir`` is bench/): it imports no
other bench module and nothing heavy until an app is built.
"""

from __future__ import annotations

import json
from typing import Any

FLOOR_RESPONSE = json.dumps(
    {
        "model_name": "floor",
        "model_version": "1",
        "outputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0, 0.0, 0.0, 0.0]}],
    }
).encode()
FLOOR_ROUTE = "/v2/models/{name}/infer"
_JSON_HEADERS = [("content-type", "application/json")]


def starlette_app() -> Any:
    """The Starlette floor app: ``POST FLOOR_ROUTE`` reads the body, answers 200 ``FLOOR_RESPONSE``
    (``application/json``); any other route 404, another method 405 (Starlette's own answers)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def infer(request: Request) -> Response:
        await request.body()
        return Response(FLOOR_RESPONSE, 200, media_type="application/json")

    return Starlette(routes=[Route(FLOOR_ROUTE, infer, methods=["POST"])])


async def rsgi_app(scope: Any, protocol: Any) -> None:
    """The RSGI floor app (granian's interface): reads the body, answers 200 ``FLOOR_RESPONSE`` to any
    HTTP request (no routing, no framework)."""
    await protocol()
    protocol.response_bytes(200, _JSON_HEADERS, FLOOR_RESPONSE)
