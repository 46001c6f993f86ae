"""kubernetes_sd (role ``pod``) for a Prometheus built without it, through ``http_sd_configs``.

Debian's ``prometheus`` 2.42 (``2.42.0+ds``) is built without the Kubernetes service discovery:
a ``kubernetes_sd_configs`` key fails to load (``field kubernetes_sd_configs not found in type
config.ScrapeConfig``). It has ``http_sd_configs``. :class:`PodDiscovery` lists the pods from the API
server (the client certificate and CA of the kubernetes_sd config) every ``refresh`` seconds and
serves them on loopback as HTTP SD target groups carrying the same ``__meta_kubernetes_*`` labels
kubernetes_sd's pod role gives (one target per container port, ``<pod IP>:<port>``; a container
without ports gives one target, ``<pod IP>``; pods without an IP are left out, as kubernetes_sd
does), so a job's ``relabel_configs`` (e.g. the chart's PodMonitor, translated by
:func:`tests.support.prom.podmonitor_scrape_config`) apply unchanged.

:class:`tests.support.prom.PrometheusServer` uses it by itself for a ``kubernetes_sd_configs`` job
when its binary lacks kubernetes_sd (:func:`has_kubernetes_sd`); nothing else needs to know.

Labels (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#pod):
``__meta_kubernetes_namespace``, ``_pod_name``, ``_pod_ip``, ``_pod_label_<n>``,
``_pod_labelpresent_<n>``, ``_pod_annotation_<n>``, ``_pod_annotationpresent_<n>``,
``_pod_container_name``, ``_pod_container_image``, ``_pod_container_init``,
``_pod_container_port_name``, ``_pod_container_port_number``, ``_pod_container_port_protocol``,
``_pod_ready``, ``_pod_phase``, ``_pod_node_name``, ``_pod_host_ip``, ``_pod_uid``,
``_pod_controller_kind``, ``_pod_controller_name``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

META = "__meta_kubernetes_"


def _label_name(key: str) -> str:
    """A Kubernetes label key as kubernetes_sd spells it in meta labels (non [a-zA-Z0-9_] -> _)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def pod_target_groups(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """HTTP SD target groups for ``pods`` (API objects), labelled as kubernetes_sd's pod role does."""
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "unknown"
        )
        common = {
            f"{META}namespace": meta["namespace"],
            f"{META}pod_name": meta["name"],
            f"{META}pod_ip": ip,
            f"{META}pod_ready": str(ready).lower(),
            f"{META}pod_phase": status.get("phase", ""),
            f"{META}pod_node_name": spec.get("nodeName", ""),
            f"{META}pod_host_ip": status.get("hostIP", ""),
            f"{META}pod_uid": meta.get("uid", ""),
        }
        for kind, values in (("label", meta.get("labels")), ("annotation", meta.get("annotations"))):
            for k, v in (values or {}).items():
                common[f"{META}pod_{kind}_{_label_name(k)}"] = v
                common[f"{META}pod_{kind}present_{_label_name(k)}"] = "true"
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if owner:
            common[f"{META}pod_controller_kind"] = owner["kind"]
            common[f"{META}pod_controller_name"] = owner["name"]
        containers = [(c, "false") for c in spec.get("containers") or []]
        containers += [(c, "true") for c in spec.get("initContainers") or []]
        for c, init in containers:
            labels = {
                **common,
                f"{META}pod_container_name": c["name"],
                f"{META}pod_container_image": c.get("image", ""),
                f"{META}pod_container_init": init,
            }
            ports = c.get("ports") or []
            if not ports:
                if init == "false":
                    groups.append({"targets": [ip], "labels": labels})
                continue
            for p in ports:
                groups.append(
                    {
                        "targets": [f"{ip}:{p['containerPort']}"],
                        "labels": {
                            **labels,
                            f"{META}pod_container_port_name": p.get("name", ""),
                            f"{META}pod_container_port_number": str(p["containerPort"]),
                            f"{META}pod_container_port_protocol": p.get("protocol", "TCP"),
                        },
                    }
                )
    return groups


@functools.cache
def has_kubernetes_sd(binary: Path) -> bool:
    """Whether the Prometheus at ``binary`` loads a ``kubernetes_sd_configs`` job (asks the
    ``promtool`` beside it; True when there is none to ask)."""
    promtool = binary.with_name("promtool")
    if not promtool.exists():
        return True
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "prometheus.yml"
        cfg.write_text(
            "scrape_configs:\n- job_name: probe\n  kubernetes_sd_configs:\n  - role: pod\n"
            "    api_server: https://127.0.0.1:1\n"
        )
        res = subprocess.run(
            [str(promtool), "check", "config", str(cfg)], capture_output=True, text=True, timeout=30
        )
    return "kubernetes_sd_configs not found" not in res.stdout + res.stderr


class PodDiscovery:
    """Pods of ``api_server`` as an HTTP SD endpoint on loopback (see the module docstring).

    Args:
        api_server: the API server URL.
        tls_config: Prometheus' keys: ``ca_file``, ``cert_file``, ``key_file``.
        namespaces: only these namespaces (default: all).
        refresh: seconds between two pod lists.
    """

    def __init__(
        self,
        api_server: str,
        tls_config: Mapping[str, str],
        *,
        namespaces: Sequence[str] = (),
        refresh: float = 1.0,
    ) -> None:
        self.api_server = api_server.rstrip("/")
        self.tls = dict(tls_config)
        self.namespaces = list(namespaces)
        self.refresh = refresh
        self._body = b"[]"
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.last_error: str | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/targets"

    def start(self) -> PodDiscovery:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner._body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._poll()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="pod-sd-http", daemon=True),
            threading.Thread(target=self._loop, name="pod-sd-poll", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh):
            self._poll()

    def _poll(self) -> None:
        paths = [f"/api/v1/namespaces/{n}/pods" for n in self.namespaces] or ["/api/v1/pods"]
        pods: list[dict[str, Any]] = []
        try:
            ctx = ssl.create_default_context(cafile=self.tls.get("ca_file"))
            if "cert_file" in self.tls:
                ctx.load_cert_chain(self.tls["cert_file"], self.tls.get("key_file"))
            with httpx.Client(verify=ctx, timeout=10.0) as client:
                for path in paths:
                    r = client.get(self.api_server + path)
                    r.raise_for_status()
                    pods += r.json()["items"]
        except (OSError, httpx.HTTPError, KeyError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"  # keep serving the last good list
            return
        self.last_error = None
        self._body = json.dumps(pod_target_groups(pods)).encode()


def bridge_kubernetes_sd(
    scrape_configs: Sequence[Mapping[str, Any]], *, refresh: float = 1.0
) -> tuple[list[dict[str, Any]], list[PodDiscovery]]:
    """``scrape_configs`` with every ``kubernetes_sd_configs`` (role pod) entry replaced by an
    ``http_sd_configs`` entry of a started :class:`PodDiscovery`; returns the configs and the
    discoveries (stop them after Prometheus). Raises ValueError for a role other than pod."""
    out: list[dict[str, Any]] = []
    started: list[PodDiscovery] = []
    try:
        for job in scrape_configs:
            job = dict(job)
            sds = job.pop("kubernetes_sd_configs", None)
            if sds:
                http_sds = list(job.get("http_sd_configs") or [])
                for sd in sds:
                    if sd.get("role") != "pod":
                        raise ValueError(f"only kubernetes_sd role pod is bridged, got {sd.get('role')!r}")
                    d = PodDiscovery(
                        sd["api_server"],
                        sd.get("tls_config") or {},
                        namespaces=(sd.get("namespaces") or {}).get("names") or (),
                        refresh=refresh,
                    ).start()
                    started.append(d)
                    http_sds.append({"url": d.url, "refresh_interval": f"{max(1, round(refresh))}s"})
                job["http_sd_configs"] = http_sds
            out.append(job)
    except BaseException:
        for d in started:
            with contextlib.suppress(Exception):
                d.stop()
        raise
    return out, started
