"""``kubeinfer-runtime``: the runtime's command line.

``kubeinfer-runtime serve [--config PATH] [--model SRC] [--quantization Q] [--max-batch-size N]
[--max-queue-delay SECONDS] [--port P] [--grpc-port P] [--host H] [--device auto|cpu|cuda] [--instances N]
[--http-workers N]``

``kubeinfer-runtime fetch --source URI --dest DIR [--sha256 HEX] [--s3-endpoint URL] [--s3-region REGION]
[--s3-addressing-style path|virtual|auto] [--hf-endpoint URL] [--allow-pattern GLOB ...] [--allow-http]
[--ca-file PATH] [--size-limit BYTES] [--connect-timeout SECONDS] [--stall-timeout SECONDS] [--retries N]
[--termination-log PATH]``: the init container's step (``kubeinfer.runtime.fetch``): the model at URI
(s3, https, hf) into DIR; exit 0 with ``DIR/.kubeinfer-fetch.json`` and the termination message
``fetched N files, X MB in S s from URI``, or exit 1 with one line ``URI: cause`` there (never a
credential: URIs are redacted). ``docs/runtime.md`` has the options, the credentials' variables and
the messages.

Serve: flags override the file (also on every hot reload of the file's ``batching`` section). Without a model
source the bundled all-MiniLM-L6-v2 is served. The process listens at once (``/v2/health/live`` is 200,
``/v2/health/ready`` 503), loads and warms up the model in a thread, then turns ready. It logs
``listening on http://HOST:PORT`` (the real port, also with ``--port 0``), ``grpc listening on HOST:PORT``
(the Open Inference Protocol's gRPC service, ``kubeinfer.runtime.grpc_server``) and ``ready``.

SIGTERM/SIGINT: readiness turns false; after ``server.shutdown_delay_seconds`` (default 0; set it to a few
seconds in a cluster so that endpoints stop routing here before requests are refused) new infer requests
get 503, queued and running requests finish (at most ``server.drain_timeout_seconds``), then the HTTP
server closes and the process exits 0. A second signal exits at once.

``--model-repository DIR`` (``repository.path``; ``--memory-budget BYTES``, ``--pin MODEL``): serve every
model of DIR, each in its own process, loaded on its first request and evicted least recently used
under the budget, with Triton's model repository extension (``kubeinfer.runtime.repository``).

``--http-workers N`` (``server.http_workers``) > 1: N HTTP front-end processes share the port
(``SO_REUSEPORT``; ``kubeinfer.runtime.frontend``) and hand decoded tensors to this process, which keeps
the model, the batcher, gRPC and the config watcher, restarts a front end that dies, and on SIGTERM
drains first, then stops the front ends (``kubeinfer.runtime.frontend_pool``).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import DEFAULT_CONFIG_PATH, RuntimeConfig
from kubeinfer.runtime.fetch import FetchError, FetchOptions
from kubeinfer.runtime.fetch.context import DEFAULT_CONNECT_TIMEOUT, DEFAULT_RETRIES, DEFAULT_STALL_TIMEOUT
from kubeinfer.runtime.fetch.progress import megabytes
from kubeinfer.runtime.fetch.redact import redact_text, redact_url, secrets_from, strip_credentials
from kubeinfer.runtime.process import event_loop_factory, freeze_heap, raise_open_files_limit
from kubeinfer.runtime.server import RuntimeServer
from kubeinfer.runtime.termination import write_termination_message

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal also reaches the termination log: without the arguments,
    which may carry values expanded from Secrets (``$(VAR)`` in a container's args)."""

    def error(self, message: str) -> NoReturn:
        write_termination_message(
            f"{self.prog}: invalid command-line arguments (the container log says which; "
            "they are not repeated here)"
        )
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``serve`` sub-command)."""
    parser = _Parser(prog="kubeinfer-runtime", description="kubeinfer's batching model server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the Open Inference Protocol (KServe v2)")
    serve.add_argument(
        "--config",
        help=f"runtime.yaml (RuntimeConfig); watched for batching changes (in a pod: {DEFAULT_CONFIG_PATH})",
    )
    serve.add_argument("--model", help="model source: 'default' (bundled MiniLM), a directory or a file")
    serve.add_argument("--quantization", choices=["none", "fp16", "bf16", "int8-dynamic", "int8-static"])
    serve.add_argument("--max-batch-size", type=int, help="rows per batch")
    serve.add_argument("--max-queue-delay", type=float, help="seconds the oldest request may wait")
    serve.add_argument("--port", type=int, help="TCP port (0 = any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (0 = any free port); default 8081")
    serve.add_argument("--host", help="bind address")
    serve.add_argument("--device", choices=["auto", "cpu", "cuda"])
    serve.add_argument(
        "--instances",
        type=int,
        help="model instances (instances; Triton's instance_group count): executor threads on one queue",
    )
    # the former name of --instances, still read (an InferenceService's spec.runtime.args may carry it)
    serve.add_argument("--executors", type=int, help=argparse.SUPPRESS)
    serve.add_argument(
        "--http-workers",
        type=int,
        help="HTTP front-end processes in front of the model process (server.http_workers; 1 = one process)",
    )
    serve.add_argument(
        "--model-repository",
        metavar="DIR",
        help="serve every model of DIR (DIR/<model>/runtime.yaml or DIR/<model>.yaml), loaded on demand "
        "(repository.path)",
    )
    serve.add_argument(
        "--memory-budget",
        type=parse_size,
        metavar="BYTES",
        help="resident bytes the loaded models may take (repository.memory_budget_bytes; 8Gi, 500M)",
    )
    serve.add_argument(
        "--pin", action="append", metavar="MODEL", help="a model loaded at start, never evicted (repeatable)"
    )
    serve.add_argument("--log-level", default=os.environ.get("KUBEINFER_LOG_LEVEL", "INFO"))
    add_fetch_parser(sub)
    model_process = sub.add_parser(
        "model-process",
        help="one model of the model repository mode (started by the runtime, its configuration on stdin)",
    )
    model_process.add_argument("--ipc", required=True, help="the ZeroMQ address to serve the model at")
    model_process.add_argument("--parent-pid", type=int, help="exit when this process (the runtime) exits")
    model_process.add_argument("--log-level", default=os.environ.get("KUBEINFER_LOG_LEVEL", "INFO"))
    return parser


#: Multipliers of the suffixes ``--size-limit`` accepts (Kubernetes quantities: 10Gi, 500M).
_SIZE_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def parse_size(text: str) -> int:
    """Bytes from ``12345`` or a Kubernetes quantity (``10Gi``, ``500M``). Raises ``ValueError``
    (argparse's ``invalid parse_size value``) otherwise."""
    value = text.strip()
    number = value.rstrip("kKMGTi")
    suffix = value[len(number) :]
    if suffix not in _SIZE_SUFFIXES or not number.isdigit():
        raise ValueError(text)
    return int(number) * _SIZE_SUFFIXES[suffix]


def add_fetch_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """The ``fetch`` sub-command's options (the operator's init-container arguments)."""
    fetch = sub.add_parser(
        "fetch",
        help="fetch a model (s3://, https://, hf://) into a directory (the init container)",
        description="Download the model at --source into --dest; see docs/runtime.md.",
    )
    fetch.add_argument(
        "--source", required=True, help="s3://bucket/key-or-prefix, https://host/path, hf://org/repo[@rev]"
    )
    fetch.add_argument("--dest", required=True, help="the directory to fill (created when missing)")
    fetch.add_argument("--sha256", help="expected sha256 (hex) of the single file or archive")
    fetch.add_argument("--s3-endpoint", help="S3 endpoint URL (MinIO, another S3-compatible store)")
    fetch.add_argument("--s3-region", help="S3 region")
    fetch.add_argument(
        "--s3-addressing-style", choices=["path", "virtual", "auto"], help="S3 addressing style"
    )
    fetch.add_argument(
        "--hf-endpoint", help="Hugging Face Hub endpoint (a mirror); default HF_ENDPOINT or huggingface.co"
    )
    fetch.add_argument(
        "--allow-pattern",
        action="append",
        default=[],
        metavar="GLOB",
        help="hf:// only: download only the files matching a pattern (repeatable)",
    )
    fetch.add_argument("--allow-http", action="store_true", help="allow plain http:// (no TLS)")
    fetch.add_argument(
        "--ca-file",
        metavar="PATH",
        help="PEM file of CA certificates trusted besides the public ones (a private CA)",
    )
    fetch.add_argument(
        "--size-limit",
        type=parse_size,
        metavar="BYTES",
        help="refuse a source bigger than this (bytes, or a quantity: 10Gi); the emptyDir's sizeLimit",
    )
    fetch.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SECONDS",
        help="default %(default)s",
    )
    fetch.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULT_STALL_TIMEOUT,
        metavar="SECONDS",
        help="no byte for that long fails the attempt (default %(default)s)",
    )
    fetch.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help="further attempts after a transient failure, 1 s, 2 s, 4 s ... apart (default %(default)s)",
    )
    fetch.add_argument(
        "--termination-log",
        metavar="PATH",
        help="where the one-line result goes (default $KUBEINFER_TERMINATION_LOG or /dev/termination-log, "
        "when it exists)",
    )


def fetch_options(args: argparse.Namespace) -> FetchOptions:
    """The ``FetchOptions`` of parsed ``fetch`` arguments."""
    return FetchOptions(
        sha256=args.sha256,
        s3_endpoint=args.s3_endpoint,
        s3_region=args.s3_region,
        s3_addressing_style=args.s3_addressing_style,
        hf_endpoint=args.hf_endpoint,
        allow_patterns=tuple(args.allow_pattern),
        allow_http=args.allow_http,
        ca_file=args.ca_file,
        size_limit=args.size_limit,
        connect_timeout=args.connect_timeout,
        stall_timeout=args.stall_timeout,
        retries=args.retries,
    )


class _RedactingFormatter(logging.Formatter):
    """Log lines without URLs' credentials and without the credential values of the environment."""

    def __init__(self, fmt: str, secrets: list[str]) -> None:
        super().__init__(fmt)
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record), self._secrets)


def run_fetch(args: argparse.Namespace) -> int:
    """``kubeinfer-runtime fetch``: exit 0 (the model is in ``--dest``) or 1 (one line in the
    termination log and on stderr: ``URI: cause``)."""
    from kubeinfer.runtime.fetch.run import fetch  # the fetch's steps; its backends load their libraries

    secrets = secrets_from(os.environ)  # before stripping: the values as the Secret holds them, too
    strip_credentials(os.environ)  # what every backend and library then reads
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    label = redact_url(args.source.strip())
    try:
        report = fetch(args.source, Path(args.dest), fetch_options(args))
    except ValueError as exc:  # the URI or an option (the message names which)
        return _fetch_failed(str(exc), args.termination_log, secrets)
    except FetchError as exc:
        return _fetch_failed(f"{label}: {exc.cause}", args.termination_log, secrets)
    except OSError as exc:
        return _fetch_failed(
            f"{label}: cannot write {args.dest}: {exc.strerror or exc}", args.termination_log, secrets
        )
    except Exception as exc:  # a defect: still one line that says so, the traceback in the log
        logging.getLogger(__name__).exception("fetch failed unexpectedly")
        return _fetch_failed(
            f"{label}: internal error: {type(exc).__name__}: {exc}", args.termination_log, secrets
        )
    write_termination_message(
        f"fetched {report.files} {'file' if report.files == 1 else 'files'}, {megabytes(report.bytes)} "
        f"in {report.seconds:.1f} s from {report.source}",
        args.termination_log,
    )
    return 0


def _fetch_failed(message: str, termination_log: str | None, secrets: list[str]) -> int:
    """Report a failed fetch on stderr and in the termination log, redacted; returns 1."""
    line = redact_text(message, secrets)
    print(f"fetch: failed: {line}", file=sys.stderr, flush=True)
    write_termination_message(line, termination_log)
    return 1


#: Command-line flag (argparse attribute) -> the config field it overrides: (section, key); section
#: None for a top-level field. A new flag that overrides the file gets a row here.
FLAG_FIELDS: dict[str, tuple[str | None, str]] = {
    "model": ("model", "source"),
    "quantization": ("quantization", "mode"),
    "max_batch_size": ("batching", "max_batch_size"),
    "max_queue_delay": ("batching", "max_queue_delay_seconds"),
    "port": ("server", "port"),
    "grpc_port": ("server", "grpc_port"),
    "host": ("server", "host"),
    "device": (None, "device"),
    "instances": (None, "instances"),
    "http_workers": ("server", "http_workers"),
}


def overrides_from(args: argparse.Namespace) -> Callable[[RuntimeConfig], RuntimeConfig]:
    """A function applying the command-line flags (``FLAG_FIELDS``) to a config (validated again: bad
    values raise ``pydantic.ValidationError`` naming the field)."""

    def apply(cfg: RuntimeConfig) -> RuntimeConfig:
        data = cfg.model_dump()
        for flag, (section, key) in FLAG_FIELDS.items():
            value = getattr(args, flag)
            if value is not None:
                (data if section is None else data[section])[key] = value
        return RuntimeConfig.model_validate(data)

    return apply


#: A flag's former name (argparse attribute) -> its name now: the former is still read, with a warning.
RENAMED_FLAGS: dict[str, str] = {"executors": "instances"}


#: Command-line flag -> the ``repository`` field it overrides (``--model-repository`` creates the section).
REPOSITORY_FLAGS: dict[str, str] = {
    "model_repository": "path",
    "memory_budget": "memory_budget_bytes",
    "pin": "pinned",
}


def load_config(args: argparse.Namespace) -> RuntimeConfig:
    """The file (or the defaults without ``--config``) with the flags applied. A flag of
    :data:`RENAMED_FLAGS` is logged once as deprecated and set in ``args`` under its new name (unless
    that is given too), so the overrides of every reload apply it."""
    for old, new in RENAMED_FLAGS.items():
        value = getattr(args, old)
        if value is not None:
            log.warning("--%s is deprecated: it is now --%s", old.replace("_", "-"), new)
            if getattr(args, new) is None:
                setattr(args, new, value)
    base = RuntimeConfig.load(args.config) if args.config else RuntimeConfig()
    cfg = overrides_from(args)(base)
    changes = {key: getattr(args, flag) for flag, key in REPOSITORY_FLAGS.items() if getattr(args, flag)}
    if not changes:
        return cfg
    data = cfg.model_dump()
    data["repository"] = {**(data["repository"] or {}), **changes}
    return RuntimeConfig.model_validate(data)


async def serve(cfg: RuntimeConfig, args: argparse.Namespace) -> int:
    """Run the server (``RuntimeServer.start``, or ``RepositoryServer`` with a ``repository`` section)
    until a signal; returns the exit status (2: the model repository cannot be served)."""
    if cfg.repository is not None:
        # imported here: the repository serves HTTP and gRPC itself, and its model processes (this
        # module's ``model-process``) import neither
        from kubeinfer.runtime.repository import RepositoryServer

        repository = RepositoryServer(cfg)
        try:
            await repository.start()
        except ValueError as exc:
            log.error("%s", exc)
            write_termination_message(str(exc))
            return 2
        # this process serves every model's HTTP and gRPC: its start's objects leave full collections
        log.info("%d objects of the started server frozen out of garbage collection", freeze_heap())
        return await repository.wait()
    server = RuntimeServer(
        cfg, config_path=args.config, overrides=overrides_from(args), freeze_after_load=True
    )
    await server.start()
    return await server.wait()


async def serve_model_process(cfg: RuntimeConfig, address: str) -> int:
    """One model of the model repository mode: load it and serve it at ``address`` only (no port)."""
    server = RuntimeServer(cfg, ipc_address=address, freeze_after_load=True)
    await server.start()
    return await server.wait()


_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent exits (Linux ``PR_SET_PDEATHSIG``); exits at once when the
    parent ``parent_pid`` is already gone (it died before the call). Nothing elsewhere."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        sys.exit(1)


def run_model_process(args: argparse.Namespace) -> int:
    """``kubeinfer-runtime model-process``: the configuration (JSON) on stdin; returns the exit status
    (1: the model failed to load, its cause in the termination log)."""
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    try:
        cfg = RuntimeConfig.model_validate_json(sys.stdin.buffer.read())
    except ValueError as exc:
        write_termination_message(f"invalid configuration: {exc}")
        return 2
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve_model_process(cfg, args.ipc))


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    args = build_parser().parse_args(argv)
    if args.command == "fetch":  # a download: none of serve's logging and offline settings
        return run_fetch(args)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise_open_files_limit()  # before the first socket: a container's soft limit is often 1024
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.command == "model-process":
        return run_model_process(args)
    try:
        cfg = load_config(args)
        BearerAuth.from_config(cfg)  # refuse to start open when authentication was asked for
    except Exception as exc:
        log.error("invalid configuration: %s", exc)
        write_termination_message(f"invalid configuration: {exc}")
        return 2
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(cfg, args))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


if __name__ == "__main__":
    sys.exit(main())
