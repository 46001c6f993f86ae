"""Redaction: no credential reaches a log line, the termination message or the report file.

A URL's userinfo (``https://user:password@host``) and query string (a presigned URL's signature)
are replaced by ``***``; so is any known secret value (the credential environment variables) found
in a message that a library wrote (an exception may quote a URL or a header).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from kubeinfer.contract import sources

#: What replaces a redacted part.
MASK = "***"
#: Secret values shorter than this are not searched for (they would mask ordinary words).
MIN_SECRET_CHARS = 4

#: A URL in a text, without a trailing punctuation mark (``https://h/x?q=1: 404`` stops before ``:``).
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)\]]")


def redact_url(url: str) -> str:
    """``url`` without its userinfo and query (each replaced by ``***``) and without a fragment.

    Done on the text, not through a URL parser: a password with an unencoded ``/``, ``?`` or ``#``
    makes a parser read part of it as the host or port, and then nothing would be masked. For http(s)
    everything before the last ``@`` ahead of the query is userinfo (a path with an ``@`` loses a part
    to the mask: a message is over-redacted, never under); other schemes (``hf://org/repo@rev``,
    ``s3://``) have no userinfo. A string without ``scheme://`` is returned unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    ends = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    cut = min(ends) if ends else len(rest)
    head, tail = rest[:cut], rest[cut:]
    if scheme.lower() in ("http", "https"):
        if "@" in head:
            head = f"{MASK}@{head.rpartition('@')[2]}"
        authority = head.partition("/")[0]
        port = authority.rpartition(":")[2] if ":" in authority and not authority.endswith("]") else ""
        if port and not port.isdigit():  # "user:pass" cut short by a '/', '?' or '#' in the password
            head = MASK + head[len(authority) :]
    query = f"?{MASK}" if tail.startswith("?") and len(tail.partition("#")[0]) > 1 else ""
    return f"{scheme}://{head}{query}"


def secret_env() -> tuple[str, ...]:
    """The environment variables whose values are credentials (``kubeinfer-runtime fetch`` reads them):
    every scheme's credential variables in the registry of source schemes, as it is now."""
    return sources.credential_env_names()


def strip_credentials(env: dict[str, str] | os._Environ[str]) -> None:
    """Strip the whitespace around every :func:`secret_env` value in ``env``, in place.

    A Secret made from a file usually ends in a newline (``kubectl create secret --from-file``);
    sent as is, an HTTP client refuses the header and quotes the value in its error
    (``Illegal header value b'Bearer ...\\n'``), where the plain value is not found to be masked.
    """
    for name in secret_env():
        value = env.get(name)
        if value is not None and value != value.strip():
            env[name] = value.strip()


def credentials_stripped(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the :func:`secret_env` values stripped (:func:`strip_credentials`)."""
    out = dict(env)
    strip_credentials(out)
    return out


def secrets_from(env: Mapping[str, str]) -> list[str]:
    """The values of :func:`secret_env` set in ``env`` (at least ``MIN_SECRET_CHARS`` long), each also as
    stripped of surrounding whitespace and in its escaped forms (``repr`` of the str and of its
    UTF-8 bytes, without the quotes), as libraries quote a value they refuse."""
    out: set[str] = set()
    for name in secret_env():
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
