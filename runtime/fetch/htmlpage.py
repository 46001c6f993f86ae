"""Telling an HTML page from a model's file: a login page behind an expired token, a portal or a wrong
URL that lands on a web page is answered with 200 and would "fetch" fine, then fail to load with a
parser's error that never says HTML. The fetch refuses it instead, with ``errors.HTML_PAGE_CAUSE``.

Every file a fetch writes is checked (a model's weights as its ``config.json`` or tokenizer: an HTML
page is none of them, and one rule for all is simpler to reason about), except a file whose own name
says it is HTML (``*.html``, ``*.htm``, ``*.xhtml``: a page stored beside a model in a bucket or a
repository). A file is HTML when the server says so (``Content-Type: text/html`` or
``application/xhtml+xml``; ``http`` and ``s3``) or when its first bytes, after an optional byte order
mark and whitespace, are ``<!doctype html`` or ``<html`` in any case (every backend). Archive members
are not checked (a login page is never inside an archive; the archive itself is).

Pure: no I/O but ``check_file``'s read of a file's first bytes.
"""

from __future__ import annotations

from pathlib import Path

from kubeinfer.runtime.fetch.errors import HTML_PAGE_CAUSE, FetchError

#: Bytes of a file's beginning enough to decide (a BOM, leading whitespace, then the tag).
HEAD_BYTES = 1024
#: Media types of an HTML page.
HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})
#: File name endings of a file meant to be HTML: never refused.
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
_STARTS = (b"<!doctype html", b"<html")
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = {b"\xff\xfe": "utf-16-le", b"\xfe\xff": "utf-16-be"}
_WHITESPACE = b" \t\r\n\f\v"


def may_be_html(name: str) -> bool:
    """Whether the file ``name`` (a file name or path) is meant to be HTML (``HTML_SUFFIXES``, any
    case): such a file is not checked."""
    return name.lower().endswith(HTML_SUFFIXES)


def is_html_content_type(value: str | None) -> bool:
    """Whether a ``Content-Type`` header's value (``text/html; charset=utf-8``; None: no header) names
    an HTML page. Parameters and case are ignored."""
    if not value:
        return False
    return value.split(";", 1)[0].strip().lower() in HTML_MEDIA_TYPES


def looks_like_html(head: bytes) -> bool:
    """Whether a file beginning with ``head`` (its first bytes; ``HEAD_BYTES`` are enough) is an HTML
    page: after an optional UTF-8 or UTF-16 byte order mark and ASCII whitespace, ``<!doctype html``
    or ``<html``, in any case."""
    if head.startswith(_UTF8_BOM):
        head = head[len(_UTF8_BOM) :]
    elif head[:2] in _UTF16_BOMS:
        head = head[2:].decode(_UTF16_BOMS[head[:2]], errors="replace").encode("ascii", errors="replace")
    start = head.lstrip(_WHITESPACE)[: len(_STARTS[0])].lower()
    return start.startswith(_STARTS)


def check_content_type(name: str, content_type: str | None) -> None:
    """Refuse an answer for the file ``name`` whose ``Content-Type`` is HTML (unless ``may_be_html``).

    Raises:
        FetchError: (permanent) ``errors.HTML_PAGE_CAUSE``.
    """
    if is_html_content_type(content_type) and not may_be_html(name):
        raise FetchError(HTML_PAGE_CAUSE)


def check_head(name: str, head: bytes) -> None:
    """Refuse the file ``name`` beginning with ``head`` when it is an HTML page (unless
    ``may_be_html``).

    Raises:
        FetchError: (permanent) ``errors.HTML_PAGE_CAUSE``.
    """
    if looks_like_html(head) and not may_be_html(name):
        raise FetchError(HTML_PAGE_CAUSE)


def check_file(path: Path) -> None:
    """Refuse the file at ``path`` (written by a library, not through ``files.Sink``) when it is an
    HTML page: it is deleted first.

    Raises:
        FetchError: (permanent) ``errors.HTML_PAGE_CAUSE``.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    try:
        check_head(path.name, head)
    except FetchError:
        path.unlink(missing_ok=True)
        raise
