"""``kubeinfer-runtime``: the runtime's command line.

``kubeinfer-runtime serve [--config PATH] [--model SRC] [--quantization Q] [--max-batch-size N]
[--max-queue-delay SECONDS] [--port P] [--grpc-port P] [--host H] [--device auto|cpu|cuda] [--executors N]
[--http-workers N]``

Flags override the file (also on every hot reload of the file's ``batching`` section). Without a model
source the bundled all-MiniLM-L6-v2 is served. The process listens at once (``/v2/health/live`` is 200,
``/v2/health/ready`` 503), loads and warms up the model in a thread, then turns ready. It logs
``listening on http://HOST:PORT`` (the real port, also with ``--port 0``), ``grpc listening on HOST:PORT``
(the Open Inference Protocol's gRPC service, ``kubeinfer.runtime.grpc_server``) and ``ready``.

SIGTERM/SIGINT: readiness turns false; after ``server.shutdown_delay_seconds`` (default 0; set it to a few
seconds in a cluster so that endpoints stop routing here before requests are refused) new infer requests
get 503, queued and running requests finish (at most ``server.drain_timeout_seconds``), then the HTTP
server closes and the process exits 0. A second signal exits at once.

``--http-workers N`` (``server.http_workers``) > 1: N HTTP front-end processes share the port
(``SO_REUSEPORT``; ``kubeinfer.runtime.frontend``) and hand decoded tensors to this process, which keeps
the model, the batcher, gRPC and the config watcher, restarts a front end that dies, and on SIGTERM
drains first, then stops the front ends (``kubeinfer.runtime.frontend_pool``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import DEFAULT_CONFIG_PATH, RuntimeConfig
from kubeinfer.runtime.rest import event_loop_factory
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
    serve.add_argument("--executors", type=int, help="executor threads (model instances)")
    serve.add_argument(
        "--http-workers",
        type=int,
        help="HTTP front-end processes in front of the model process (server.http_workers; 1 = one process)",
    )
    serve.add_argument("--log-level", default=os.environ.get("KUBEINFER_LOG_LEVEL", "INFO"))
    return parser


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
    "executors": (None, "executors"),
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


def load_config(args: argparse.Namespace) -> RuntimeConfig:
    """The file (or the defaults without ``--config``) with the flags applied."""
    base = RuntimeConfig.load(args.config) if args.config else RuntimeConfig()
    return overrides_from(args)(base)


async def serve(cfg: RuntimeConfig, args: argparse.Namespace) -> int:
    """Run the server (``RuntimeServer.start``) until a signal; returns the exit status."""
    server = RuntimeServer(cfg, config_path=args.config, overrides=overrides_from(args))
    await server.start()
    return await server.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
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
