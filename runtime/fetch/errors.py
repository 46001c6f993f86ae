"""The one exception the fetch step raises: a cause, and whether another attempt may succeed."""

from __future__ import annotations


class FetchError(Exception):
    """A fetch failed; ``cause`` is one line without the source (the caller prefixes it) and
    without a credential.

    ``transient`` is True for failures another attempt may not meet (connection errors, timeouts,
    a stall, HTTP 5xx and 429): ``retry.retrying`` tries again only those. A 4xx, a missing object,
    a checksum mismatch, an unsafe archive or a size over the limit are permanent.
    """

    def __init__(self, cause: str, *, transient: bool = False) -> None:
        super().__init__(cause)
        self.cause = " ".join(cause.split())
        self.transient = transient

    def __str__(self) -> str:
        return self.cause
