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


#: The cause when a server answers an HTML page (a login page behind an expired token, a portal, a
#: wrong URL that lands on a web page) where a model's file was asked for (``htmlpage``).
HTML_PAGE_CAUSE = "the server answered an HTML page, not a model (check the URI and the credentials)"
