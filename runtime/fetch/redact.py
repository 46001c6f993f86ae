"""Redaction: no credential reaches a log line, the termination message or the report file.

A URL's userinfo (``https://user:password@host``) and query string (a presigned URL's signature)
are replaced by ``***``; so is any known secret value (the credential environment variables) found
in a message that a library wrote (an exception may quote a URL or a header).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

#: What replaces a redacted part.
MASK = "***"
#: Environment variables whose values are credentials (``kubeinfer-runtime fetch`` reads them).
SECRET_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "HF_TOKEN",
    "KUBEINFER_FETCH_BEARER_TOKEN",
)
#: Secret values shorter than this are not searched for (they would mask ordinary words).
MIN_SECRET_CHARS = 4

#: A URL in a text, without a trailing punctuation mark (``https://h/x?q=1: 404`` stops before ``:``).
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)\]]")


def redact_url(url: str) -> str:
    """``url`` without its userinfo and query (each replaced by ``***``) and without a fragment.

    A string that is not a URL with a scheme and ``://`` is returned unchanged; a URL that cannot
    be parsed is replaced by ``***`` whole.
    """
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return MASK
    netloc = f"{MASK}@{host}" if "@" in parts.netloc else host
    query = MASK if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def secrets_from(env: Mapping[str, str]) -> list[str]:
    """The values of ``SECRET_ENV`` set in ``env`` (at least ``MIN_SECRET_CHARS`` long)."""
    return [env[name] for name in SECRET_ENV if len(env.get(name, "")) >= MIN_SECRET_CHARS]


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted (``redact_url``) and every value of ``secrets``
    (at least ``MIN_SECRET_CHARS`` long) replaced by ``***``."""
    out = _URL.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_CHARS:
            out = out.replace(secret, MASK)
    return out
