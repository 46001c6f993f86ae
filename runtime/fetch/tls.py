"""The CAs a fetch trusts, and a certificate failure as one line.

Without ``--ca-file`` every backend trusts the image's public CAs as its library does (httpx and
huggingface_hub: certifi, or ``SSL_CERT_FILE``; boto3: its own bundle, or ``AWS_CA_BUNDLE``). With
``--ca-file PATH`` (a PEM file of one or more CA certificates: a private CA) it trusts that file *in
addition to* the public CAs, so that a redirect to a public host (a presigned object-store URL) still
verifies: httpx and huggingface_hub get an ``ssl.SSLContext`` (:func:`ssl_context`), boto3, which takes
only a file, the public bundle and ``PATH`` concatenated into a temporary file
(:func:`combined_bundle`).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import certifi
from kubeinfer.runtime.fetch.errors import FetchError

#: What the refusal of an untrusted certificate tells to do.
HINT = "a private CA needs --ca-file (spec.model.caBundle)"


def ssl_context(ca_file: str) -> ssl.SSLContext:
    """A client context trusting certifi's public CAs and the CAs in ``ca_file`` (PEM).

    Raises:
        ValueError: ``ca_file`` cannot be read or holds no CA certificate (the message names
            ``--ca-file`` and the path).
    """
    ctx = ssl.create_default_context(cafile=certifi.where())
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise ValueError(f"--ca-file {ca_file}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise ValueError(f"--ca-file {ca_file}: not a PEM file of CA certificates ({why})") from None
    return ctx


@contextlib.contextmanager
def combined_bundle(ca_file: str) -> Iterator[str]:
    """The path of a temporary PEM file holding certifi's public CAs and then ``ca_file``, removed
    after the block (for a client that takes one CA file, as botocore's ``verify``)."""
    fd, path = tempfile.mkstemp(prefix="kubeinfer-fetch-ca-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(Path(certifi.where()).read_bytes())
            out.write(b"\n")
            out.write(Path(ca_file).read_bytes())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def certificate_error(exc: BaseException) -> FetchError | None:
    """A failed certificate verification in ``exc`` (or the exceptions it was raised from) as a
    permanent ``FetchError`` (another attempt meets the same certificate); None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            detail = current.verify_message or current.reason or "certificate verify failed"
            return FetchError(f"TLS certificate not trusted (CERTIFICATE_VERIFY_FAILED: {detail}): {HINT}")
        if "CERTIFICATE_VERIFY_FAILED" in str(current):
            detail = str(current).split("CERTIFICATE_VERIFY_FAILED", 1)[1]
            detail = detail.split("(_ssl.c", 1)[0].strip(" ]:")
            detail = detail.removeprefix("certificate verify failed:").strip() or "certificate verify failed"
            return FetchError(f"TLS certificate not trusted (CERTIFICATE_VERIFY_FAILED: {detail}): {HINT}")
        current = current.__cause__ or current.__context__
    return None
