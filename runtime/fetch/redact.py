"""Redaction: no credential reaches a log line, the termination message or the report file.

A URL's userinfo (``https://user:password@host``) and query string (a presigned URL's signature)
are replaced by ``***``; so is any known secret value (the credential environment variables) found
in a message that a library wrote (an exception may quote a URL or a header).
"""

from __future__ import annotations

import os
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


def strip_credentials(env: dict[str, str] | os._Environ[str]) -> None:
    """Strip the whitespace around every ``SECRET_ENV`` value in ``env``, in place.

    A Secret made from a file usually ends in a newline (``kubectl create secret --from-file``);
    sent as is, an HTTP client refuses the header and quotes the value in its error
    (``Illegal header value b'Bearer ...\\n'``), where the plain value is not found to be masked.
    """
    for name in SECRET_ENV:
        value = env.get(name)
        if value is not None and value != value.strip():
            env[name] = value.strip()


def credentials_stripped(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the ``SECRET_ENV`` values stripped (:func:`strip_credentials`)."""
    out = dict(env)
    strip_credentials(out)
    return out


def secrets_from(env: Mapping[str, str]) -> list[str]:
    """The values of ``SECRET_ENV`` set in ``env`` (at least ``MIN_SECRET_CHARS`` long), each also as
    stripped of surrounding whitespace and in its escaped forms (``repr`` of the str and of its
    UTF-8 bytes, without the quotes), as libraries quote a value they refuse."""
    out: set[str] = set()
    for name in SECRET_ENV:
        value = env.get(name, "")
        for form in (value, value.strip()):
            if len(form) >= MIN_SECRET_CHARS:
                out.update((form, repr(form)[1:-1], repr(form.encode("utf-8", "replace"))[2:-1]))
    return sorted(out, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted (``redact_url``) and every value of ``secrets``
    (at least ``MIN_SECRET_CHARS`` long) replaced by ``***``."""
    out = _URL.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_CHARS:
            out = out.replace(secret, MASK)
    return out
