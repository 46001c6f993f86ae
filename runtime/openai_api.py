"""OpenAI-compatible routes on the REST port: ``POST /v1/embeddings``, ``POST /v1/rerank`` and
``GET /v1/models``.

What LangChain, LlamaIndex, Haystack and the ``openai`` SDK call (``OpenAI(base_url=".../v1")``), served
by the same data plane as the Open Inference Protocol: the texts of one request are one call to the
plane (``InferCall.split``), which queues them as pieces of at most ``batching.max_batch_size`` rows,
admitted all together or not at all (``Batcher.infer_pieces``: a queue without room for every piece
is one 429 and nothing computed), so they batch with v2 requests, obey the queue limits and
priorities, are counted once in the metrics and refused (503) while the model loads or drains,
exactly as v2 requests are. A transport like ``rest``: it decodes OpenAI's JSON, calls the plane,
encodes OpenAI's answer.

One request holds at most ``max_rows(limits, columns)`` texts (``MAX_INPUTS``, OpenAI's own limit, or
fewer where ``limits.max_request_elements`` says so) whose UTF-8 bytes (each row's, the rerank query
counted in every row, as the v2 route counts a BYTES tensor) are at most ``limits.max_request_bytes``;
beyond either, 413 naming ``input`` (``documents``) before anything is queued (``check_size``).

``POST /v1/embeddings`` (OpenAI's "Create embeddings"), for a model with one BYTES input (the text) and
an FP32 output of shape [-1, dim] (the bundled MiniLM and every Hugging Face text embedder):

- ``model``: the served model's name (another name: 404, code ``model_not_found``);
- ``input``: a string or a list of strings (token arrays are refused with 400: this server tokenizes
  with the model's own tokenizer; send the text);
- ``encoding_format``: ``float`` (default) or ``base64`` (the little-endian float32 bytes, as OpenAI
  sends them);
- ``dimensions``: accepted when it is the model's own dimension; the model cannot shorten its
  embeddings (it is not trained for it), so any other value is a 400 naming the field;
- ``truncate`` (text-embeddings-inference's field): ``true`` cuts a text longer than the model's window
  to it, ``false`` refuses it (413); either may only narrow the service's ``overflow`` policy (chunk,
  then truncate, then refuse: ``truncate: true`` on a service that refuses is a 400 naming
  ``truncate``); absent: the service's policy;
- ``user``: accepted and ignored.

The answer is ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
"model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}``, the token counts being the model's
(special tokens included, after truncation). Errors are OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, with the HTTP status the v2 route would give.

``POST /v1/rerank`` (the rerank API of Cohere and Jina, as infinity, text-embeddings-inference and
KServe serve it), for a reranker (inputs ``query`` and ``text`` BYTES [-1], output ``score`` FP32 [-1]:
``model.task: reranking``):

- ``model``: the served model's name (another name: 404, code ``model_not_found``); may be left out;
- ``query``: a string; ``documents``: a non-empty list of strings (or of ``{"text": ...}`` objects);
- ``top_n``: how many results, the best first (default: all; more than the documents: all);
- ``return_documents``: also return each result's document (default false);
- ``truncate`` (text-embeddings-inference's field, as for embeddings): ``true`` keeps the query whole
  and cuts a longer pair's document to the model's window (transformers' ``truncation="only_second"``),
  ``false`` refuses the pair (413); either may only narrow the service's ``overflow`` policy (a reranker
  truncates or refuses: ``truncate: true`` on a service that refuses is a 400 naming ``truncate``);
  absent: the service's policy. A query that alone leaves no room for the document is a 413 naming
  ``query`` either way.

Each document is one (query, document) row of the request's one call to the plane (queued as pieces of
at most ``batching.max_batch_size`` rows, batched with every other request). The answer is ``{"results":
[{"index": i, "relevance_score": s, "document": {"text": ...}?}], "model": ..., "usage":
{"prompt_tokens": n, "total_tokens": n}}``, results by descending score (ties by index), ``index``
the document's position in the request, ``relevance_score`` the model's score (the reranker's
sigmoid or raw logit, as its config says). A model that is no reranker answers 400 (param ``model``).

``GET /v1/models``: the served model, as OpenAI's "List models".
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import LimitsConfig, RuntimeConfig
from kubeinfer.runtime.dataplane import OVERFLOW_PARAMETER, InferCall, Plane, internal_error
from kubeinfer.runtime.errors import InferenceError, InputError
from kubeinfer.runtime.models.base import TOKEN_COUNTS
from kubeinfer.runtime.rest import BODY_LIMIT_FACTOR, JSON, read_body
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

log = logging.getLogger(__name__)

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


#: Most texts of one request: OpenAI's own limit on ``input`` (``documents`` of a rerank request).
MAX_INPUTS = 2048


def max_rows(limits: LimitsConfig, columns: int = 1) -> int:
    """Most rows of one OpenAI request: ``MAX_INPUTS``, or fewer when rows of ``columns`` BYTES elements
    each (embeddings 1: the text; rerank 2: query and document) would pass ``limits.max_request_elements``."""
    return min(MAX_INPUTS, limits.max_request_elements // columns)


class OpenAIError(InferenceError):
    """An error answered in OpenAI's shape; ``param`` names the request field at fault."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        headers: Mapping[str, str] | None = None,
        *,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message, status, headers)
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


def _decode_object(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON object of a request body. Raises ``OpenAIError`` 400: not JSON, nested deeper than the
    parser goes, not an object."""
    try:
        doc = _DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise OpenAIError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise OpenAIError("request body is not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise OpenAIError("request body must be a JSON object")
    return doc


def parse_embeddings_request(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The fields of a ``/v1/embeddings`` body: ``model`` (str), ``texts`` (list of str),
    ``encoding_format`` ("float" | "base64"), ``dimensions`` (int or None), ``overflow`` (TEI's
    ``truncate``: true -> "truncate", false -> "refuse", absent -> None, the service's policy).

    Raises:
        OpenAIError: 400 naming the field: not JSON, no ``model``, an ``input`` that is not a string or a
            list of strings (token arrays included), an unknown ``encoding_format``, a ``dimensions``
            that is no positive integer, a ``truncate`` that is no boolean.
    """
    doc = _decode_object(body)
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
    return {
        "model": model,
        "texts": texts,
        "encoding_format": encoding,
        "dimensions": dimensions,
        "overflow": _overflow(doc),
    }


def _overflow(doc: Mapping[str, Any]) -> str | None:
    """The ``overflow`` parameter of a body's ``truncate`` (text-embeddings-inference's field): true ->
    ``truncate``, false -> ``refuse``, absent -> None (the service's policy). Raises ``OpenAIError`` 400
    (param ``truncate``) for anything but a boolean."""
    truncate = doc.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise OpenAIError(f"'truncate' must be true or false, got {truncate!r:.40}", param="truncate")
    return None if truncate is None else ("truncate" if truncate else "refuse")


def check_size(param: str, rows: int, columns: int, payload: int, limits: LimitsConfig) -> None:
    """Refuse an OpenAI request over the limits of one request, before anything is queued.

    Args:
        param: the request field holding the rows (``input``, ``documents``), named in the error.
        rows: the texts (rows) it holds. columns: BYTES elements per row (``max_rows``).
        payload: the UTF-8 bytes of every row's elements together.
        limits: the runtime's ``limits``.

    Raises:
        OpenAIError: 413 naming ``param``: more rows than ``max_rows(limits, columns)``, or more payload
            bytes than ``limits.max_request_bytes``.
    """
    most = max_rows(limits, columns)
    if rows > most:
        raise OpenAIError(
            f"'{param}' has {rows} items, over the limit of {most} per request "
            f"(OpenAI's {MAX_INPUTS}, or limits.max_request_elements {limits.max_request_elements} "
            f"over {columns} element(s) a row); split it into smaller requests",
            413,
            param=param,
        )
    if payload > limits.max_request_bytes:
        raise OpenAIError(
            f"'{param}' carries {payload} bytes of text, over the limit of {limits.max_request_bytes} "
            "(limits.max_request_bytes); split it into smaller requests",
            413,
            param=param,
        )


def text_rows(texts: Sequence[str]) -> tuple[np.ndarray, int]:
    """``texts`` as a BYTES tensor (object array [len(texts)] of UTF-8 ``bytes``) and its payload bytes."""
    rows = np.empty(len(texts), dtype=object)
    rows[:] = [t.encode("utf-8") for t in texts]
    return rows, sum(len(b) for b in rows)


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


def parse_rerank_request(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The fields of a ``/v1/rerank`` body: ``model`` (str or None), ``query`` (str), ``documents``
    (list of str), ``top_n`` (int or None), ``return_documents`` (bool), ``overflow`` (the ``truncate``
    field as the overflow parameter: ``truncate``, ``refuse`` or None).

    Raises:
        OpenAIError: 400 naming the field: not JSON or no object, a ``model`` that is no string, no
            string ``query``, ``documents`` not a non-empty list of strings or ``{"text": str}`` objects,
            a ``top_n`` that is no positive integer, a ``return_documents`` or ``truncate`` that is no
            boolean.
    """
    doc = _decode_object(body)
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise OpenAIError("'model' must be the served model's name", param="model")
    query = doc.get("query")
    if not isinstance(query, str):
        raise OpenAIError("'query' is required: a string", param="query")
    documents = _documents(doc.get("documents"))
    top_n = doc.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise OpenAIError(f"'top_n' must be a positive integer, got {top_n!r}", param="top_n")
    return_documents = doc.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise OpenAIError(
            f"'return_documents' must be true or false, got {return_documents!r}", param="return_documents"
        )
    return {
        "model": model,
        "query": query,
        "documents": documents,
        "top_n": top_n,
        "return_documents": return_documents,
        "overflow": _overflow(doc),
    }


def _documents(raw: Any) -> list[str]:
    """A rerank request's ``documents`` as strings. Raises ``OpenAIError`` 400 (param ``documents``)."""
    if not isinstance(raw, list) or not raw:
        raise OpenAIError("'documents' must be a non-empty list of strings", param="documents")
    documents = []
    for i, item in enumerate(raw):
        text = item["text"] if isinstance(item, dict) and isinstance(item.get("text"), str) else item
        if not isinstance(text, str):
            raise OpenAIError(
                f"'documents'[{i}] must be a string (or an object with a string 'text')", param="documents"
            )
        documents.append(text)
    return documents


def check_reranker(metadata: dict[str, Any]) -> None:
    """Raises ``OpenAIError`` 400 (param ``model``) unless the v2 model metadata is a reranker's: inputs
    ``query`` and ``text`` BYTES of one element per row (the metadata lists them [-1, 1]), an output
    ``score`` FP32 [-1]."""
    inputs = {
        (t["name"], t["datatype"], (-1,) if list(t["shape"]) == [-1, 1] else tuple(t["shape"]))
        for t in metadata["inputs"]
    }
    outputs = {(t["name"], t["datatype"], tuple(t["shape"])) for t in metadata["outputs"]}
    if (
        inputs != {("query", "BYTES", (-1,)), ("text", "BYTES", (-1,))}
        or ("score", "FP32", (-1,)) not in outputs
    ):
        raise OpenAIError(
            f"model '{metadata['name']}' is not a reranker (it needs inputs 'query' and 'text' BYTES [-1] "
            "and an output 'score' FP32 [-1]: model.task reranking); use the v2 infer route",
            param="model",
        )


def rerank_results(
    scores: np.ndarray, documents: Sequence[str], top_n: int | None, return_documents: bool
) -> list[dict[str, Any]]:
    """The ``results`` of a rerank answer: the ``top_n`` best (all when None) of ``scores`` (float
    [len(documents)]) by descending score, ties by index; each ``{"index", "relevance_score"}`` and,
    with ``return_documents``, ``"document": {"text": ...}``."""
    order = sorted(range(len(documents)), key=lambda i: (-float(scores[i]), i))
    results = []
    for i in order[: top_n or len(order)]:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return results


class OpenAIRoutes:
    """The OpenAI-compatible routes over ``plane`` (``routes``, added to a ``rest.RestApp``).

    Args:
        plane: the data plane (``DataPlane`` or a front end's ``RemotePlane``).
        cfg: the runtime configuration (``limits``: the body limit and the size of one request).
    """

    def __init__(self, plane: Plane, cfg: RuntimeConfig) -> None:
        self.plane = plane
        self.cfg = cfg
        self.auth = BearerAuth.from_config(cfg)
        self.created = int(time.time())
        self.routes = [
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/rerank", self.rerank, methods=["POST"]),
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
        except Exception as exc:  # a bug, not the request: one line, OpenAI's shape
            log.error("/v1/embeddings failed: %s: %s", type(exc).__name__, exc)
            return error_response(internal_error(exc))

    async def rerank(self, request: Request) -> Response:
        """``POST /v1/rerank`` (see the module docstring)."""
        received = time.monotonic()
        try:
            return await self._rerank(request, received)
        except InferenceError as exc:
            return error_response(exc)
        except Exception as exc:  # a bug, not the request: one line, OpenAI's shape
            log.error("/v1/rerank failed: %s: %s", type(exc).__name__, exc)
            return error_response(internal_error(exc))

    async def _rerank(self, request: Request, received: float) -> Response:
        try:
            self.auth.check(request.headers.get("authorization"))
            body = await read_body(request, BODY_LIMIT_FACTOR * self.cfg.limits.max_request_bytes)
            req = parse_rerank_request(body)
            served = self.plane.model_name
            if req["model"] not in (None, served):
                raise OpenAIError(
                    f"model '{req['model']}' is not served here; this server serves '{served}'",
                    404,
                    param="model",
                    code="model_not_found",
                )
            documents: list[str] = req["documents"]
            texts, payload = text_rows(documents)
            query = req["query"].encode("utf-8")
            check_size("documents", len(documents), 2, payload + len(query) * len(documents), self.cfg.limits)
            check_reranker(await self.plane.model_metadata(served, None))
        except InferenceError as exc:
            await self._refuse(received, exc)
            raise
        queries = np.full(len(documents), query, dtype=object)  # one bytes object, not a copy a row
        columns = {"query": queries, "text": texts}
        scores, tokens = await self._run_rows(
            received, columns, "score", {"query": "query", "text": "documents"}, req["overflow"]
        )
        doc = {
            "results": rerank_results(scores, documents, req["top_n"], req["return_documents"]),
            "model": self.plane.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return Response(_ENCODER.encode(doc), 200, media_type=JSON)

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
            rows, payload = text_rows(req["texts"])
            check_size("input", len(rows), 1, payload, self.cfg.limits)
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
        embeddings, tokens = await self._run_rows(
            received, {text_input: rows}, output, {text_input: "input"}, req["overflow"]
        )
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

    async def _run_rows(
        self,
        received: float,
        columns: dict[str, np.ndarray],
        output: str,
        params: dict[str, str],
        overflow: str | None = None,
    ) -> tuple[np.ndarray, int]:
        """Run the rows of ``columns`` (input name -> BYTES tensor, one text a row, every column as long)
        as one call to the plane, queued as pieces admitted together (``InferCall.split``), with the
        ``overflow`` parameter (``parse_embeddings_request``). Returns ``output`` (rows in input
        order) and the tokens they took.

        Raises:
            InferenceError: the call's; an ``InputError`` (400, 413) as an ``OpenAIError`` naming the
                request field of its tensor (``params``: input name -> field; ``truncate`` for the
                overflow parameter).
        """

        async def decode() -> InferCall:
            return InferCall(dict(columns), [output], usage=True, split=True, overflow=overflow)

        try:
            out = await self.plane.infer(received, self.plane.model_name, None, decode)
        except InputError as exc:
            param = params.get(exc.tensor or "", next(iter(params.values())))
            if overflow is not None and exc.message.startswith(f"parameter '{OVERFLOW_PARAMETER}'"):
                param = "truncate"
            raise OpenAIError(exc.message, exc.status, exc.headers, param=param) from None
        tokens = int(out[TOKEN_COUNTS].sum()) if TOKEN_COUNTS in out else 0
        return out[output], tokens


def encode_embedding(row: np.ndarray, encoding_format: str) -> list[float] | str:
    """One embedding as OpenAI sends it: a list of floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    values: list[float] = row.tolist()
    return values
