"""Run a real Prometheus (Debian's ``/usr/bin/prometheus``) on a free loopback port.

Plain class, usable outside pytest (the demo uses it)::

    from hack.devtools.prom import PrometheusServer
    with PrometheusServer(Path("/tmp/prom"), scrape_interval=1.0) as prom:
        prom.set_targets([("127.0.0.1:8081", {"namespace": "demo", "inferenceservice": "minilm"})])
        prom.wait_for_scrape("127.0.0.1:8081")
        prom.query('up{inferenceservice="minilm"}')   # -> [{"metric": {...}, "value": [ts, "1"]}]

Fixture (``tests/conftest.py``): ``prometheus`` (function scope) yields a started
PrometheusServer with a 1 s scrape interval in the test's tmp dir; ``prometheus_factory`` is a
callable ``(scrape_interval=1.0, **kwargs) -> PrometheusServer`` (started) for other intervals.
Both stop their servers at test end.

Scrape configuration: one job (``kubeinfer``) whose targets come from ``file_sd_configs`` (a JSON
file that :meth:`PrometheusServer.set_targets` rewrites atomically), so targets and their labels
change without a restart. Each target carries the labels given, e.g. ``namespace`` and
``inferenceservice`` as the autoscaler's queries expect; Prometheus adds ``instance`` (the
``host:port``) and ``job``. ``metrics_path`` is ``/metrics``.

``scrape_configs`` adds jobs such as :func:`podmonitor_scrape_config`'s kubernetes_sd one: give those
``binary=NODE_PROMETHEUS_BIN`` (built by ``make setup``), since Debian's Prometheus is built without
kubernetes_sd and refuses such a job ("field kubernetes_sd_configs not found").

:meth:`stop` then :meth:`start` restarts on the same port with the same TSDB directory (the
autoscaler tests take Prometheus away and bring it back).

:meth:`PrometheusServer.backfill` writes past samples (:class:`Series`) into the TSDB as blocks, the way
an operator imports history (``promtool tsdb create-blocks-from openmetrics``, Debian's promtool), and
restarts the server so that it loads them: a test can give a service a past it did not live through.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from hack.procs import die_with_parent

PROMETHEUS_BIN = Path("/usr/bin/prometheus")
#: Debian's promtool (the same package), for :meth:`PrometheusServer.backfill`.
PROMTOOL_BIN = Path("/usr/bin/promtool")
#: Prometheus with kubernetes_sd for the one-node cluster, built by ``make setup`` (step 7).
NODE_PROMETHEUS_BIN = Path(__file__).resolve().parents[2] / ".cache" / "bin" / "prometheus"


class PrometheusError(RuntimeError):
    """Prometheus could not be started, or answered a query with an error (message says which)."""


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def prom_duration(seconds: float) -> str:
    """Render seconds as a Prometheus duration string in whole milliseconds: 1.0 -> "1000ms".

    Raises ValueError for a non-positive or sub-millisecond value.
    """
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be >= 1 ms, got {seconds!r} s")
    return f"{ms}ms"


def render_config(
    targets_file: Path,
    *,
    scrape_interval: float = 1.0,
    job_name: str = "kubeinfer",
    scrape_configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The prometheus.yml document: one file_sd job, scrape_timeout equal to the interval, followed
    by ``scrape_configs`` (e.g. :func:`podmonitor_scrape_config`)."""
    interval = prom_duration(scrape_interval)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": job_name,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            },
            *[dict(c) for c in scrape_configs],
        ],
    }


def _label_name(key: str) -> str:
    """A Kubernetes label key as kubernetes_sd spells it in meta labels (non [a-zA-Z0-9_] -> _)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def _monitor_scrape_config(
    monitor: Mapping[str, Any],
    *,
    kind: str,
    api_server: str,
    tls_config: Mapping[str, str],
    scrape_interval: float,
) -> dict[str, Any]:
    """The scrape job of a PodMonitor (``kind`` ``pod``) or a ServiceMonitor (``service``): see
    :func:`podmonitor_scrape_config` and :func:`servicemonitor_scrape_config`."""
    pod = kind == "pod"
    field = "podMetricsEndpoints" if pod else "endpoints"
    spec = monitor["spec"]
    endpoints = spec.get(field) or []
    if len(endpoints) != 1:
        raise ValueError(f"expected one {field} entry, got {len(endpoints)}")
    (ep,) = endpoints
    if set(spec.get("selector", {})) - {"matchLabels"}:
        raise ValueError("only selector.matchLabels is translated")
    relabel: list[dict[str, Any]] = []
    for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
        n = _label_name(key)
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_{kind}_label_{n}",
                    f"__meta_kubernetes_{kind}_labelpresent_{n}",
                ],
                "regex": f"({value});true",
            }
        )
    port_meta = "__meta_kubernetes_pod_container_port_name" if pod else "__meta_kubernetes_endpoint_port_name"
    relabel.append({"action": "keep", "source_labels": [port_meta], "regex": ep["port"]})
    relabel.append({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"})
    if not pod:
        relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"})
    relabel.append({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"})
    if pod:
        relabel.append(
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}
        )
    for r in ep.get("relabelings", []):
        relabel.append({"source_labels" if k == "sourceLabels" else _snake(k): v for k, v in r.items()})
    sd: dict[str, Any] = {
        "role": "pod" if pod else "endpoints",
        "api_server": api_server,
        "tls_config": dict(tls_config),
    }
    names = spec.get("namespaceSelector", {}).get("matchNames")
    if names:
        sd["namespaces"] = {"names": list(names)}
    interval = prom_duration(scrape_interval)
    meta = monitor["metadata"]
    job: dict[str, Any] = {
        "job_name": f"{'podMonitor' if pod else 'serviceMonitor'}/{meta.get('namespace', 'default')}/"
        f"{meta['name']}/0",
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": ep.get("path", "/metrics"),
    }
    if not pod:
        job["honor_labels"] = bool(ep.get("honorLabels", False))
    job["kubernetes_sd_configs"] = [sd]
    job["relabel_configs"] = relabel
    return job


def podmonitor_scrape_config(
    podmonitor: Mapping[str, Any],
    *,
    api_server: str,
    tls_config: Mapping[str, str],
    scrape_interval: float = 1.0,
) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for a ``monitoring.coreos.com/v1`` PodMonitor
    with one ``podMetricsEndpoints`` entry: kubernetes_sd (role pod) against ``api_server``, the
    PodMonitor's ``selector.matchLabels`` and endpoint ``port`` as keep rules, the operator's
    ``namespace``/``pod``/``container`` target labels, then the PodMonitor's own ``relabelings``.

    ``tls_config`` is Prometheus' (ca_file, cert_file, key_file). Intervals are overridden by
    ``scrape_interval`` (tests scrape every second). Raises ValueError on a PodMonitor without
    exactly one endpoint or with a selector other than matchLabels.
    """
    return _monitor_scrape_config(
        podmonitor, kind="pod", api_server=api_server, tls_config=tls_config, scrape_interval=scrape_interval
    )


def servicemonitor_scrape_config(
    servicemonitor: Mapping[str, Any],
    *,
    api_server: str,
    tls_config: Mapping[str, str],
    scrape_interval: float = 1.0,
) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for a ``monitoring.coreos.com/v1``
    ServiceMonitor with one ``endpoints`` entry: kubernetes_sd (role endpoints) against ``api_server``
    in the ``namespaceSelector.matchNames`` namespaces, the Service's ``selector.matchLabels`` and the
    endpoint's ``port`` as keep rules, the operator's ``namespace``/``service``/``pod`` target labels,
    its ``relabelings``, and ``honorLabels`` as ``honor_labels``.

    ``tls_config`` is Prometheus' (ca_file, cert_file, key_file). The interval is overridden by
    ``scrape_interval``. Raises ValueError on a ServiceMonitor without exactly one endpoint or with a
    selector other than matchLabels.
    """
    return _monitor_scrape_config(
        servicemonitor,
        kind="service",
        api_server=api_server,
        tls_config=tls_config,
        scrape_interval=scrape_interval,
    )


@dataclass(frozen=True)
class Series:
    """One series to backfill: metric ``name``, its ``labels`` and ``samples`` as ``(unix seconds, value)``
    pairs, oldest first."""

    name: str
    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value as OpenMetrics writes it (``NaN``, ``+Inf``, ``-Inf`` for the special ones)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def openmetrics_text(series: Iterable[Series]) -> str:
    """``series`` in the OpenMetrics text format with timestamps, as ``promtool tsdb
    create-blocks-from openmetrics`` reads it: one ``unknown``-typed family per metric name (a family's
    series together), timestamps in seconds with millisecond precision (the TSDB's), ``# EOF`` at the
    end.

    Raises ValueError naming the series when its timestamps are not finite or do not increase once
    rounded to milliseconds, or when two series have the same name and labels.
    """
    families: dict[str, list[Series]] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for one in series:
        what = f"series {one.name}{dict(one.labels)}"
        key = (one.name, tuple(sorted(one.labels.items())))
        if key in seen:
            raise ValueError(f"{what}: given twice")
        seen.add(key)
        if not all(math.isfinite(t) for t, _ in one.samples):
            raise ValueError(f"{what}: a timestamp is not finite")
        millis = [round(t * 1000) for t, _ in one.samples]
        if any(b <= a for a, b in itertools.pairwise(millis)):
            raise ValueError(f"{what}: timestamps must increase (by at least a millisecond)")
        families.setdefault(one.name, []).append(one)
    lines: list[str] = []
    for name, members in families.items():
        lines.append(f"# TYPE {name} unknown")
        for one in members:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(one.labels.items()))
            head = f"{name}{{{labels}}}" if labels else name
            lines.extend(f"{head} {_number(value)} {round(t * 1000) / 1000:.3f}" for t, value in one.samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def render_targets(targets: Iterable[tuple[str, Mapping[str, str]]]) -> list[dict[str, Any]]:
    """file_sd JSON content: one group per target ``("host:port", {label: value})``.

    Raises ValueError when a target is not ``host:port`` or a label value is not a string.
    """
    groups = []
    for addr, labels in targets:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"target must be 'host:port', got {addr!r}")
        for k, v in labels.items():
            if not isinstance(v, str):
                raise ValueError(f"label {k!r} of target {addr!r} must be a string, got {v!r}")
        groups.append({"targets": [addr], "labels": dict(labels)})
    return groups


class PrometheusServer:
    """A Prometheus process with a file_sd scrape job; see the module docstring.

    Args:
        workdir: holds prometheus.yml, targets.json, the TSDB (``data/``) and ``prometheus.log``.
        scrape_interval: seconds between scrapes (also the scrape timeout and rule evaluation).
        port: listen port on 127.0.0.1; default a free one (chosen again if taken at first start).
        binary: the prometheus executable.
        host: listen address (``NODE_IP`` so that pods of the local node reach it).
        scrape_configs: more scrape jobs after the file_sd one (:func:`podmonitor_scrape_config`).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        scrape_interval: float = 1.0,
        port: int | None = None,
        binary: Path = PROMETHEUS_BIN,
        job_name: str = "kubeinfer",
        host: str = "127.0.0.1",
        scrape_configs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.workdir = workdir
        self.host = host
        self.scrape_configs = list(scrape_configs)
        self.scrape_interval = scrape_interval
        self.binary = binary
        self.job_name = job_name
        self._fixed_port = port is not None
        self.port = port if port is not None else _free_port(host)
        self.targets_file = workdir / "targets.json"
        self.config_file = workdir / "prometheus.yml"
        self.data_dir = workdir / "data"
        self.log_file = workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._targets: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        """Base URL, ``http://<host>:<port>``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        """Start (or restart after :meth:`stop`) and wait for ``/-/ready``; returns self.

        Raises PrometheusError with the log tail if the binary is missing, exits, or is not ready
        within ``timeout`` seconds.
        """
        if self.running:
            return self
        if not os.access(self.binary, os.X_OK):
            raise PrometheusError(f"{self.binary} is missing: run `make setup` (apt-get install prometheus)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        if not self.targets_file.exists():
            self._write_targets()
        self.config_file.write_text(
            yaml.safe_dump(
                render_config(
                    self.targets_file,
                    scrape_interval=self.scrape_interval,
                    job_name=self.job_name,
                    scrape_configs=self.scrape_configs,
                )
            )
        )
        for attempt in range(3):
            try:
                self._start_once(timeout)
                return self
            except _PortTaken:
                if self._fixed_port or attempt == 2:
                    raise
                self.port = _free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        cmd = [
            str(self.binary),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                tail = self._log_tail()
                self._proc = None
                if "address already in use" in tail:
                    raise _PortTaken(tail)
                raise PrometheusError(f"prometheus exited early; log tail:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(
                    f"prometheus not ready after {timeout:.0f}s; log tail:\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout`` s); data and port are kept."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def remove(self) -> None:
        """Stop and delete the work directory (config, targets, TSDB, log)."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def backfill(self, series: Sequence[Series], *, promtool: Path = PROMTOOL_BIN) -> None:
        """Write ``series`` into this server's TSDB as blocks and (re)start it so that it loads them.

        The samples may lie before this server's own and overlap them in time: Prometheus merges
        overlapping blocks and the head at query time (vertical compaction is always on from 2.39).
        The server is stopped for the write (``promtool tsdb create-blocks-from openmetrics`` into the
        data directory) and started again on the same port (clients keep their URL), whether or not it
        was running and whether or not promtool took the input. No series: nothing is done.

        Raises PrometheusError with promtool's output when it is missing, refuses the input or runs
        over 120 s, or when the server does not start again on its port (the two messages together
        when both fail); ValueError from :func:`openmetrics_text`.
        """
        if not series:
            return
        text = openmetrics_text(series)
        if not os.access(promtool, os.X_OK):
            raise PrometheusError(f"{promtool} is missing: run `make setup` (apt-get install prometheus)")
        self.stop()
        refused: PrometheusError | None = None
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.data_dir.mkdir(exist_ok=True)
            source = self.workdir / "backfill.om"
            source.write_text(text)
            cmd = [
                str(promtool),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(source),
                str(self.data_dir),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                refused = PrometheusError(
                    f"promtool refused the backfill: {(done.stdout + done.stderr)[-2000:]}"
                )
        except subprocess.TimeoutExpired:
            refused = PrometheusError("promtool ran over 120 s on the backfill")
        fixed, self._fixed_port = self._fixed_port, True  # the same port, or an error
        try:
            self.start()
        except PrometheusError as exc:
            raise PrometheusError(f"{refused}; then {exc}" if refused else str(exc)) from exc
        finally:
            self._fixed_port = fixed
        if refused is not None:
            raise refused

    # -------------------------------------------------------------------- targets

    def set_targets(self, targets: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Replace the scraped targets: ``[("127.0.0.1:port", {"namespace": ..., ...}), ...]``.

        Written atomically (rename), picked up by file_sd within about a second, no restart.
        """
        self._targets = [(addr, dict(labels)) for addr, labels in targets]
        self._write_targets()

    @property
    def targets(self) -> list[tuple[str, dict[str, str]]]:
        return list(self._targets)

    def _write_targets(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(render_targets(self._targets)))
        os.replace(tmp, self.targets_file)

    # -------------------------------------------------------------------- queries

    def query(self, promql: str, *, at: float | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result`` (for a vector: ``[{"metric": {...}, "value": [t, "v"]}]``).

        Raises PrometheusError with Prometheus' error message on a bad query or HTTP error.
        """
        params: dict[str, str] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            r = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=timeout)
        except httpx.HTTPError as e:
            raise PrometheusError(f"query {promql!r} failed: {e!r}") from e
        try:
            body = r.json()
        except ValueError as e:
            raise PrometheusError(f"query {promql!r}: HTTP {r.status_code}, not JSON: {r.text[:200]}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_value(self, promql: str) -> float | None:
        """The single value of a one-series vector query, or None when the result is empty.

        Raises PrometheusError when the result has more than one series.
        """
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"query {promql!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets`` active targets (scrapeUrl, health, labels, lastError...)."""
        r = httpx.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=10.0)
        r.raise_for_status()
        targets: list[dict[str, Any]] = r.json()["data"]["activeTargets"]
        return targets

    def wait_for_scrape(self, target: str, timeout: float = 30.0, *, since: float | None = None) -> None:
        """Wait until ``target`` ("host:port") has been scraped successfully (``up == 1``) by a
        scrape that happened after ``since`` (Unix seconds; default: when this call started).

        New targets are picked up within ~5 s (Prometheus' scrape manager applies discovered
        target changes at most every 5 s). Raises PrometheusError (naming the target's last scrape
        error, if any) after ``timeout`` seconds.
        """
        since = time.time() if since is None else since
        deadline = time.monotonic() + timeout
        sel = f'up{{job="{self.job_name}",instance="{target}"}}'
        q = f"timestamp({sel}) and ({sel} == 1)"
        while True:
            with contextlib.suppress(PrometheusError, httpx.HTTPError):
                if any(float(s["value"][1]) >= since for s in self.query(q)):
                    return
            if time.monotonic() > deadline:
                last = ""
                with contextlib.suppress(Exception):
                    for t in self.active_targets():
                        if t.get("labels", {}).get("instance") == target:
                            last = f" (health {t.get('health')}, last error {t.get('lastError')!r})"
                raise PrometheusError(f"target {target} not scraped within {timeout:.0f}s{last}")
            time.sleep(0.2)

    def _log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


class _PortTaken(PrometheusError):
    pass
