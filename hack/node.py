"""The node of the local cluster: containerd (CRI), kubelet, kube-proxy and CoreDNS, started in
that order on the pod network of hack/podnetwork.py, and stopped with everything they made.

- containerd 2.x with its CRI plugin, runc (Debian) as the runtime with the cgroupfs driver, the
  overlayfs snapshotter and the CNI configuration of the pod network. Its socket, state and the
  runc state live in the cluster's work directory; its content store (the images) lives in
  IMAGE_STORE, a cache kept across clusters like buildah's store (``make images`` loads into it).
- kubelet (node NODE_NAME, cgroupfs driver). These machines have cgroups v1 in hybrid mode whose
  v1 hierarchies cannot be released, and kubelet 1.35+ refuses cgroups v1 unless
  ``failCgroupV1: false``, which its configuration sets. Image garbage collection is off (the local
  images cannot be pulled again) and the eviction thresholds are low (a shared disk).
- kube-proxy in nftables mode (its rules are in the tables ``ip kube-proxy``/``ip6 kube-proxy``),
  node ports on the node address only, conntrack sysctls left alone.
- CoreDNS as a node process on the node address, port 53, serving ``cluster.local`` from the API
  server; the ``kube-system/kube-dns`` Service (CLUSTER_DNS_IP) points at it through a hand-made
  EndpointSlice, so pods resolve Service names as on any cluster. Names outside the cluster are not
  forwarded (nothing outside this machine is reachable anyway).

One node per machine: its ports (kubelet 10250, DNS 53), the bridge and the ``kubepods`` cgroups are
machine-wide. MACHINE_RECORD names the work directory of the running node; a second start elsewhere
is refused with a message that says how to stop the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import procs
from hack.controlplane import write_cert_kubeconfig, write_yaml
from hack.pki import NODE_NAME
from hack.podnetwork import NODE_IP, POD_CIDR
from hack.procs import ClusterError

#: containerd's content store and snapshots (images), kept across clusters.
IMAGE_STORE = Path(os.environ.get("KUBEINFER_IMAGE_STORE", "/var/lib/kubeinfer/containerd"))
#: Which work directory runs this machine's node (JSON: workdir, pids, start times).
MACHINE_RECORD = Path("/run/kubeinfer-node.json")
#: Held (flock) by whoever starts a containerd on IMAGE_STORE: an image preload for as long as its
#: containerd runs, a node's start while it launches its own. Two containerds on one store would share
#: its metadata database.
STORE_LOCK = IMAGE_STORE.parent / f".{IMAGE_STORE.name}.lock"
RUNC = Path("/usr/sbin/runc")
#: Image of every pod's sandbox (built locally by hack/images.py: no registry is reachable).
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
CLUSTER_DOMAIN = "cluster.local"
CLUSTER_DNS_IP = "10.0.0.10"
KUBELET_PORT = 10250
DNS_PORT = 53
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "crictl", "kubelet", "kube-proxy", "coredns")
COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns")
#: Kernel settings the node changes (the kubelet at start, ``protectKernelDefaults: false``; the
#: CNI bridge plugin ``ip_forward``, a gateway's); recorded at start and put back at stop.
NODE_SYSCTLS = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: nftables tables that existed before the node started (JSON list, under ``<workdir>/node``): the
#: iptables-nft tables the kubelet creates are removed at stop, those that were there are kept.
TABLES_BEFORE = "nft-tables-before.json"
#: cgroup v1 hierarchies and the v2 tree of hybrid mode, where the kubelet makes ``kubepods``.
CGROUP_ROOT = Path("/sys/fs/cgroup")

Say = Callable[[str], None]


@dataclass(frozen=True)
class NodePaths:
    """Where a node's files live, all under ``<workdir>/node`` but the image store."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd-state"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def net(self) -> Path:
        return self.root / "net"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def endpoint(self) -> str:
        """The CRI endpoint URL (kubelet, crictl)."""
        return f"unix://{self.containerd_socket}"


# ----------------------------------------------------------------------------- configuration


def containerd_config(paths: NodePaths, cni_conf_dir: Path, image_store: Path = IMAGE_STORE) -> str:
    """containerd 2.x configuration (version 3) for the node: CRI with runc (cgroupfs), overlayfs,
    the pod network's CNI configuration, SANDBOX_IMAGE pinned, network namespaces under the state
    directory, no metrics or debug listeners, streaming (exec, logs, port-forward) on loopback.
    ``restrict_oom_score_adj``: these machines refuse a negative ``oom_score_adj`` even to root
    (runc failed every sandbox with "failed to update /proc/self/oom_score_adj: Permission
    denied"), so containers get no lower a score than containerd's own (0)."""
    q = json.dumps  # TOML basic strings are JSON strings
    return f"""version = 3
root = {q(str(image_store))}
state = {q(str(paths.containerd_state))}

[grpc]
  address = {q(str(paths.containerd_socket))}

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(SANDBOX_IMAGE)}

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {q(str(RUNC))}
          Root = {q(str(paths.runc_root))}
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = {q(str(cni_conf_dir))}
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


def kubelet_config(paths: NodePaths, pki: Path, healthz_port: int) -> dict[str, Any]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of the node. See the module
    docstring for the choices (cgroups v1, image GC off, low eviction thresholds)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": paths.endpoint,
        "address": NODE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [CLUSTER_DNS_IP],
        "resolvConf": str(paths.resolv_conf),
        "podLogsDir": str(paths.pod_logs),
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "maxPods": 32,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }


def kube_proxy_config(kubeconfig: Path, healthz_port: int, metrics_port: int) -> dict[str, Any]:
    """The KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1): nftables mode, node ports on
    the node address only, conntrack sysctls left as they are (0 = do not set)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(kubeconfig: Path, health_port: int, ready_port: int) -> str:
    """CoreDNS configuration: ``cluster.local`` and reverse zones from the API server, on the node
    address only; health and readiness on loopback."""
    return f"""{CLUSTER_DOMAIN}:{DNS_PORT} in-addr.arpa:{DNS_PORT} ip6.arpa:{DNS_PORT} {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""


def dns_objects() -> list[dict[str, Any]]:
    """RBAC for CoreDNS's user, the ``kube-system/kube-dns`` Service (no selector) and the
    EndpointSlice that points it at CoreDNS on the node address."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kubeinfer:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeinfer:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "kubeinfer:coredns",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kubeinfer:coredns"}
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "ports": [
                    {"name": n, "port": DNS_PORT, "protocol": p, "targetPort": DNS_PORT} for n, p in ports
                ],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-node",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "hack.kubeinfer.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
            "ports": [{"name": n, "port": DNS_PORT, "protocol": p} for n, p in ports],
        },
    ]


# ----------------------------------------------------------------------------- machine record


def preflight(workdir: Path, bin_dir: Path) -> None:
    """Raise ClusterError, before anything starts, when a node cannot run here: another node runs on
    this machine, a binary is missing, not root, no cgroup hierarchy."""
    other = running_elsewhere(workdir)
    if other is not None:
        raise ClusterError(
            f"a kubeinfer node already runs on this machine (work directory {other}); one node per "
            f"machine (kubelet port {KUBELET_PORT}, DNS port {DNS_PORT}, the bridge and the kubepods cgroups "
            f"are machine-wide). Stop it first: python hack/cluster.py down --workdir {other}"
        )
    missing = [n for n in BINARIES if not os.access(bin_dir / n, os.X_OK)]
    if not RUNC.exists():
        missing.append(str(RUNC))
    if missing:
        raise ClusterError(f"missing node binaries: {', '.join(missing)}; run `make setup`")
    if os.geteuid() != 0:
        raise ClusterError("a node (kubelet, containerd) needs root: run as root, or without --node")
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise ClusterError(f"no cgroup hierarchy under {CGROUP_ROOT}: the kubelet cannot run here")


def stale_elsewhere(workdir: Path) -> str | None:
    """The work directory of a node recorded on this machine, other than ``workdir``, whose processes
    are all gone (a run killed without its cleanup: its pods, shims and mounts may be left), or None."""
    try:
        rec = json.loads(MACHINE_RECORD.read_text())
    except (OSError, ValueError):
        return None
    if Path(rec.get("workdir", "")) == workdir or running_elsewhere(workdir) is not None:
        return None
    return str(rec.get("workdir") or "") or None


def running_elsewhere(workdir: Path) -> str | None:
    """The work directory of a node running on this machine other than ``workdir``, or None."""
    try:
        rec = json.loads(MACHINE_RECORD.read_text())
    except (OSError, ValueError):
        return None
    if Path(rec.get("workdir", "")) == workdir:
        return None
    alive = any(
        procs.is_ours(pid, rec.get("start_times", {}).get(n)) for n, pid in rec.get("pids", {}).items()
    )
    return str(rec["workdir"]) if alive else None


# ----------------------------------------------------------------------------- start


@dataclass(frozen=True)
class Node:
    """What :func:`start` started: pids with start times, ports, the CRI endpoint and the kernel
    settings to put back at stop."""

    pids: dict[str, int]
    start_times: dict[str, int]
    ports: dict[str, int]
    endpoint: str
    sysctls: dict[str, str]


def start(
    workdir: Path,
    *,
    bin_dir: Path,
    server: str,
    pki: Path,
    admin_kubeconfig: Path,
    cni_conf_dir: Path,
    load_images: Callable[[Path, str], None],
    die_with_parent: bool,
    timeout: float,
    say: Say,
) -> Node:
    """Start containerd, load the local images (``load_images(ctr_path, socket)``), then kubelet,
    kube-proxy and CoreDNS; wait until the node is Ready, untainted, and DNS answers. Call
    :func:`preflight` first.

    Raises ClusterError when a component exits early (with its log tail) or ``timeout`` seconds
    pass (once for containerd, once more for the rest after the images are loaded); what was
    started is stopped then.
    """
    deadline = time.monotonic() + timeout
    paths = NodePaths(workdir / "node")
    paths.root.mkdir(parents=True, exist_ok=True)
    IMAGE_STORE.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
    sysctls = {k: _read_sysctl(k) for k in NODE_SYSCTLS}
    (paths.root / TABLES_BEFORE).write_text(json.dumps(nft_tables()))
    ports = {
        "kubelet-healthz": procs.free_port(),
        "kube-proxy-healthz": procs.free_port(),
        "kube-proxy-metrics": procs.free_port(),
        "coredns-health": procs.free_port(),
        "coredns-ready": procs.free_port(),
    }
    node = Node({}, {}, ports, paths.endpoint, sysctls)
    _record(workdir, node)

    def launch(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        p = procs.spawn(cmd, logs / f"{name}.log", die_with_parent, env=env)
        node.pids[name] = p.pid
        node.start_times[name] = procs.proc_start_time(p.pid) or 0
        _record(workdir, node)
        return p

    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        paths.containerd_config.write_text(containerd_config(paths, cni_conf_dir))
        with store_lock(say):  # an image preload's containerd stops first; its pid is recorded before release
            started["containerd"] = launch(
                "containerd", [str(bin_dir / "containerd"), "--config", str(paths.containerd_config)]
            )
        ctr = [str(bin_dir / "ctr"), "--address", str(paths.containerd_socket)]
        _wait(
            lambda: procs.run([*ctr, "version"], check=False, timeout=5) != "",
            "containerd",
            started,
            logs,
            deadline,
        )
        say(f"containerd ready ({paths.containerd_socket}; images in {IMAGE_STORE})")
        load_images(bin_dir / "ctr", str(paths.containerd_socket))
        # importing the 6 GB runtime image takes minutes and shows its progress: the time allowed
        # for the node's own start begins after it
        deadline = time.monotonic() + timeout

        paths.resolv_conf.write_text(f"nameserver {CLUSTER_DNS_IP}\n")
        kubelet_kubeconfig = write_cert_kubeconfig(
            paths.root / "kubelet.kubeconfig", server, pki, "kubelet-client", f"system:node:{NODE_NAME}"
        )
        kubelet_yaml = paths.root / "kubelet.yaml"
        write_yaml(kubelet_yaml, kubelet_config(paths, pki, ports["kubelet-healthz"]))
        started["kubelet"] = launch(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={kubelet_yaml}",
                f"--kubeconfig={kubelet_kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--root-dir={paths.kubelet_root}",
                "--v=1",
            ],
        )

        proxy_kubeconfig = write_cert_kubeconfig(
            paths.root / "kube-proxy.kubeconfig", server, pki, "kube-proxy", "system:kube-proxy"
        )
        proxy_yaml = paths.root / "kube-proxy.yaml"
        write_yaml(
            proxy_yaml,
            kube_proxy_config(proxy_kubeconfig, ports["kube-proxy-healthz"], ports["kube-proxy-metrics"]),
        )
        started["kube-proxy"] = launch(
            "kube-proxy", [str(bin_dir / "kube-proxy"), f"--config={proxy_yaml}", "--v=1"]
        )

        kubectl = [str(bin_dir / "kubectl"), f"--kubeconfig={admin_kubeconfig}"]
        procs.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(dns_objects()))
        dns_kubeconfig = write_cert_kubeconfig(
            paths.root / "coredns.kubeconfig", server, pki, "coredns", "kubeinfer:coredns"
        )
        core = paths.root / "Corefile"
        core.write_text(corefile(dns_kubeconfig, ports["coredns-health"], ports["coredns-ready"]))
        started["coredns"] = launch("coredns", [str(bin_dir / "coredns"), "-conf", str(core)])

        _wait(lambda: _node_ready(kubectl), f"node {NODE_NAME} Ready and untainted", started, logs, deadline)
        say(f"node {NODE_NAME} Ready")
        _wait(
            lambda: procs.http_get(f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz", None)[0] == 200,
            "kube-proxy healthz",
            started,
            logs,
            deadline,
        )
        _wait(
            lambda: procs.http_get(f"http://127.0.0.1:{ports['coredns-ready']}/ready", None)[0] == 200,
            "CoreDNS ready",
            started,
            logs,
            deadline,
        )
        say(f"kube-proxy (nftables) and CoreDNS ({CLUSTER_DNS_IP} -> {NODE_IP}:{DNS_PORT}) ready")
    except BaseException:
        stop(workdir, node, bin_dir=bin_dir, say=lambda _m: None)
        raise
    return node


def _node_ready(kubectl: list[str]) -> bool:
    out = procs.run([*kubectl, "get", "node", NODE_NAME, "-o", "json"], check=False, timeout=10)
    if not out:
        return False
    obj = json.loads(out)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )
    taints = [
        t for t in obj.get("spec", {}).get("taints", []) if t.get("key", "").startswith("node.kubernetes.io/")
    ]
    return ready and not taints


def _wait(
    ok: Callable[[], bool],
    what: str,
    started: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    deadline: float,
) -> None:
    while True:
        for name, p in started.items():
            if p.poll() is not None:
                tail = procs.log_tail(logs / f"{name}.log")
                raise ClusterError(f"{name} exited with code {p.returncode}; log tail:\n{tail}")
        if ok():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n}:\n{procs.log_tail(logs / f'{n}.log', 8)}" for n in started)
            raise ClusterError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.5)


def _record(workdir: Path, node: Node) -> None:
    MACHINE_RECORD.write_text(
        json.dumps(
            {
                "workdir": str(workdir),
                "pids": node.pids,
                "start_times": node.start_times,
                "sysctls": node.sysctls,
            }
        )
    )


def recorded(workdir: Path) -> Node | None:
    """The node MACHINE_RECORD holds for ``workdir`` (None when it names another or none): what a
    start killed before the cluster's state file knew of its node (e.g. during the image import)
    leaves only there."""
    try:
        rec = json.loads(MACHINE_RECORD.read_text())
    except (OSError, ValueError):
        return None
    if rec.get("workdir") != str(workdir):
        return None
    return Node(rec.get("pids", {}), rec.get("start_times", {}), {}, "", rec.get("sysctls", {}))


def _read_sysctl(key: str) -> str:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return ""


@contextlib.contextmanager
def store_lock(say: Say) -> Iterator[None]:
    """Hold STORE_LOCK (flock, exclusive) for the ``with`` block, waiting for its holder if there is
    one (saying so). Raises OSError when the lock file cannot be made."""
    STORE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with STORE_LOCK.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the containerd that holds {STORE_LOCK} (an image preload) to stop")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def preload(
    workdir: Path,
    *,
    bin_dir: Path,
    load_images: Callable[[Path, str], None],
    timeout: float = 60.0,
    say: Say,
) -> bool:
    """Load images into IMAGE_STORE with a containerd of its own and no node, then stop it: what a
    node's start would import (minutes for the 6 GB runtime image after a rebuild) is done ahead,
    e.g. while other tests run, and the node's start then finds the images current.

    ``workdir`` holds that containerd's socket, state and log and is removed afterwards;
    ``load_images(ctr_path, socket)`` imports (hack/images.load). Holds STORE_LOCK throughout, so a
    node's start waits for it. Returns False, loading nothing, when a node already runs on this
    machine (its containerd owns the store; its start loaded the images). Raises ClusterError when a
    binary is missing, not root, or containerd exits or is not up within ``timeout`` seconds; what
    ``load_images`` raises passes through. containerd is stopped in every case.
    """
    for name in ("containerd", "ctr"):
        if not os.access(bin_dir / name, os.X_OK):
            raise ClusterError(f"missing {bin_dir / name}; run `make setup`")
    if os.geteuid() != 0:
        raise ClusterError("containerd needs root: run as root")
    with store_lock(say):
        other = running_elsewhere(workdir)
        if other is not None:
            say(f"a node runs on this machine (work directory {other}): its containerd owns the images")
            return False
        paths = NodePaths(workdir)
        paths.root.mkdir(parents=True, exist_ok=True)
        IMAGE_STORE.mkdir(parents=True, exist_ok=True)
        paths.containerd_config.write_text(containerd_config(paths, paths.net))
        log = workdir / "containerd.log"
        env = {**os.environ, "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
        cmd = [str(bin_dir / "containerd"), "--config", str(paths.containerd_config)]
        p = procs.spawn(cmd, log, True, env)
        try:
            ctr = [str(bin_dir / "ctr"), "--address", str(paths.containerd_socket)]
            deadline = time.monotonic() + timeout
            while procs.run([*ctr, "version"], check=False, timeout=5) == "":
                tail = f"; log tail:\n{procs.log_tail(log)}"
                if p.poll() is not None:
                    raise ClusterError(f"containerd exited with code {p.returncode}{tail}")
                if time.monotonic() > deadline:
                    raise ClusterError(f"containerd not up after {timeout:.0f} s{tail}")
                time.sleep(0.5)
            load_images(bin_dir / "ctr", str(paths.containerd_socket))
        finally:
            procs.terminate(p.pid, procs.proc_start_time(p.pid))
            with contextlib.suppress(ChildProcessError):
                p.wait(timeout=5)
            _unmount_under((paths.root,))
            shutil.rmtree(workdir, ignore_errors=True)
    return True


# ----------------------------------------------------------------------------- stop


def stop(workdir: Path, node: Node | None, *, bin_dir: Path, say: Say) -> None:
    """Stop the node of ``workdir`` and remove what it made, in this order: the kubelet (so nothing
    restarts), every pod sandbox and container (crictl), kube-proxy, CoreDNS, containerd, leftover
    shims and container processes, mounts under the node's directory and the image store, the
    ``kubepods`` cgroups, kube-proxy's nftables tables, the kubelet's iptables chains; the kernel
    settings the kubelet changed are put back. Safe on a crashed node and when called twice.
    ``node`` None: nothing was recorded (only the sweep runs)."""
    paths = NodePaths(workdir / "node")
    if node is None or not node.pids:
        node = recorded(workdir) or node
    pids = node.pids if node else {}
    times = node.start_times if node else {}
    if procs.terminate(pids.get("kubelet", -1), times.get("kubelet")):
        say("stopped kubelet")
    other = running_elsewhere(workdir)
    if other is not None:  # the sweeps below are machine-wide: they would wreck that node
        for name in ("coredns", "kube-proxy", "containerd"):
            procs.terminate(pids.get(name, -1), times.get(name))
        say(f"a node runs in {other}: only this work directory's processes were stopped")
        return
    _stop_pods_and_daemons(paths, pids, times, bin_dir, say)
    _unmount_under((paths.root, IMAGE_STORE))
    _remove_kubepods_cgroups()
    _restore_host(paths, node.sysctls if node else {})
    for sub in ("containerd-state", "runc", "kubelet", "pod-logs", "net"):
        shutil.rmtree(paths.root / sub, ignore_errors=True)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(MACHINE_RECORD.read_text()).get("workdir") == str(workdir):
            MACHINE_RECORD.unlink()


def _stop_pods_and_daemons(
    paths: NodePaths, pids: dict[str, int], times: dict[str, int], bin_dir: Path, say: Say
) -> None:
    """Every pod sandbox (crictl, while containerd runs), then CoreDNS, kube-proxy and containerd,
    then the shims and container processes left over."""
    if procs.is_ours(pids.get("containerd", -1), times.get("containerd")):
        crictl = [str(bin_dir / "crictl"), "--runtime-endpoint", paths.endpoint, "--timeout", "30s"]
        procs.run([*crictl, "rmp", "--all", "--force"], check=False, timeout=120)
    for name in ("coredns", "kube-proxy", "containerd"):
        if procs.terminate(pids.get(name, -1), times.get(name)):
            say(f"stopped {name}")
    killed = _kill_container_processes(paths)
    if killed:
        say(f"killed {killed} leftover shim/container processes")


def _restore_host(paths: NodePaths, sysctls: dict[str, str]) -> None:
    """kube-proxy's nftables tables and the kubelet's iptables chains removed (keeping the tables
    that existed before the node started), the kernel settings the kubelet changed put back."""
    for family in ("ip", "ip6"):
        procs.run(["nft", "delete", "table", family, "kube-proxy"], check=False)
    tables_before = None
    with contextlib.suppress(OSError, ValueError):
        tables_before = list(json.loads((paths.root / TABLES_BEFORE).read_text()))
    _remove_kube_iptables_chains(tables_before)
    for key, value in sysctls.items():
        if value and _read_sysctl(key) != value:
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value)


def _kill_container_processes(paths: NodePaths) -> int:
    """SIGKILL the containerd shims of this node (their command line names its socket) and every
    process left in a ``kubepods`` cgroup; returns how many."""
    victims: set[int] = set()
    sock = str(paths.containerd_socket)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in b" ".join(cmd):
                victims.add(int(proc.name))
    for procs_file in _kubepods_dirs("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            victims.update(int(x) for x in procs_file.read_text().split())
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if victims:
        time.sleep(0.5)
    return len(victims)


def _kubepods_dirs(filename: str | None = None) -> list[Path]:
    """Every cgroup directory named kubepods (and below it) in every hierarchy, deepest first; with
    ``filename``, that file in each."""
    found: list[Path] = []
    for top in CGROUP_ROOT.glob("*/kubepods*"):
        if top.is_dir():
            found.extend(p for p in top.rglob("*") if p.is_dir())
            found.append(top)
    if (CGROUP_ROOT / "kubepods").is_dir():  # pure v2 layout
        top = CGROUP_ROOT / "kubepods"
        found.extend(p for p in top.rglob("*") if p.is_dir())
        found.append(top)
    found.sort(key=lambda p: len(p.parts), reverse=True)
    return [p / filename for p in found] if filename else found


def _remove_kubepods_cgroups(timeout: float = 15.0) -> None:
    """Remove the kubepods cgroups, deepest first, once their processes have exited (a killed 1.5 GB
    runtime takes a moment): retried until ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for d in _kubepods_dirs():
            with contextlib.suppress(OSError):
                d.rmdir()
        if not _kubepods_dirs() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def mounts_under(prefixes: tuple[Path, ...]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or below any of ``prefixes``, deepest first."""
    roots = [str(p.resolve()) for p in prefixes]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if any(mp == r or mp.startswith(r + "/") for r in roots):
            points.append(mp)
    return sorted(set(points), key=lambda m: m.count("/"), reverse=True)


def _unmount_under(prefixes: tuple[Path, ...]) -> None:
    for _ in range(3):  # a mount can be stacked on a mount point more than once
        points = mounts_under(prefixes)
        if not points:
            return
        for mp in points:
            procs.run(["umount", mp], check=False)
            if mp in mounts_under(prefixes):  # busy: detach it now, it goes when the last user does
                procs.run(["umount", "-l", mp], check=False)


def nft_tables() -> list[str]:
    """``nft list tables`` as "family name" strings (empty without nft)."""
    out = procs.run(["nft", "list", "tables"], check=False)
    return sorted(
        line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")
    )


def _remove_kube_iptables_chains(tables_before: list[str] | None) -> None:
    """Delete the KUBE-* chains the kubelet made (iptables-nft), and the tables that held only those or
    that did not exist before the node started (``tables_before``; None: unknown, kept) and are now
    empty of rules (iptables-nft makes its base chains with the kubelet's first chain)."""
    for family in ("ip", "ip6"):
        for table in ("filter", "nat", "mangle"):
            listing = procs.run(["nft", "-j", "list", "table", family, table], check=False)
            if not listing:
                continue
            items = json.loads(listing).get("nftables", [])
            chains = [i["chain"] for i in items if "chain" in i]
            kube = [c["name"] for c in chains if c["name"].startswith("KUBE-")]
            ours = tables_before is not None and f"{family} {table}" not in tables_before
            if not kube and not ours:
                continue
            rules = [i["rule"] for i in items if "rule" in i]
            for r in rules:  # jumps into KUBE-* chains from the built-in ones
                if r["chain"] not in kube and "KUBE-" in json.dumps(r.get("expr", [])):
                    procs.run(
                        ["nft", "delete", "rule", family, table, r["chain"], "handle", str(r["handle"])],
                        check=False,
                    )
            for name in kube:
                procs.run(["nft", "flush", "chain", family, table, name], check=False)
            for name in kube:
                procs.run(["nft", "delete", "chain", family, table, name], check=False)
            left = procs.run(["nft", "-j", "list", "table", family, table], check=False)
            empty = not any("rule" in i for i in json.loads(left or "{}").get("nftables", []))
            if all(c["name"] in kube for c in chains) or (ours and empty):
                procs.run(["nft", "delete", "table", family, table], check=False)


# ----------------------------------------------------------------------------- leftovers


def leftovers(workdir: Path) -> list[str]:
    """What a stopped node left behind on this machine: processes of its binaries, mounts under its
    directory or the image store, network namespaces, kubepods cgroups, kube-proxy's nftables
    tables, KUBE-* chains, the machine record. Empty after a clean :func:`stop`."""
    found: list[str] = []
    mine = str(workdir / "node").encode()  # every node process names a file under it
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (proc / "cmdline").read_bytes()
                if mine in cmd:
                    exe = cmd.split(b"\0")[0].decode(errors="replace")
                    found.append(f"process {proc.name}: {exe}")
    found += [f"mount {m}" for m in mounts_under((workdir / "node", IMAGE_STORE))]
    found += [f"cgroup {d}" for d in _kubepods_dirs()]
    tables = procs.run(["nft", "list", "tables"], check=False)
    found += [f"nftables {t}" for t in tables.splitlines() if "kube-proxy" in t]
    for family in ("ip", "ip6"):
        for table in ("filter", "nat", "mangle"):
            listing = procs.run(["nft", "list", "table", family, table], check=False)
            found += [f"{family} {table} chain {c}" for c in _chain_names(listing) if c.startswith("KUBE-")]
    if (workdir / "node" / "containerd-state").exists():
        found.append(f"containerd state {workdir / 'node' / 'containerd-state'}")
    if MACHINE_RECORD.exists():
        found.append(f"machine record {MACHINE_RECORD}")
    return found


def _chain_names(listing: str) -> list[str]:
    return [line.split()[1] for line in listing.splitlines() if line.strip().startswith("chain ")]
