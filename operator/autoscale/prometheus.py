"""The HTTP side of the autoscaler's signals: a Prometheus client (``prometheus-api-client``).

``PrometheusSignals.query`` runs one instant query (blocking: call it from a worker thread) and
``read`` turns the default queries' answers into a ``signals.Reading`` through the pure
``signals.read_signals``; ``history`` runs one range query (the arrival rate's recent past, which an
operator that restarted reads back for the burst headroom). ``PrometheusConfig`` says how to reach
Prometheus (the operator's ``KUBEINFER_PROMETHEUS_*`` settings). All the I/O of the autoscaler's
signals is here, so that ``signals`` (PromQL, parsing, value checks) stays pure (an import-linter
contract).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from kubeinfer.operator import conditions
from kubeinfer.operator.autoscale.signals import (
    Queries,
    Reading,
    SignalError,
    parse_history,
    read_signals,
)
from kubeinfer.operator.settings import Settings
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

logger = logging.getLogger(__name__)

__all__ = ["PrometheusConfig", "PrometheusSignals"]


@dataclass(frozen=True)
class PrometheusConfig:
    """How to reach Prometheus.

    Attributes:
        url: base URL, e.g. ``http://prometheus.monitoring:9090``.
        bearer_token_file: a file whose content is sent as ``Authorization: Bearer <token>`` (re-read on
            every client creation, so a rotated service-account token is picked up).
        ca_file: PEM bundle to verify the server's certificate; ``None`` = the system's.
        insecure_skip_verify: do not verify TLS certificates (testing only).
        timeout_seconds: per-query HTTP timeout, seconds.
    """

    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_seconds: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusConfig:
        """Build from the operator settings (env ``KUBEINFER_PROMETHEUS_*``, flags ``--prometheus-*``).

        Raises ``ValueError`` when ``prometheus_url`` is empty.
        """
        if not settings.prometheus_url:
            raise ValueError("operator settings: prometheus_url (KUBEINFER_PROMETHEUS_URL) is empty")
        return cls(
            url=settings.prometheus_url.rstrip("/"),
            bearer_token_file=settings.prometheus_bearer_token_file or None,
            ca_file=settings.prometheus_ca_file or None,
            insecure_skip_verify=settings.prometheus_insecure_skip_verify,
            timeout_seconds=settings.prometheus_timeout_seconds,
        )


class PrometheusSignals:
    """Reads signals from a real Prometheus through ``prometheus_api_client.PrometheusConnect``.

    Blocking (``requests``): call it from a worker thread in async code. One instance per
    ``PrometheusConfig``; it keeps an HTTP session.
    """

    def __init__(
        self, config: PrometheusConfig, session_factory: Callable[[], requests.Session] | None = None
    ):
        self.config = config
        session = (session_factory or requests.Session)()
        session.verify = False if config.insecure_skip_verify else (config.ca_file or True)
        headers: dict[str, str] = {}
        if config.bearer_token_file:
            token = Path(config.bearer_token_file).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        # The client raises one exception type for every non-200 answer, the status only in its text:
        # a response hook records the status of the last answer this thread received instead.
        self._last_status = threading.local()
        session.hooks["response"].append(self._record_status)
        self._client = PrometheusConnect(
            url=config.url,
            headers=headers or None,
            retry=Retry(total=1, backoff_factor=0, status_forcelist=(502, 503, 504)),
            session=session,
            timeout=config.timeout_seconds,
        )

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    def _record_status(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._last_status.code = response.status_code

    def query(self, promql: str) -> list[dict[str, Any]]:
        """One instant query. Raises ``SignalError`` (PrometheusUnavailable or QueryError)."""
        return self._call(promql, lambda: self._client.custom_query(promql))

    def history(
        self, promql: str, start: dt.datetime, end: dt.datetime, step_seconds: float
    ) -> list[tuple[float, float]]:
        """One range query: ``(unix seconds, value)`` every ``step_seconds`` from ``start`` to ``end``
        (timezone-aware; the client rounds both to whole seconds), oldest first, without NaN, infinite
        or negative values (``signals.parse_history``). Raises ``SignalError`` (PrometheusUnavailable
        or QueryError)."""
        step = f"{max(0.001, step_seconds):g}"
        result = self._call(promql, lambda: self._client.custom_query_range(promql, start, end, step))
        return parse_history(result, "history")

    def _call(self, promql: str, ask: Callable[[], Any]) -> list[dict[str, Any]]:
        """``ask()``'s result list; its failures as ``SignalError``."""
        self._last_status.code = None
        try:
            result = ask()
        except PrometheusApiClientException as exc:
            status = self._last_status.code
            # 4xx but 429: the query is at fault (bad PromQL, 422 execution error); else Prometheus is.
            reason = (
                conditions.QUERY_ERROR
                if isinstance(status, int) and 400 <= status < 500 and status != 429
                else conditions.PROMETHEUS_UNAVAILABLE
            )
            logger.debug("Prometheus answered HTTP %s for %s: %s", status, promql, exc)
            raise SignalError(reason, f"Prometheus answered HTTP {status}: {str(exc)[:200]}") from exc
        except (KeyError, TypeError) as exc:  # HTTP 200 without data.result (a proxy's page, say)
            logger.debug("Prometheus answered without data.result for %s: %s", promql, exc)
            raise SignalError(
                conditions.QUERY_ERROR, f"unexpected answer from {self.config.url}: no data.result"
            ) from exc
        except (requests.RequestException, ValueError) as exc:
            # the exception's text carries the URL-encoded query: DEBUG only, the condition gets its kind
            logger.debug("Prometheus unavailable at %s for %s: %s", self.config.url, promql, exc)
            raise SignalError(
                conditions.PROMETHEUS_UNAVAILABLE,
                f"Prometheus unavailable at {self.config.url} ({type(exc).__name__})",
            ) from exc
        if not isinstance(result, list):
            raise SignalError(conditions.QUERY_ERROR, f"unexpected answer to {promql}: {result!r}"[:300])
        return result

    def read(self, queries: Queries, stale_after_seconds: float) -> Reading:
        """``read_signals`` against this Prometheus."""
        return read_signals(self.query, queries, stale_after_seconds)
