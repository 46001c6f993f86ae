"""``hf://org/repo[@revision]`` sources: ``huggingface_hub.snapshot_download`` into the destination.

First a dry run (``snapshot_download(..., dry_run=True)``): it resolves the revision to a commit,
lists the files the allow patterns (``--allow-pattern``) select with their sizes, and fails early
on a missing repository or revision; the total is checked against ``--size-limit`` before any
download. Then the snapshot of that commit is downloaded with ``local_dir`` = the destination, the
Hub endpoint ``--hf-endpoint`` (a mirror; default ``HF_ENDPOINT`` or huggingface.co) and the token
``HF_TOKEN``. The Hub's cache and its ``.cache/huggingface`` metadata live in the destination
while it runs and are removed at the end. Each file downloaded is then checked for an HTML page
(``htmlpage.check_file``: a proxy's login page where a file was asked for), and refused.

huggingface_hub itself resumes an interrupted file download a few times; ``--stall-timeout`` is
its read timeout (``HF_HUB_DOWNLOAD_TIMEOUT``), and the fetch retries transient failures on top.
``--ca-file``: the Hub's shared HTTP client is made with ``verify`` = a context trusting the public CAs
and that file (``huggingface_hub.set_client_factory``, restored afterwards); an untrusted certificate
fails at once, naming the option. (A file the Hub stores on Xet is downloaded by ``hf_xet``, which does
not use that client; a mirror or a private hub without Xet storage is served through it entirely.)
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kubeinfer.runtime.fetch.context import Context, Fetched
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import SCRATCH_PREFIX
from kubeinfer.runtime.fetch.htmlpage import check_file
from kubeinfer.runtime.fetch.retry import transient_status
from kubeinfer.runtime.fetch.source import HfSource
from kubeinfer.runtime.fetch.tls import certificate_error

T = TypeVar("T")
#: The scratch cache directory in the destination (removed at the end).
CACHE_DIR = f"{SCRATCH_PREFIX}hf-cache"
#: Seconds between two measurements of the bytes on disk (the progress of the Hub's downloads).
POLL_SECONDS = 1.0


def fetch_hf(source: HfSource, ctx: Context) -> Fetched:
    """Download the snapshot ``source`` names into ``ctx.dest`` (see the module docstring).

    Raises:
        FetchError: ``repository not found`` (missing, or private without the right ``HF_TOKEN``);
            ``gated repository``; ``revision not found``; ``file not found``; no file matching the
            allow patterns; ``<status> <reason>`` of the Hub; a stall, timeout or connection error
            (after the retries); a size over the limit; ``--sha256`` given (a repository is no file);
            a file downloaded that is an HTML page (``errors.HTML_PAGE_CAUSE``; the file is deleted).
    """
    from huggingface_hub import snapshot_download

    opts = ctx.options
    if opts.sha256:
        raise FetchError(
            "--sha256 names one file, and an hf:// source is a repository (the Hub checks each file)"
        )
    token: str | bool = ctx.env.get("HF_TOKEN") or False
    patterns = list(opts.allow_patterns) or None
    common: dict[str, Any] = {
        "repo_id": source.repo_id,
        "local_dir": ctx.dest,
        "cache_dir": ctx.dest / CACHE_DIR,
        "allow_patterns": patterns,
        "endpoint": opts.hf_endpoint or None,
        "token": token,
        "etag_timeout": opts.stall_timeout,
        "library_name": "kubeinfer-fetch",
    }
    has_token, stall = bool(token), opts.stall_timeout
    try:
        with _hub_settings(opts.stall_timeout, opts.ca_file):
            plan = ctx.retry(
                lambda: _call(
                    lambda: snapshot_download(revision=source.revision, dry_run=True, **common),
                    has_token,
                    stall,
                )
            )
            if not plan:
                what = f"--allow-pattern {', '.join(patterns)}" if patterns else "the repository"
                raise FetchError(f"no file to download: nothing matches {what}")
            total = sum(f.file_size or 0 for f in plan)
            ctx.budget.check_total(total)
            ctx.progress.set_total(total)
            commit = plan[0].commit_hash
            ctx.log(f"fetch: {ctx.label}: {len(plan)} file(s) at commit {commit}")
            with _measure(ctx):
                ctx.retry(
                    lambda: _call(lambda: snapshot_download(revision=commit, **common), has_token, stall)
                )
            for info in plan:
                check_file(ctx.dest / info.filename)
    finally:
        _remove_scratch(ctx.dest)
    return Fetched(files=len(plan), bytes=total)


@contextlib.contextmanager
def _hub_settings(stall_timeout: float, ca_file: str | None = None) -> Iterator[None]:
    """huggingface_hub's process-wide settings while fetching: online (the runtime sets
    ``HF_HUB_OFFLINE`` for serving; a fetch is a download), the stall timeout as its read timeout,
    no tqdm bars (the fetch prints its own progress), and with ``ca_file`` an HTTP client that trusts
    it besides the public CAs. Restored afterwards."""
    from huggingface_hub import constants, set_client_factory
    from huggingface_hub.utils.tqdm import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    saved = constants.HF_HUB_OFFLINE, constants.HF_HUB_DOWNLOAD_TIMEOUT
    bars_were_disabled = are_progress_bars_disabled()
    constants.HF_HUB_OFFLINE = False
    constants.HF_HUB_DOWNLOAD_TIMEOUT = max(1, math.ceil(stall_timeout))
    disable_progress_bars()
    if ca_file is not None:
        set_client_factory(_client_factory(ca_file))
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_DOWNLOAD_TIMEOUT = saved
        if not bars_were_disabled:
            enable_progress_bars()
        if ca_file is not None:
            from huggingface_hub.utils._http import default_client_factory

            set_client_factory(default_client_factory)


def _client_factory(ca_file: str) -> Callable[[], Any]:
    """huggingface_hub's default client factory, with ``verify`` trusting ``ca_file`` too."""
    import httpx2
    from huggingface_hub.utils._http import hf_request_event_hook
    from kubeinfer.runtime.fetch.tls import ssl_context

    context = ssl_context(ca_file)

    def factory() -> Any:
        return httpx2.Client(
            event_hooks={"request": [hf_request_event_hook]},
            follow_redirects=True,
            timeout=None,
            verify=context,
        )

    return factory


def _call(fn: Callable[[], T], has_token: bool, stall_timeout: float) -> T:
    try:
        return fn()
    except FetchError:
        raise
    except Exception as exc:
        raise hub_error(exc, has_token=has_token, stall_timeout=stall_timeout) from None


def hub_error(exc: BaseException, *, has_token: bool, stall_timeout: float) -> FetchError:
    """A huggingface_hub exception as a one-line ``FetchError`` (transient for connection errors,
    timeouts, 5xx and 429). Errors that wrap the Hub's answer (a dry run's, an incomplete
    snapshot's) are judged by that answer."""
    from huggingface_hub import errors

    answer = _hub_answer(exc, has_token=has_token)
    if answer is not None:
        return answer
    untrusted = certificate_error(exc)
    if untrusted is not None:
        return untrusted
    if isinstance(exc, (errors.DryRunError, errors.LocalEntryNotFoundError)):
        cause = exc.__cause__ or exc.__context__
        if cause is not None:
            return hub_error(cause, has_token=has_token, stall_timeout=stall_timeout)
        return FetchError("cannot reach the Hub", transient=True)
    names = {cls.__name__ for cls in type(exc).__mro__}  # httpx2's classes, without importing it
    if "ReadTimeout" in names:
        return FetchError(f"stalled: no data for {stall_timeout:g} s", transient=True)
    if "TimeoutException" in names or isinstance(exc, TimeoutError):
        return FetchError(f"timeout ({type(exc).__name__})", transient=True)
    if "TransportError" in names or isinstance(exc, ConnectionError):
        return FetchError(f"cannot reach the Hub ({type(exc).__name__}: {exc})", transient=True)
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return FetchError("a file arrived incomplete", transient=True)
    if isinstance(exc, ValueError):
        return FetchError(f"refused by huggingface_hub: {exc}")
    return FetchError(f"{type(exc).__name__}: {exc}")


def _hub_answer(exc: BaseException, *, has_token: bool) -> FetchError | None:
    """The Hub's HTTP answer in ``exc`` as a ``FetchError``; None when ``exc`` carries none."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return FetchError(
            "gated repository: accept its conditions on the Hub with the account whose HF_TOKEN is set"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        if has_token:
            return FetchError("repository not found, or HF_TOKEN has no access to it")
        return FetchError(
            "repository not found (a private repository needs HF_TOKEN: spec.model.credentials)"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return FetchError("revision not found")
    if isinstance(exc, errors.DisabledRepoError):
        return FetchError("repository disabled")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return FetchError(f"file not found in the repository ({_url_path(exc)})")
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        return FetchError(
            f"{status} {exc.response.reason_phrase}".strip(), transient=transient_status(status)
        )
    return None


def _url_path(exc: Any) -> str:
    try:
        return str(exc.response.request.url.path).rsplit("/resolve/", 1)[-1]
    except AttributeError:
        return "?"


@contextlib.contextmanager
def _measure(ctx: Context) -> Iterator[None]:
    """Count the bytes under the destination (the Hub's partial files included) every
    ``POLL_SECONDS`` into ``ctx.progress`` while the Hub downloads."""
    stop = threading.Event()
    baseline = _bytes_under(ctx.dest)

    def poll() -> None:
        while not stop.wait(POLL_SECONDS):
            ctx.progress.set(max(0, _bytes_under(ctx.dest) - baseline))

    thread = threading.Thread(target=poll, name="fetch-hf-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _bytes_under(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _remove_scratch(dest: Path) -> None:
    """Remove the Hub's cache and metadata from the destination (``.kubeinfer-hf-cache``,
    ``.cache/huggingface``) and the directories left empty (``.cache``, those a dry run made)."""
    shutil.rmtree(dest / CACHE_DIR, ignore_errors=True)
    shutil.rmtree(dest / ".cache" / "huggingface", ignore_errors=True)
    for dirpath, _dirs, _names in sorted(os.walk(dest), key=lambda w: -len(w[0])):  # deepest first
        if dirpath != str(dest):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)  # only an empty one: the dry run makes the files' directories
