"""The runtime's errors: one hierarchy, each error an HTTP response (``{"error": message}``).

Models: httpx's ``_exceptions.py`` (one base, subclasses by origin) and kserve's ``errors.py`` (errors
carry their status; the server registers one handler). Every error that reaches a client is an
``InferenceError``; the server turns it into a response in one place (a Starlette exception handler,
``kubeinfer.runtime.server``). Constructors take the same arguments in the same order:
``(message, status, headers, *, tensor)``, each subclass with its own default status.

- ``ProtocolError`` (400): a malformed request body, raised by the codec (``protocol``).
- ``InputError`` (400 or 413): well-formed but wrong for this model (names, datatypes, shapes, limits),
  raised by ``ServableModel.validate``/``preprocess`` and the batcher's parameter checks.
- ``ServingError`` (429, 500, 503, 504): the request could not be served (queue full, the model failed
  on it, shutting down, its ``timeout`` passed while queued), raised by the batcher.
- ``HTTPError`` (any): the HTTP layer's own refusals (404 unknown model, 413 body too large, 400 bad
  header or encoding, 503 not ready).
- ``ClientGone`` (499): the client left before its answer (closed the connection while sending the
  body or while its request waited); counted, never answered.

Pure: imports nothing but the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

#: The status counted for a request whose client left before its answer (nginx's "client closed
#: request"; a cancelled gRPC call, CANCELLED, is counted with it). Never sent: nobody reads it.
CLIENT_CLOSED = 499


class InferenceError(Exception):
    """An error answered as ``status`` with the body ``{"error": message}`` and ``headers``.

    Args:
        message: what went wrong, naming the tensor or parameter and what was expected.
        status: HTTP status; the class's ``default_status`` when None.
        headers: extra response headers (``Retry-After`` on 429).
        tensor: the input tensor the message names, or None when the whole request is at fault.

    Attributes: ``message``, ``status``, ``headers`` (a dict), ``tensor``.
    """

    default_status: ClassVar[int] = 500

    def __init__(
        self,
        message: str,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        tensor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = self.default_status if status is None else status
        self.headers: dict[str, str] = dict(headers or {})
        self.tensor = tensor


class ProtocolError(InferenceError):
    """A malformed infer request (Open Inference Protocol codec): 400."""

    default_status = 400


class InputError(InferenceError):
    """A request's input is wrong for the model: 400 (names, datatype, shape, encoding, parameters) or
    413 (over a limit of ``LimitsConfig``: elements, bytes, text tokens; rows over the warmed maximum).

    Raises:
        ValueError: ``status`` is neither 400 nor 413.
    """

    default_status = 400

    def __init__(
        self,
        message: str,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        tensor: str | None = None,
    ) -> None:
        if status not in (None, 400, 413):
            raise ValueError(f"InputError status must be 400 or 413, got {status}")
        super().__init__(message, status, headers, tensor=tensor)


class ServingError(InferenceError):
    """A request could not be served: 429 queue full, 500 model failure, 503 not accepting,
    504 timed out while queued."""

    default_status = 500


class HTTPError(InferenceError):
    """A refusal of the HTTP layer (unknown model 404, body over the limit 413, bad header 400, not
    ready 503)."""

    default_status = 400


class ClientGone(InferenceError):
    """The client left before its answer: it closed the connection while sending the body, or while
    its request was queued or computed (REST), or cancelled its call (gRPC): ``CLIENT_CLOSED`` (499).
    Counted in the metrics; no response is sent (the connection is gone)."""

    default_status = CLIENT_CLOSED
