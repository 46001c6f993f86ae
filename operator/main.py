"""``kubeinfer-operator``: run the kopf operator (settings from ``KUBEINFER_*`` env and CLI flags)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

from kubeinfer.operator.settings import Settings


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def _configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # urllib3 (under the Prometheus client) logs each retry of a failed request at WARNING, for every
    # service on every tick, with the URL-encoded query; the autoscaler logs an outage once per
    # service instead, and the full error at DEBUG (kubeinfer.operator.autoscale.signals). A filter,
    # not a level: kubernetes_asyncio's Configuration() sets the "urllib3" logger's level itself.
    logging.getLogger("urllib3.connectionpool").addFilter(_errors_only)
    if root.level > logging.DEBUG:  # kopf logs every handler run at INFO: keep only its warnings
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        # kopf's health endpoint is aiohttp's: one access line per kubelet probe (two every 2 s) would
        # bury the operator's own lines.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Read the settings once (environment, then flags), register the handlers with them, run kopf.

    The settings reach the handlers as arguments (:func:`handlers.register`) and through kopf's memo
    (the startup handler creates the controllers from them). Returns 0 when kopf stops.
    """
    settings = Settings.from_args(argv)
    if settings.kubeconfig:  # kopf's own login reads the kubeconfig from the environment
        os.environ["KUBECONFIG"] = settings.kubeconfig
    _configure_logging(settings)

    import kopf
    from kubeinfer.operator import handlers, metrics

    registry = handlers.register(settings)
    metrics.serve(settings.metrics_port, settings.bind_address)
    # The chart's liveness and readiness probes both GET this endpoint: kopf serves it only once the
    # startup handler ran (API client connected, peering object present). No @kopf.on.probe adds a
    # check to it: one that failed while the API server is unreachable would fail liveness too, and
    # restart an operator whose watches recover by themselves.
    liveness = (
        f"http://{settings.bind_address}:{settings.health_port}/healthz" if settings.health_port else None
    )
    kopf.run(
        registry=registry,
        memo=kopf.Memo({handlers.SETTINGS_MEMO_KEY: settings}),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        priority=settings.peering_priority,
        liveness_endpoint=liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
