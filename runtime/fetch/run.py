"""``fetch(uri, dest, options) -> FetchReport``: one model source into one local directory.

The steps: parse the URI (``source.parse_source``); refuse the sources that are not fetched
(``default``, a path, a mounted scheme: ``pvc://``, ``oci://``); create the destination; when its
report names the same source the model is there already (an init container run again in the same
pod) and nothing is downloaded; remove what an interrupted attempt left; run the scheme's backend
(its row's in the registry of source schemes, ``kubeinfer.contract.sources``: ``http``, ``s3``,
``hf``, imported only when used); write the report (``report.write_report``) last; print the final
progress line and ``fetch: done: ...``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO, cast

from kubeinfer.runtime.fetch.context import Context, Fetched, FetchOptions
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import SizeBudget, check_sha256, remove_leftovers
from kubeinfer.runtime.fetch.progress import Progress, megabytes
from kubeinfer.runtime.fetch.redact import credentials_stripped, redact_url, secrets_from
from kubeinfer.runtime.fetch.report import FetchReport, read_report, write_report
from kubeinfer.runtime.fetch.source import (
    BundledSource,
    LocalSource,
    Source,
    load,
    parse_source,
    row_of,
)

#: A scheme's backend (its row's ``backend``): downloads the parsed source into ``ctx.dest``.
Backend = Callable[[Any, Context], Fetched]
#: The options of one setting of a source (the row's ``settings``: spec.model.s3, spec.model.hf), with
#: their values: given for a scheme that does not take the setting, they are ignored.
_SETTING_OPTIONS: dict[str, Callable[[FetchOptions], tuple[tuple[str, object], ...]]] = {
    "s3": lambda o: (
        ("--s3-endpoint", o.s3_endpoint),
        ("--s3-region", o.s3_region),
        ("--s3-addressing-style", o.s3_addressing_style),
    ),
    "hf": lambda o: (("--hf-endpoint", o.hf_endpoint), ("--allow-pattern", o.allow_patterns)),
}


def not_fetched(source: Source) -> str | None:
    """Why ``source`` is not fetched (one line), or None when it is (its scheme's row is fetched).

    Raises:
        LookupError: ``source``'s scheme has no row in the registry any more (``source.row_of``).
    """
    if isinstance(source, BundledSource):
        return "'default' is the bundled model: nothing to fetch"
    if isinstance(source, LocalSource):
        return "a path in the image: nothing to fetch"
    row = row_of(source)
    return None if row.fetched else f"{row.mounted}: nothing to fetch"


def check_options(options: FetchOptions) -> FetchOptions:
    """``options`` with the sha256 lower-cased.

    Raises:
        ValueError: a sha256 that is not 64 hex digits, negative retries, a timeout that is not a
            positive finite number of seconds, a size limit that is not a positive number of bytes.
    """
    if options.retries < 0:
        raise ValueError(f"--retries must be 0 or more, got {options.retries}")
    for name, value in (
        ("--connect-timeout", options.connect_timeout),
        ("--stall-timeout", options.stall_timeout),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    if options.size_limit is not None and options.size_limit <= 0:
        raise ValueError(f"--size-limit must be a positive number of bytes, got {options.size_limit}")
    sha256 = check_sha256(options.sha256) if options.sha256 is not None else None
    return replace(options, sha256=sha256)


def _ignored_options(source: Source, options: FetchOptions) -> list[str]:
    """The options given that do not apply to ``source``'s scheme (of a setting its row does not take)."""
    takes = row_of(source).settings
    return [
        flag
        for setting, values in _SETTING_OPTIONS.items()
        if setting not in takes
        for flag, value in values(options)
        if value
    ]


def fetch(
    uri: str,
    dest: Path,
    options: FetchOptions,
    *,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FetchReport:
    """Fetch the model at ``uri`` into the directory ``dest`` (created when missing).

    ``env``: where the credentials are read (default ``os.environ``). ``stream``: where the
    progress lines go (default stderr). ``sleep``: the backoff's sleep (tests).

    Raises:
        ValueError: ``uri`` is not a model source (the message names ``model.source``), an
            option is out of range (``check_options``), or the ``--ca-file`` cannot be read or holds
            no certificate (``tls.ssl_context``).
        FetchError: the source is not fetched (``not_fetched``) or the fetch failed; its ``cause``
            is one line without the source and without a credential.
        OSError: the destination cannot be written.
    """
    environ = os.environ if env is None else env
    out = stream if stream is not None else sys.stderr
    label = redact_url(uri.strip())
    source = parse_source(uri)
    why = not_fetched(source)
    if why is not None:
        raise FetchError(why)
    options = check_options(options)
    if options.ca_file is not None:
        from kubeinfer.runtime.fetch.tls import ssl_context

        ssl_context(options.ca_file)  # a missing or bad file fails before any download

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    for flag in _ignored_options(source, options):
        log(f"fetch: {label}: {flag} does not apply to this source; ignored")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        previous = read_report(dest)
    except ValueError:
        previous = None
    if previous is not None and previous.source == label:
        size = megabytes(previous.bytes)
        log(f"fetch: {label}: already in {dest} ({previous.files} files, {size}): nothing to do")
        return previous
    remove_leftovers(dest)
    progress = Progress(label, stream=out)
    ctx = Context(
        label=label,
        dest=dest,
        options=options,
        env=credentials_stripped(environ),
        progress=progress,
        budget=SizeBudget(options.size_limit),
        log=log,
        secrets=secrets_from(environ),
        sleep=sleep,
    )
    log(f"fetch: {label} -> {dest}")
    fetched = _backend(source, ctx)
    report = FetchReport(
        source=label, files=fetched.files, bytes=fetched.bytes, seconds=round(progress.seconds, 3)
    )
    write_report(dest, report)
    progress.finish(fetched.files, fetched.bytes)
    return report


def _backend(source: Source, ctx: Context) -> Fetched:
    """Run the backend of ``source``'s scheme (its row's, imported on first use; ``not_fetched``
    refused a scheme without one)."""
    backend = cast(Backend, load(row_of(source).backend))
    return backend(source, ctx)
