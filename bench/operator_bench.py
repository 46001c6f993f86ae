#!/usr/bin/env python3
"""Operator benchmark (``make bench-operator`` → ``bench/results/operator.json``).

Creates N InferenceServices (default 300) at once in one namespace watched by a real
``kubeinfer-operator`` process on a real local control plane (``hack/cluster.py``; or the cluster
of ``--kubeconfig``), and measures:

- ``crs_per_second``: N / seconds from the first create request (16 concurrent POSTs) until
  every Deployment exists;
- ``peak_rss_bytes``: the operator's peak resident set size (``VmHWM``) over the whole run;
- ``writes_per_create``: write requests per InferenceService until the operator is quiet: the
  operator's own writes (its ``kubeinfer_operator_api_writes_total``: applies, status patches,
  Events) plus kopf's PATCHes of the InferenceServices (finalizers), from the API server's
  ``apiserver_request_total``;
- ``writes_per_resync``: API-server write requests on the watched resources (deployments, services,
  configmaps, poddisruptionbudgets, inferenceservices, events) during steady-state resync periods,
  divided by the number of InferenceService resyncs observed (the operator's reconcile counter).

Targets on the dev machine: >= 20 InferenceServices/s, RSS < 250 MB, 0 writes per resync.

Like every benchmark that measures, it runs under ``bench/quiet.py``: the machine-wide bench lock, and
no measurement while the 1-minute load average is over 0.5 unless ``--noisy`` (the JSON then says
``"noisy": true``); ``machine`` in the JSON records the CPU, the cores and the load before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import quiet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeinfer.operator import k8s, rfc3339  # noqa: E402

import hack.cluster  # noqa: E402
from hack.cluster import DEFAULT_BIN_DIR, start, stop  # noqa: E402
from hack.devtools.operator_proc import TEST_ENV, WRITE_VERBS, OperatorProcess, api_write_counts  # noqa: E402

NOT_DELETE = WRITE_VERBS - {"DELETE"}  # the namespace controller deletes earlier repeats' namespaces
WATCHED = {"deployments", "services", "configmaps", "poddisruptionbudgets", "inferenceservices", "events"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Kubectl:
    def __init__(self, kubectl: Path, kubeconfig: Path) -> None:
        self.base = [str(kubectl), f"--kubeconfig={kubeconfig}"]

    def __call__(self, *args: str, input: str | None = None, timeout: float = 300.0) -> str:
        r = subprocess.run([*self.base, *args], input=input, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout


def isvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "quantization": {"mode": "int8-dynamic"},
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "runtime": {"device": "cpu"},
            "replicas": 1,
        },
    }


async def create_and_wait(kubeconfig: Path, ns: str, n: int, deadline_s: float) -> tuple[float, int]:
    """POST ``n`` InferenceServices (16 in flight), then poll until ``n`` Deployments exist.

    Returns (seconds the POSTs took, Deployments seen at the end).
    """
    kube = await k8s.Kube.from_environment(str(kubeconfig))
    try:
        t0 = time.monotonic()
        sem = asyncio.Semaphore(16)
        path = k8s.resource_path("kubeinfer.io/v1alpha1", "inferenceservices", ns)

        async def one(i: int) -> None:
            async with sem:
                await kube.create(path, isvc(f"is-{i:04d}"))

        await asyncio.gather(*(one(i) for i in range(n)))
        posted = time.monotonic() - t0
        deployments = k8s.resource_path("apps/v1", "deployments", ns)
        count = 0
        while time.monotonic() - t0 < deadline_s:
            count = len(await kube.list(deployments))
            if count >= n:
                break
            await asyncio.sleep(0.2)
        return posted, count
    finally:
        await kube.close()


def operator_writes(metrics_text: str) -> int:
    pattern = re.compile(r"^kubeinfer_operator_api_writes_total\{[^}]*\} ([0-9.e+]+)$", re.M)
    return int(sum(float(v) for v in pattern.findall(metrics_text)))


def kopf_isvc_patches(api_metrics: str) -> int:
    total = 0.0
    for line in api_metrics.splitlines():
        ours = line.startswith("apiserver_request_total{") and 'resource="inferenceservices"' in line
        if ours and 'verb="PATCH"' in line and 'subresource=""' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def write_breakdown(api_metrics: str) -> dict[str, float]:
    """``verb resource/subresource`` → count of write requests on the watched resources."""
    out: dict[str, float] = {}
    for line in api_metrics.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if (
            labels.get("verb") in {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
            and labels.get("resource") in WATCHED
        ):
            key = (
                f"{labels['verb']} {labels['resource']}/{labels.get('subresource', '')} {labels.get('code')}"
            )
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def deployment_lag_seconds(kubectl: Kubectl, ns: str) -> list[float]:
    """Sorted seconds from each InferenceService's creationTimestamp to its Deployment's (1 s resolution)."""

    def stamps(kind: str) -> dict[str, float]:
        items = json.loads(kubectl("get", kind, "-n", ns, "-o", "json"))["items"]
        return {
            i["metadata"]["name"]: t.timestamp()
            for i in items
            if (t := rfc3339.parse_time(i["metadata"]["creationTimestamp"])) is not None
        }

    isvcs, deps = stamps("kisvc"), stamps("deployments")
    return sorted(deps[n] - isvcs[n] for n in isvcs if n in deps) or [float("nan")]


def count_lines(kubectl: Kubectl, *args: str) -> int:
    return len([ln for ln in kubectl(*args, "--no-headers").splitlines() if ln.strip()])


def run(kubeconfig: Path, kubectl_bin: Path, n: int, resync: float, workdir: Path) -> dict[str, Any]:
    kubectl = Kubectl(kubectl_bin, kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/inferenceservices.kubeinfer.io", "--timeout=30s")
    ns = f"bench-{secrets.token_hex(3)}"
    kubectl("create", "namespace", ns)
    try:
        with OperatorProcess(
            kubeconfig,
            namespaces=[ns],
            resync_seconds=resync,
            log_dir=workdir,
            extra_env={
                **TEST_ENV,
                "KUBEINFER_LOG_LEVEL": "INFO",
                "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "60",
            },
        ) as op:
            op.wait_ready()
            log(f"operator up (pid {op.proc.pid if op.proc else '?'}), namespace {ns}")
            created = _measure_create(kubectl, kubeconfig, op, ns, n)
            resyncs, resync_writes = _measure_resync(kubectl, op, resync)
            rss = op.peak_rss_bytes()
            log(f"operator peak RSS {rss / 2**20:.1f} MiB")
            # delete while the operator runs: it releases its finalizers, owner references GC the rest
            kubectl("delete", "kisvc", "--all", "-n", ns, "--wait=false")
            gone_deadline = time.monotonic() + 180
            while time.monotonic() < gone_deadline and count_lines(kubectl, "get", "kisvc", "-n", ns) > 0:
                time.sleep(1.0)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
        gone_deadline = time.monotonic() + 180  # the next repeat starts on a quiet API server
        while time.monotonic() < gone_deadline and ns in kubectl("get", "namespaces", "--no-headers"):
            time.sleep(2.0)
    return {
        **created,
        "host_load_average_1m": os.getloadavg()[0],
        "peak_rss_bytes": rss,
        "writes_per_resync": round(resync_writes / resyncs, 4) if resyncs else None,
        "resync_reconciles_observed": int(resyncs),
        "resync_writes_total": resync_writes,
        "resync_seconds": resync,
        "targets": {"crs_per_second": 20, "peak_rss_bytes": 250 * 10**6, "writes_per_resync": 0},
    }


def _measure_create(
    kubectl: Kubectl, kubeconfig: Path, op: OperatorProcess, ns: str, n: int
) -> dict[str, Any]:
    """Create ``n`` InferenceServices and wait for their Deployments, then until every status is
    written and the operator is quiet: throughput, operator CPU, and the writes it took."""
    api0 = kubectl("get", "--raw", "/metrics")
    own0 = operator_writes(op.metrics_text())
    pid = op.proc.pid if op.proc else 0
    cpu0 = cpu_seconds(pid)
    t0 = time.monotonic()
    t_applied, count = asyncio.run(create_and_wait(kubeconfig, ns, n, deadline_s=600))
    elapsed = time.monotonic() - t0
    cpu_create = cpu_seconds(pid) - cpu0
    log(f"created {n} InferenceServices in {t_applied:.2f}s (16 concurrent POSTs)")
    log(
        f"operator CPU until all Deployments exist: {cpu_create:.2f}s ({1000 * cpu_create / n:.1f} ms per IS)"
    )
    log(f"{count}/{n} Deployments exist after {elapsed:.2f}s -> {n / elapsed:.1f} IS/s")
    lag = deployment_lag_seconds(kubectl, ns)
    log(
        f"Deployment created after its InferenceService: median {lag[len(lag) // 2]:.0f}s, max {lag[-1]:.0f}s"
    )
    # wait until every status is written and the operator is quiet
    quiet_deadline = time.monotonic() + 300
    last = -1
    while time.monotonic() < quiet_deadline:
        items = json.loads(kubectl("get", "kisvc", "-n", ns, "-o", "json"))["items"]
        with_status = sum(1 for i in items if (i.get("status") or {}).get("conditions"))
        writes = operator_writes(op.metrics_text())
        if with_status >= n and writes == last:
            break
        last = writes
        time.sleep(2.0)
    api1 = kubectl("get", "--raw", "/metrics")
    own1 = operator_writes(op.metrics_text())
    create_writes = (own1 - own0) + (kopf_isvc_patches(api1) - kopf_isvc_patches(api0))
    log(f"writes on create: {create_writes} ({create_writes / n:.2f} per IS)")
    return {
        "crs": n,
        "crs_per_second": round(n / elapsed, 2),
        "seconds_until_all_deployments": round(elapsed, 3),
        "create_requests_seconds": round(t_applied, 3),
        "deployments_seen": count,
        "operator_cpu_seconds_per_cr_until_deployments": round(cpu_create / n, 4),
        "writes_per_create": round(create_writes / n, 3),
        "writes_on_create_total": create_writes,
    }


def _measure_resync(kubectl: Kubectl, op: OperatorProcess, resync: float) -> tuple[float, int]:
    """Two resync periods of a settled namespace: ``(reconciles, writes)``, the writes being the API
    server's (no DELETE) plus the operator's own."""
    settle_deadline = time.monotonic() + 120  # other namespaces' deletions are writes too
    while time.monotonic() < settle_deadline and "Terminating" in kubectl(
        "get", "namespaces", "--no-headers"
    ):
        time.sleep(1.0)
    time.sleep(3.0)
    m0 = kubectl("get", "--raw", "/metrics")
    w0, r0, own0 = api_write_counts(m0, WATCHED, NOT_DELETE), op.reconciles(), op.own_writes()
    log(f"steady state: watching {2 * resync:.0f}s of resyncs")
    time.sleep(2 * resync + 1.0)
    m1 = kubectl("get", "--raw", "/metrics")
    w1, r1, own1 = api_write_counts(m1, WATCHED, NOT_DELETE), op.reconciles(), op.own_writes()
    b0, b1 = write_breakdown(m0), write_breakdown(m1)
    for key in sorted(b1):
        if b1[key] != b0.get(key, 0.0):
            log(f"  resync-window writes: {key}: {b1[key] - b0.get(key, 0.0):.0f}")
    resyncs = r1 - r0
    resync_writes = (w1 - w0) + int(own1 - own0)  # API server (no DELETE) + the operator's own
    log(f"resync: {resyncs:.0f} reconciles, {w1 - w0} API writes, {own1 - own0:.0f} by the operator")
    return resyncs, resync_writes


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats (peak RSS and writes per resync: the worst run), plus every run."""
    med = statistics.median
    resync = [r["writes_per_resync"] for r in runs if r["writes_per_resync"] is not None]
    return {
        "crs": runs[0]["crs"],
        "repeats": len(runs),
        "crs_per_second": round(med(r["crs_per_second"] for r in runs), 2),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "writes_per_create": round(med(r["writes_per_create"] for r in runs), 3),
        "writes_per_resync": max(resync) if resync else None,
        "operator_cpu_seconds_per_cr_until_deployments": round(
            med(r["operator_cpu_seconds_per_cr_until_deployments"] for r in runs), 4
        ),
        "aggregation": "median over repeats; peak_rss_bytes and writes_per_resync: worst repeat",
        "targets": runs[0]["targets"],
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--crs", type=int, default=300, help="InferenceServices to create (300)")
    parser.add_argument("--repeats", type=int, default=3, help="runs (fresh namespace and operator each)")
    parser.add_argument("--resync-seconds", type=float, default=10.0)
    parser.add_argument(
        "--kubeconfig", type=Path, default=None, help="use this cluster instead of a fresh one"
    )
    parser.add_argument("--kubectl", type=Path, default=DEFAULT_BIN_DIR / "kubectl")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/operator.json")
    quiet.add_arguments(parser)
    args = parser.parse_args()
    with quiet.quiet_run("operator_bench", args, log=log) as session:
        result = session.stamp(measure(args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """``--repeats`` runs on a fresh local cluster (or ``--kubeconfig``'s): their ``summarize``."""
    with tempfile.TemporaryDirectory(prefix="kubeinfer-bench-") as tmp:
        work = Path(tmp)
        info = None
        kubeconfig = args.kubeconfig
        if kubeconfig is None:
            # hack/cluster.py's Service range (a /24) holds ~250 ClusterIPs: too few for 300 Services
            hack.cluster.SERVICE_CIDR = "10.96.0.0/16"
            info = start(work / "cluster", die_with_parent=True, timeout=120.0)
            kubeconfig = info.kubeconfig
        try:
            runs = []
            for i in range(args.repeats):
                log(f"--- repeat {i + 1}/{args.repeats}")
                runs.append(run(kubeconfig, args.kubectl, args.crs, args.resync_seconds, work))
        finally:
            if info is not None:
                stop(info, log=lambda _m: None)
    return summarize(runs)


if __name__ == "__main__":
    sys.exit(main())
