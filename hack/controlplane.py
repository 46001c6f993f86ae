"""The control plane of the local cluster: etcd, kube-apiserver, kube-controller-manager and, on a
cluster with a node, kube-scheduler.

Flags are modelled on controller-runtime's envtest, with RBAC on:

- etcd (built from go.etcd.io/etcd/server/v3, see hack/go.mod), data in ``<workdir>/etcd``,
  ``--unsafe-no-fsync`` since the data is throwaway.
- kube-apiserver: RBAC (plus the Node authorizer when a kubelet joins), self-signed CA and serving
  certificate, client certificate authentication (the admin's certificate carries
  ``O=system:masters``), a static admin token (``--token-auth-file``), service-account signing keys
  and ``--service-account-issuer``. It listens on ``bind_ip``: loopback for a control plane alone,
  the pod bridge's address when pods must reach it (hack/podnetwork.py).
- kube-controller-manager with the controllers kubeinfer relies on: deployment, replicaset, garbage
  collector (owner references), namespace, serviceaccount(+token), endpoints/endpointslice,
  disruption (PodDisruptionBudget status), resourcequota, root-ca-certificate publisher, the
  PersistentVolume binder and the PV/PVC protection controllers (``pvc://`` models); with a node
  also node lifecycle (the not-ready taint) and pod garbage collection.
- kube-scheduler (with a node only).

Used by hack/cluster.py, which composes it with the pod network and the node.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import procs
from hack.pki import ADMIN_USER, Leaf, control_plane_leaves, make_pki
from hack.procs import ClusterError

CLUSTER_NAME = "kubeinfer-local"
SERVICE_CIDR = "10.0.0.0/24"
#: First address of SERVICE_CIDR: the ``kubernetes`` Service.
KUBERNETES_SERVICE_IP = "10.0.0.1"
SERVICE_ISSUER = "https://kubernetes.default.svc.cluster.local"
KUBERNETES_VERSION = "v1.37.2"
KCM_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "disruption-controller",
    "resourcequota-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    # PersistentVolumes: binding claims to volumes (static hostPath PVs on the local node), and
    # removing the protection finalizers the StorageObjectInUseProtection admission plugin adds
    # (without these two controllers a deleted PVC or PV stays Terminating for ever)
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
#: Controllers added when a kubelet joins: the not-ready taint comes off a Ready node, terminated and
#: orphaned pods are collected, NoExecute taints evict.
NODE_KCM_CONTROLLERS = (
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "taint-eviction-controller",
)
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

Say = Callable[[str], None]


@dataclass(frozen=True)
class ControlPlane:
    """What :func:`start` started: the API server URL, pids with start times, ports, the admin
    kubeconfig and the admin token."""

    server: str
    pids: dict[str, int]
    start_times: dict[str, int]
    ports: dict[str, int]
    kubeconfig: Path
    admin_token: str


# ----------------------------------------------------------------------------- pure helpers


def render_kubeconfig(
    server: str,
    ca_pem: bytes,
    *,
    user: str,
    token: str | None = None,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    namespace: str | None = None,
    impersonate: str | None = None,
    impersonate_groups: Sequence[str] = (),
    cluster_name: str = CLUSTER_NAME,
) -> dict[str, Any]:
    """Build a kubeconfig document (a dict; ``yaml.safe_dump`` it) with one cluster/user/context.

    Exactly one credential: a bearer ``token`` or a client certificate + key (PEM bytes). With
    ``impersonate`` the user entry carries ``as`` / ``as-groups`` (honoured by kubectl, helm and
    client-go; not by the Python ``kubernetes`` client). Raises ValueError on a missing/double
    credential or a server that is not an https URL.
    """
    if not server.startswith("https://"):
        raise ValueError(f"server must be an https:// URL, got {server!r}")
    has_cert = client_cert_pem is not None or client_key_pem is not None
    if (token is None) == (not has_cert):
        raise ValueError("give exactly one credential: token, or client_cert_pem + client_key_pem")
    if has_cert and (client_cert_pem is None or client_key_pem is None):
        raise ValueError("client_cert_pem and client_key_pem go together")
    b64 = lambda data: base64.b64encode(data).decode("ascii")  # noqa: E731
    auth: dict[str, Any] = {}
    if token is not None:
        auth["token"] = token
    else:
        assert client_cert_pem is not None and client_key_pem is not None
        auth["client-certificate-data"] = b64(client_cert_pem)
        auth["client-key-data"] = b64(client_key_pem)
    if impersonate:
        auth["as"] = impersonate
        if impersonate_groups:
            auth["as-groups"] = list(impersonate_groups)
    context: dict[str, Any] = {"cluster": cluster_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster_name, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }


def write_yaml(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as YAML, readable by the owner only (kubeconfigs carry keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


def write_cert_kubeconfig(path: Path, server: str, pki: Path, leaf: str, user: str) -> Path:
    """Write a kubeconfig for ``server`` that authenticates with the client certificate ``leaf``."""
    write_yaml(
        path,
        render_kubeconfig(
            server,
            (pki / "ca.crt").read_bytes(),
            user=user,
            client_cert_pem=(pki / f"{leaf}.crt").read_bytes(),
            client_key_pem=(pki / f"{leaf}.key").read_bytes(),
        ),
    )
    return path


def apiserver_args(
    *,
    etcd_url: str,
    port: int,
    pki: Path,
    token_file: Path,
    bind_ip: str = "127.0.0.1",
    with_node: bool = False,
) -> list[str]:
    """kube-apiserver flags (after envtest's defaults, with RBAC and service-account keys).

    With ``with_node``: the Node authorizer before RBAC (kubelets act on their own pods), the lease
    endpoint reconciler (the ``kubernetes`` Service gets ``bind_ip`` as its endpoint, so pods reach
    the API server through its ClusterIP) and a client certificate towards kubelets (logs, exec).
    """
    args = [
        f"--etcd-servers={etcd_url}",
        f"--bind-address={bind_ip}",
        f"--advertise-address={bind_ip}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={token_file}",
        f"--authorization-mode={'Node,RBAC' if with_node else 'RBAC'}",
        f"--service-account-issuer={SERVICE_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]
    if with_node:
        args += [
            "--endpoint-reconciler-type=lease",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        args.append("--endpoint-reconciler-type=none")
    return args


def controller_manager_args(*, kubeconfig: Path, pki: Path, with_node: bool = False) -> list[str]:
    """kube-controller-manager flags: the controllers in KCM_CONTROLLERS (plus NODE_KCM_CONTROLLERS
    with a node), no HTTPS serving."""
    controllers = KCM_CONTROLLERS + (NODE_KCM_CONTROLLERS if with_node else ())
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--controllers={','.join(controllers)}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--concurrent-gc-syncs=5",
        "--v=1",
    ]


def scheduler_args(*, kubeconfig: Path, port: int) -> list[str]:
    """kube-scheduler flags: its own user (``system:kube-scheduler``), health on loopback only."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--v=1",
    ]


def etcd_args(*, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    """etcd flags for a single throwaway member on loopback."""
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
        "--quota-backend-bytes=2147483648",
    ]


# ----------------------------------------------------------------------------- start / stop


class PortTaken(ClusterError):
    """A component exited with "address already in use": choose new ports and start again."""


def start(
    workdir: Path,
    *,
    bin_dir: Path,
    bind_ip: str,
    extra_leaves: Sequence[Leaf],
    with_node: bool,
    timeout: float,
    die_with_parent: bool,
    say: Say,
) -> ControlPlane:
    """Make the PKI (control-plane certificates plus ``extra_leaves``), start the components and wait
    until the API server's ``/readyz`` is 200 and kube-controller-manager has made the ``default``
    ServiceAccount. Ports are free ports chosen now (the API server's on ``bind_ip``).

    Raises PortTaken when a port was taken between choice and bind (the caller retries), and
    ClusterError (with the failing component's log tail) on an early exit or after ``timeout``
    seconds; in both cases the processes it started are stopped.
    """
    t0 = time.monotonic()
    pki, logs = workdir / "pki", workdir / "logs"
    make_pki(pki, [*control_plane_leaves([bind_ip], KUBERNETES_SERVICE_IP), *extra_leaves])
    token = base64.urlsafe_b64encode(os.urandom(24)).decode("ascii").rstrip("=")
    token_file = pki / "tokens.csv"
    token_file.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    token_file.chmod(0o600)
    etcd_port = procs.free_port()
    peer_port = procs.free_port(exclude={etcd_port})
    api_port = procs.free_port(bind_ip, exclude={etcd_port, peer_port})
    sched_port = procs.free_port(exclude={etcd_port, peer_port, api_port})
    server = f"https://{bind_ip}:{api_port}"
    kubeconfig = write_cert_kubeconfig(workdir / "kubeconfig", server, pki, "admin", ADMIN_USER)
    kcm_kubeconfig = write_cert_kubeconfig(
        pki / "kcm.kubeconfig", server, pki, "kcm", "system:kube-controller-manager"
    )
    cmds = {
        "etcd": [
            str(bin_dir / "etcd"),
            *etcd_args(data_dir=workdir / "etcd", client_port=etcd_port, peer_port=peer_port),
        ],
        "kube-apiserver": [
            str(bin_dir / "kube-apiserver"),
            *apiserver_args(
                etcd_url=f"http://127.0.0.1:{etcd_port}",
                port=api_port,
                pki=pki,
                token_file=token_file,
                bind_ip=bind_ip,
                with_node=with_node,
            ),
        ],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"),
            *controller_manager_args(kubeconfig=kcm_kubeconfig, pki=pki, with_node=with_node),
        ],
    }
    if with_node:
        sched_kubeconfig = write_cert_kubeconfig(
            pki / "scheduler.kubeconfig", server, pki, "scheduler", "system:kube-scheduler"
        )
        cmds["kube-scheduler"] = [
            str(bin_dir / "kube-scheduler"),
            *scheduler_args(kubeconfig=sched_kubeconfig, port=sched_port),
        ]
    started: dict[str, subprocess.Popen[bytes]] = {}
    for name, cmd in cmds.items():
        started[name] = procs.spawn(cmd, logs / f"{name}.log", die_with_parent)
    cp = ControlPlane(
        server=server,
        pids={n: p.pid for n, p in started.items()},
        start_times={n: procs.proc_start_time(p.pid) or 0 for n, p in started.items()},
        ports={"etcd": etcd_port, "etcd-peer": peer_port, "kube-apiserver": api_port}
        | ({"kube-scheduler": sched_port} if with_node else {}),
        kubeconfig=kubeconfig,
        admin_token=token,
    )
    say(f"started {', '.join(cmds)} (kube-apiserver {server}; logs: {logs})")
    try:
        _wait_ready(cp, started, pki, logs, t0 + timeout, say)
    except BaseException:  # Ctrl-C too: nothing is recorded yet, so nothing else could stop them
        stop(cp, say=lambda _m: None)
        raise
    say(f"control plane ready after {time.monotonic() - t0:.1f}s")
    return cp


def _wait_ready(
    cp: ControlPlane,
    started: dict[str, subprocess.Popen[bytes]],
    pki: Path,
    logs: Path,
    deadline: float,
    say: Say,
) -> None:
    ctx = procs.ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    stage = "kube-apiserver /readyz"
    while True:
        for name, p in started.items():
            if p.poll() is not None:
                tail = procs.log_tail(logs / f"{name}.log")
                err = f"{name} exited with code {p.returncode}; log tail:\n{tail}"
                raise PortTaken(err) if "address already in use" in tail else ClusterError(err)
        if stage == "kube-apiserver /readyz":
            if procs.http_get(f"{cp.server}/readyz", ctx)[0] == 200:
                say("kube-apiserver ready")
                stage = "kube-controller-manager (default ServiceAccount)"
        else:
            code, _ = procs.http_get(f"{cp.server}/api/v1/namespaces/default/serviceaccounts/default", ctx)
            if code == 200:
                return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n}:\n{procs.log_tail(logs / f'{n}.log', 8)}" for n in started)
            raise ClusterError(f"timed out waiting for {stage}\n{tails}")
        time.sleep(0.2)


def stop(cp: ControlPlane, *, say: Say) -> None:
    """Stop the recorded processes (matched by pid and start time; a reused pid is left alone):
    kube-scheduler and kube-controller-manager first, etcd last."""
    for name in reversed(COMPONENTS):
        pid = cp.pids.get(name)
        if pid is not None and procs.terminate(pid, cp.start_times.get(name)):
            say(f"stopped {name} (pid {pid})")


def is_ready(cp: ControlPlane, pki: Path) -> bool:
    """All recorded processes alive and the API server answers /readyz with 200."""
    if not all(procs.is_ours(p, cp.start_times.get(n)) for n, p in cp.pids.items()):
        return False
    ctx = procs.ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    return procs.http_get(f"{cp.server}/readyz", ctx)[0] == 200
