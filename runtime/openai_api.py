"""OpenAI-compatible routes on the REST port: ``POST /v1/embeddings`` and ``GET /v1/models``.

What LangChain, LlamaIndex, Haystack and the ``openai`` SDK call (``OpenAI(base_url=".../v1")``), served
by the same data plane as the Open Inference Protocol: the texts of one request go to the batcher as
one or more v2 calls (at most ``batching.max_batch_size`` rows each, submitted together), so they batch
with v2 requests, obey the queue limits and priorities, are counted in the metrics and refused (503)
while the model loads or drains, exactly as v2 requests are. A transport like ``rest``: it decodes
OpenAI's JSON, calls the plane, encodes OpenAI's answer.

``POST /v1/embeddings`` (OpenAI's "Create embeddings"), for a model with one BYTES input (the text) and
an FP32 output of shape [-1, dim] (the bundled MiniLM and every Hugging Face text embedder):

- ``model``: the served model's name (another name: 404, code ``model_not_found``);
- ``input``: a string or a list of strings (token arrays are refused with 400: this server tokenizes
  with the model's own tokenizer; send the text);
- ``encoding_format``: ``float`` (default) or ``base64`` (the little-endian float32 bytes, as OpenAI
  sends them);
- ``dimensions``: accepted when it is the model's own dimension; the model cannot shorten its
  embeddings (it is not trained for it), so any other value is a 400 naming the field;
- ``user``: accepted and ignored.

The answer is ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
"model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}``, the token counts being the model's
(special tokens included, after truncation). Errors are OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, with the HTTP status the v2 route would give.

``GET /v1/models``: the served model, as OpenAI's "List models".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import InferCall, Plane
from kubeinfer.runtime.errors import InferenceError
from kubeinfer.runtime.models.base import TOKEN_COUNTS
from kubeinfer.runtime.rest import BODY_LIMIT_FACTOR, JSON, read_body
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()

#: OpenAI's error ``type`` for an HTTP status (the SDKs pick their exception class from the status).
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(InferenceError):
    """An error answered in OpenAI's shape; ``param`` names the request field at fault."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None, code: str | None = None):
        super().__init__(message, status)
        self.param = param
        self.code = code


def error_response(exc: InferenceError) -> Response:
    """``{"error": {"message", "type", "param", "code"}}`` with the error's status and headers."""
    doc = {
        "error": {
            "message": exc.message,
            "type": ERROR_TYPES.get(exc.status, "server_error"),
            "param": getattr(exc, "param", None),
            "code": getattr(exc, "code", None),
        }
    }
    return Response(_ENCODER.encode(doc), exc.status, headers=exc.headers, media_type=JSON)


def parse_embeddings_request(body: bytes) -> dict[str, Any]:
    """The fields of a ``/v1/embeddings`` body: ``model`` (str), ``texts`` (list of str),
    ``encoding_format`` ("float" | "base64"), ``dimensions`` (int or None).

    Raises:
        OpenAIError: 400 naming the field: not JSON, no ``model``, an ``input`` that is not a string or a
            list of strings (token arrays included), an unknown ``encoding_format``, a ``dimensions``
            that is no positive integer.
    """
    try:
        doc = _DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise OpenAIError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OpenAIError("request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("'model' is required: the served model's name", param="model")
    raw = doc.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise OpenAIError("'input' must be a string or a non-empty list of strings", param="input")
    if not all(isinstance(t, str) for t in texts):
        if all(isinstance(t, int | list) for t in texts):
            raise OpenAIError(
                "'input' as token arrays is not accepted: this server tokenizes with the model's own "
                "tokenizer; send the text",
                param="input",
            )
        raise OpenAIError("'input' must be a string or a list of strings", param="input")
    encoding = doc.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIError(
            f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", param="encoding_format"
        )
    dimensions = doc.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise OpenAIError(f"'dimensions' must be a positive integer, got {dimensions!r}", param="dimensions")
    return {"model": model, "texts": texts, "encoding_format": encoding, "dimensions": dimensions}


def embedding_tensors(metadata: dict[str, Any]) -> tuple[str, str, int]:
    """The text input's name, the embedding output's name and its dimension, from v2 model metadata.

    Raises:
        OpenAIError: 400 when the model takes no single BYTES input or gives no FP32 [-1, dim] output.
    """
    inputs = [t for t in metadata["inputs"] if t["datatype"] == "BYTES"]
    outputs = [t for t in metadata["outputs"] if t["datatype"] == "FP32" and len(t["shape"]) == 2]
    if len(metadata["inputs"]) != 1 or not inputs or not outputs:
        raise OpenAIError(
            f"model '{metadata['name']}' does not produce text embeddings (it needs one BYTES input and an "
            "FP32 [-1, dim] output); use the v2 infer route",
            param="model",
        )
    return inputs[0]["name"], outputs[0]["name"], int(outputs[0]["shape"][1])


class OpenAIRoutes:
    """The OpenAI-compatible routes over ``plane`` (``routes``, added to a ``rest.RestApp``).

    Args:
        plane: the data plane (``DataPlane`` or a front end's ``RemotePlane``).
        cfg: the runtime configuration (body limit; ``batching.max_batch_size``, the warmed maximum
            rows of one call to the plane).
    """

    def __init__(self, plane: Plane, cfg: RuntimeConfig) -> None:
        self.plane = plane
        self.cfg = cfg
        self.auth = BearerAuth.from_config(cfg)
        self.created = int(time.time())
        self.routes = [
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    async def models(self, request: Request) -> Response:
        """OpenAI's model list: the one model served."""
        try:
            self.auth.check(request.headers.get("authorization"))
        except InferenceError as exc:
            return error_response(exc)
        doc = {
            "object": "list",
            "data": [
                {
                    "id": self.plane.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "kubeinfer",
                }
            ],
        }
        return Response(_ENCODER.encode(doc), 200, media_type=JSON)

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings`` (see the module docstring)."""
        received = time.monotonic()
        try:
            return await self._embeddings(request, received)
        except InferenceError as exc:
            return error_response(exc)

    async def _refuse(self, received: float, exc: InferenceError) -> None:
        """Count a request refused before it reached the plane, as the plane counts a bad v2 body."""

        async def fail() -> InferCall:
            raise exc

        with contextlib.suppress(InferenceError):
            await self.plane.infer(received, self.plane.model_name, None, fail)

    async def _embeddings(self, request: Request, received: float) -> Response:
        try:
            self.auth.check(request.headers.get("authorization"))
            body = await read_body(request, BODY_LIMIT_FACTOR * self.cfg.limits.max_request_bytes)
            req = parse_embeddings_request(body)
            served = self.plane.model_name
            if req["model"] != served:
                raise OpenAIError(
                    f"model '{req['model']}' is not served here; this server serves '{served}'",
                    404,
                    param="model",
                    code="model_not_found",
                )
            metadata = await self.plane.model_metadata(self.plane.model_name, None)
            text_input, output, dim = embedding_tensors(metadata)
            if req["dimensions"] not in (None, dim):
                raise OpenAIError(
                    f"'dimensions' {req['dimensions']}: model '{served}' gives {dim}-dimensional embeddings "
                    "and cannot shorten them",
                    param="dimensions",
                )
        except InferenceError as exc:
            await self._refuse(received, exc)
            raise
        texts: list[str] = req["texts"]
        embeddings, tokens = await self._embed(received, texts, text_input, output)
        data = [
            {"object": "embedding", "index": i, "embedding": encode_embedding(row, req["encoding_format"])}
            for i, row in enumerate(embeddings)
        ]
        doc = {
            "object": "list",
            "data": data,
            "model": self.plane.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return Response(_ENCODER.encode(doc), 200, media_type=JSON)

    async def _embed(
        self, received: float, texts: Sequence[str], text_input: str, output: str
    ) -> tuple[np.ndarray, int]:
        """Embed ``texts`` in calls of at most ``batching.max_batch_size`` rows, submitted together.
        Returns float32 [len(texts), dim] in input order and the tokens they took. Raises the first
        call's ``InferenceError``."""
        size = max(1, self.cfg.batching.max_batch_size)
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]

        def decoder(chunk: Sequence[str]) -> Any:
            async def decode() -> InferCall:
                rows = np.empty(len(chunk), dtype=object)
                rows[:] = [t.encode("utf-8") for t in chunk]
                return InferCall({text_input: rows}, [output], usage=True)

            return decode

        name = self.plane.model_name
        results = await asyncio.gather(
            *(self.plane.infer(received, name, None, decoder(c)) for c in chunks), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        outs = [r for r in results if not isinstance(r, BaseException)]
        embeddings = np.concatenate([o[output] for o in outs])
        tokens = sum(int(o[TOKEN_COUNTS].sum()) for o in outs if TOKEN_COUNTS in o)
        return embeddings, tokens


def encode_embedding(row: np.ndarray, encoding_format: str) -> list[float] | str:
    """One embedding as OpenAI sends it: a list of floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    values: list[float] = row.tolist()
    return values
