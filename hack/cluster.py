#!/usr/bin/env python3
"""The local Kubernetes cluster: a control plane alone, or a one-node cluster whose pods really run.

CLI (used by ``make cluster-up`` / ``make cluster-down``)::

    python hack/cluster.py up [--node|--no-node]   # under .cache/cluster/; prints the kubeconfig path
    python hack/cluster.py status                  # pids, ports, health
    python hack/cluster.py down                    # stops everything recorded, removes what it made
    python hack/cluster.py leftovers               # what a stopped node left on this machine (none)
    python hack/cluster.py preload                 # the built images into the node's image store, no node

Python API (tests, the demo, the benchmarks)::

    from hack.cluster import start, stop, ClusterInfo
    info = start(Path("/tmp/work"), node=True)   # -> ClusterInfo (kubeconfig, server, ca_path, pids, ...)
    stop(info)                                   # or stop(Path("/tmp/work"))

Composed from one module per component, each with its own start/stop and cleanup, in the order they
start: hack/podnetwork.py (bridge, CNI), hack/controlplane.py (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), hack/node.py (containerd, kubelet, kube-proxy, CoreDNS),
hack/images.py (the images the node runs). Without a node (the integration tests) the API server
listens on loopback and several control planes run side by side, each on free ports; a node is one
per machine (hack/node.py says why), and a second one is refused with a clear message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hack import controlplane, podnetwork
from hack import node as nodes  # ``node`` is start()'s flag
from hack.controlplane import ControlPlane, render_kubeconfig, write_yaml
from hack.pki import node_leaves
from hack.procs import ClusterError, is_ours

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN_DIR = ROOT / ".cache" / "bin"
DEFAULT_WORKDIR = ROOT / ".cache" / "cluster"
STATE_FILE = "state.json"
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")

__all__ = ["ClusterError", "ClusterInfo", "check_binaries", "is_healthy", "start", "stop"]


@dataclass(frozen=True)
class ClusterInfo:
    """A running local cluster.

    Attributes:
        workdir: directory holding everything of this cluster (data, pki, kubeconfig, logs).
        kubeconfig: admin kubeconfig (client certificate of group ``system:masters``, CA embedded).
        server: API server URL, ``https://127.0.0.1:<port>`` (``https://<node address>:<port>``
            with a node, so that pods reach it too).
        ca_path: PEM of the CA that signed the serving and client certificates.
        admin_token: bearer token of the admin user (group ``system:masters``).
        client_cert, client_key: PEM paths of the admin client certificate.
        pids: ``{component: pid}`` of every process started.
        ports: ``{name: port}`` of every listener chosen at start.
        bin_dir: where the binaries were taken from; kubectl_path / helm_path inside it.
        log_dir: one ``<component>.log`` per process.
        node: whether a node (kubelet, containerd, ...) runs; cri_endpoint and sysctls with it.
    """

    workdir: Path
    kubeconfig: Path
    server: str
    ca_path: Path
    admin_token: str
    client_cert: Path
    client_key: Path
    pids: dict[str, int]
    ports: dict[str, int]
    bin_dir: Path
    log_dir: Path
    start_times: dict[str, int] = field(default_factory=dict)
    node: bool = False
    cri_endpoint: str = ""
    sysctls: dict[str, str] = field(default_factory=dict)

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def helm_path(self) -> Path:
        return self.bin_dir / "helm"

    @property
    def crictl(self) -> list[str]:
        """``crictl`` with this node's CRI endpoint (empty without a node)."""
        if not self.node:
            return []
        return [str(self.bin_dir / "crictl"), "--runtime-endpoint", self.cri_endpoint]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterInfo:
        paths = {"workdir", "kubeconfig", "ca_path", "client_cert", "client_key", "bin_dir", "log_dir"}
        return cls(**{k: (Path(v) if k in paths else v) for k, v in d.items()})

    def _control_plane(self) -> ControlPlane:
        names = controlplane.COMPONENTS
        return ControlPlane(
            server=self.server,
            pids={n: p for n, p in self.pids.items() if n in names},
            start_times={n: t for n, t in self.start_times.items() if n in names},
            ports=self.ports,
            kubeconfig=self.kubeconfig,
            admin_token=self.admin_token,
        )

    def _node(self) -> nodes.Node | None:
        if not self.node:
            return None
        return nodes.Node(
            pids={n: p for n, p in self.pids.items() if n in nodes.COMPONENTS},
            start_times={n: t for n, t in self.start_times.items() if n in nodes.COMPONENTS},
            ports=self.ports,
            endpoint=self.cri_endpoint,
            sysctls=self.sysctls,
        )


def check_binaries(bin_dir: Path = DEFAULT_BIN_DIR, names: Sequence[str] = CONTROL_PLANE_BINARIES) -> None:
    """Raise ClusterError naming every missing binary, with the command that builds them."""
    missing = [n for n in names if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        raise ClusterError(
            f"missing control-plane binaries in {bin_dir}: {', '.join(missing)}; run `make setup` "
            "(builds them from hack/go.mod with Go)"
        )


def _load_state(workdir: Path) -> ClusterInfo | None:
    try:
        return ClusterInfo.from_json(json.loads((workdir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_healthy(info: ClusterInfo) -> bool:
    """All recorded processes alive and the API server answers /readyz with 200."""
    if not all(is_ours(p, info.start_times.get(n)) for n, p in info.pids.items()):
        return False
    return controlplane.is_ready(info._control_plane(), info.workdir / "pki")


def _no_images(_ctr: Path, _socket: str) -> None:
    return None


def start(
    workdir: Path = DEFAULT_WORKDIR,
    *,
    node: bool = False,
    bin_dir: Path = DEFAULT_BIN_DIR,
    timeout: float = 90.0,
    die_with_parent: bool = False,
    load_images: Callable[[Path, str], None] | None = None,
    log: Any = None,
) -> ClusterInfo:
    """Start a cluster in ``workdir`` and wait until it is ready.

    Without ``node``: etcd, kube-apiserver (loopback) and kube-controller-manager; ready when
    ``/readyz`` is 200 and the ``default`` ServiceAccount exists. With ``node``: first the pod network,
    then the control plane on the node address plus kube-scheduler, then containerd, the images
    (``load_images(ctr_path, containerd_socket)``, default: hack.images.load of what is built),
    kubelet, kube-proxy and CoreDNS; ready when the node is Ready and DNS answers.

    A healthy cluster already recorded in ``workdir`` is returned as is; a stale one (crashed
    processes, leftover data) is cleaned up first. A port taken between choice and bind makes it
    choose new ports (3 attempts). ``die_with_parent`` sets PR_SET_PDEATHSIG so the processes die
    with the caller (pytest). ``log`` is a callable taking a progress string (default: stderr).

    Raises ClusterError (with the failing component's log tail) on missing binaries, another node
    on this machine, a process exiting early, or ``timeout`` seconds passing (per attempt; with a
    node, the node gets ``timeout`` more).
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    workdir = workdir.resolve()
    bin_dir = bin_dir.resolve()
    _preflight(workdir, bin_dir, node, say)
    old = _running_or_cleaned(workdir, node, say)
    if old is not None:
        return old
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cni_conf_dir = podnetwork.up(workdir / "node" / "net", say) if node else None
    cp = _start_control_plane(workdir, bin_dir, node, timeout, die_with_parent, say)
    info = _info(workdir, bin_dir, cp, None)
    _save(info)
    if node:
        assert cni_conf_dir is not None
        try:
            started = _start_node(
                workdir, bin_dir, cp, cni_conf_dir, load_images, die_with_parent, timeout, say
            )
        except BaseException:
            stop(info, log=lambda _m: None)
            raise
        info = _info(workdir, bin_dir, cp, started)
        _save(info)
    say(f"cluster ready after {time.monotonic() - t0:.1f}s; kubeconfig: {info.kubeconfig}")
    return info


def _preflight(workdir: Path, bin_dir: Path, node: bool, say: Any) -> None:
    """The binaries and tools ``start`` needs; with ``node``, a node recorded elsewhere whose
    processes are gone is cleaned up first (a killed run's pods, shims and mounts would share the
    bridge and its addresses)."""
    check_binaries(bin_dir, ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"))
    if not node:
        return
    check_binaries(bin_dir, ("kube-scheduler",))
    nodes.preflight(workdir, bin_dir)
    podnetwork.check_tools()
    stale = nodes.stale_elsewhere(workdir)
    if stale is not None:
        say(f"a node recorded in {stale} was not stopped (its processes are gone): cleaning it up")
        nodes.stop(Path(stale), None, bin_dir=bin_dir, say=say)
        podnetwork.down(Path(stale) / "node" / "net", say)


def _running_or_cleaned(workdir: Path, node: bool, say: Any) -> ClusterInfo | None:
    """The healthy cluster of the same kind recorded in ``workdir`` (None: there is none, and a
    stale one or leftover data has been removed)."""
    old = _load_state(workdir)
    if old is not None:
        if is_healthy(old) and old.node == node:
            say(f"cluster already running in {workdir}")
            return old
        say(f"stale cluster state in {workdir}: cleaning up")
        stop(workdir, log=say)
    elif workdir.exists() and any(workdir.iterdir()):
        _remove_data(workdir, say)
    return None


def _start_control_plane(
    workdir: Path, bin_dir: Path, node: bool, timeout: float, die_with_parent: bool, say: Any
) -> ControlPlane:
    """``controlplane.start`` on the node address (loopback without a node), with new ports when
    one was taken (3 attempts). On failure (Ctrl-C too) the pod network goes down: its bridge and
    guard table are not recorded anywhere yet."""
    bind_ip = podnetwork.NODE_IP if node else "127.0.0.1"
    last_error: ClusterError | None = None
    for attempt in range(3):
        try:
            return controlplane.start(
                workdir,
                bin_dir=bin_dir,
                bind_ip=bind_ip,
                extra_leaves=node_leaves(podnetwork.NODE_IP) if node else (),
                with_node=node,
                timeout=timeout,
                die_with_parent=die_with_parent,
                say=say,
            )
        except controlplane.PortTaken as e:
            last_error = e
            say(f"a port was taken ({e}); retrying with new ports (attempt {attempt + 2}/3)")
        except BaseException:
            if node:
                podnetwork.down(workdir / "node" / "net", say)
            raise
    if node:
        podnetwork.down(workdir / "node" / "net", say)
    raise ClusterError(f"could not start the control plane: {last_error}")


def _start_node(
    workdir: Path,
    bin_dir: Path,
    cp: ControlPlane,
    cni_conf_dir: Path,
    load_images: Callable[[Path, str], None] | None,
    die_with_parent: bool,
    timeout: float,
    say: Any,
) -> nodes.Node:
    if load_images is None:
        load_images = _load_built_images(say)

    return nodes.start(
        workdir,
        bin_dir=bin_dir,
        server=cp.server,
        pki=workdir / "pki",
        admin_kubeconfig=cp.kubeconfig,
        cni_conf_dir=cni_conf_dir,
        load_images=load_images,
        die_with_parent=die_with_parent,
        timeout=timeout,
        say=say,
    )


def _load_built_images(say: Any) -> Callable[[Path, str], None]:
    """The default image loader of a node: the pause image (built now if needed: seconds) and every
    other image ``make images`` has built; those not built are named, with the command."""
    from hack import images

    def load(ctr: Path, socket: str) -> None:
        images.build(["pause"], log=say)
        built = [n for n in images.NODE_IMAGES if images.image_hash(images.IMAGES[n].ref) is not None]
        missing = sorted(set(images.NODE_IMAGES) - set(built))
        if missing:
            say(f"images not built yet: {', '.join(missing)} (`make images`; pods using them cannot start)")
        images.load(ctr, socket, names=built, log=say)

    return load


def _info(workdir: Path, bin_dir: Path, cp: ControlPlane, started: nodes.Node | None) -> ClusterInfo:
    pki = workdir / "pki"
    return ClusterInfo(
        workdir=workdir,
        kubeconfig=cp.kubeconfig,
        server=cp.server,
        ca_path=pki / "ca.crt",
        admin_token=cp.admin_token,
        client_cert=pki / "admin.crt",
        client_key=pki / "admin.key",
        pids=cp.pids | (started.pids if started else {}),
        ports=cp.ports | (started.ports if started else {}),
        bin_dir=bin_dir,
        log_dir=workdir / "logs",
        start_times=cp.start_times | (started.start_times if started else {}),
        node=started is not None,
        cri_endpoint=started.endpoint if started else "",
        sysctls=started.sysctls if started else {},
    )


def _save(info: ClusterInfo) -> None:
    (info.workdir / STATE_FILE).write_text(json.dumps(info.to_json(), indent=2))


def _remove_data(workdir: Path, say: Any) -> list[Path]:
    removed = []
    for name in ("etcd", "pki", "kubeconfig", STATE_FILE, "kubeconfigs", "node"):
        p = workdir / name
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
        else:
            continue
        removed.append(p)
        say(f"removed {p}")
    return removed


def stop(target: ClusterInfo | Path = DEFAULT_WORKDIR, *, log: Any = None) -> list[Path]:
    """Stop everything recorded for the cluster and remove what it made; logs are kept.

    ``target`` is a ClusterInfo or its work directory. Processes are matched by pid AND start time
    (a reused pid is left alone). The node goes first (hack/node.py: pods, containerd, mounts,
    cgroups, rules), then the control plane, then the pod network. Returns the removed paths. Safe
    to call twice or on a crashed cluster.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    workdir = (target.workdir if isinstance(target, ClusterInfo) else target).resolve()
    info = target if isinstance(target, ClusterInfo) else _load_state(workdir)
    has_node = (info is not None and info.node) or (workdir / "node").exists()
    if has_node:
        nodes.stop(
            workdir,
            info._node() if info is not None else None,
            bin_dir=info.bin_dir if info else DEFAULT_BIN_DIR,
            say=say,
        )
    if info is not None:
        controlplane.stop(info._control_plane(), say=say)
    if has_node and nodes.running_elsewhere(workdir) is None:  # the bridge is machine-wide
        podnetwork.down(workdir / "node" / "net", say)
    return _remove_data(workdir, say)


def leftovers(workdir: Path = DEFAULT_WORKDIR) -> list[str]:
    """What a stopped node and pod network left behind on this machine (empty when clean)."""
    return nodes.leftovers(workdir.resolve()) + podnetwork.leftovers()


# ----------------------------------------------------------------------------- other credentials


def kubeconfig_for_token(
    info: ClusterInfo, token: str, path: Path, *, user: str = "token-user", namespace: str | None = None
) -> Path:
    """Write a kubeconfig for ``info``'s API server that authenticates with bearer ``token``."""
    doc = render_kubeconfig(
        info.server, info.ca_path.read_bytes(), user=user, token=token, namespace=namespace
    )
    write_yaml(path, doc)
    return path


def kubeconfig_for_impersonation(
    info: ClusterInfo, path: Path, *, user: str, groups: Sequence[str] = (), namespace: str | None = None
) -> Path:
    """Write an admin kubeconfig that impersonates ``user`` (``as``/``as-groups``: kubectl, helm)."""
    doc = render_kubeconfig(
        info.server,
        info.ca_path.read_bytes(),
        user=f"as-{user}",
        client_cert_pem=info.client_cert.read_bytes(),
        client_key_pem=info.client_key.read_bytes(),
        namespace=namespace,
        impersonate=user,
        impersonate_groups=groups,
    )
    write_yaml(path, doc)
    return path


def service_account_token(info: ClusterInfo, namespace: str, name: str, duration_s: int = 3600) -> str:
    """A TokenRequest token for ServiceAccount ``namespace/name`` (``kubectl create token``)."""
    r = subprocess.run(
        [
            str(info.kubectl_path),
            f"--kubeconfig={info.kubeconfig}",
            "create",
            "token",
            name,
            "-n",
            namespace,
            f"--duration={duration_s}s",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise ClusterError(f"kubectl create token {namespace}/{name} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def kubeconfig_for_service_account(
    info: ClusterInfo, namespace: str, name: str, path: Path, duration_s: int = 3600
) -> Path:
    """Write a kubeconfig that acts as ServiceAccount ``namespace/name`` with a fresh token.

    Works with every client (Python ``kubernetes`` included), unlike impersonation.
    """
    token = service_account_token(info, namespace, name, duration_s)
    return kubeconfig_for_token(
        info, token, path, user=f"system:serviceaccount:{namespace}:{name}", namespace=namespace
    )


# ----------------------------------------------------------------------------- CLI


def _preload(workdir: Path, bin_dir: Path) -> None:
    """``preload``: the built images into the node's image store with a containerd of its own (in
    ``WORKDIR/../preload``), no node. `make test` runs it beside the unit tier (``hack/test.sh``) and
    starts the e2e tier when it is done, so the e2e session's node finds the images current instead of
    importing them (minutes after a rebuild).
    Raises ClusterError (an image error included)."""
    from hack.images import ImageError

    t0 = time.monotonic()
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        done = nodes.preload(
            workdir.resolve().parent / "preload",
            bin_dir=bin_dir.resolve(),
            load_images=_load_built_images(say),
            say=say,
        )
    except ImageError as e:
        raise ClusterError(str(e)) from e
    if done:
        say(f"# images preloaded in {time.monotonic() - t0:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("command", choices=["up", "down", "status", "leftovers", "preload"])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="default: .cache/cluster")
    ap.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR, help="default: .cache/bin")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    ap.add_argument(
        "--node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also start a node (containerd, kubelet, kube-proxy, CoreDNS; needs root) (default: on)",
    )
    args = ap.parse_args(argv)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            info = start(args.workdir, node=args.node, bin_dir=args.bin_dir, timeout=args.timeout)
            print(f"# up in {time.monotonic() - t0:.1f}s; server {info.server}", file=sys.stderr)
            print(f"export KUBECONFIG={info.kubeconfig}", file=sys.stderr)
            print(info.kubeconfig)
        elif args.command == "down":
            had_node = (args.workdir / "node").exists()
            removed = stop(args.workdir)
            if not removed:
                print(f"nothing to remove in {args.workdir}", file=sys.stderr)
            left = leftovers(args.workdir) if had_node else []
            if left:
                print("left behind:\n  " + "\n  ".join(left), file=sys.stderr)
                return 1
        elif args.command == "preload":
            _preload(args.workdir, args.bin_dir)
        elif args.command == "leftovers":
            left = leftovers(args.workdir)
            print("\n".join(left) if left else "nothing left behind")
            return 1 if left else 0
        else:
            info = _load_state(args.workdir.resolve())
            if info is None:
                print(f"no cluster recorded in {args.workdir}")
                return 1
            for n, p in info.pids.items():
                alive = "running" if is_ours(p, info.start_times.get(n)) else "NOT running"
                print(f"{n:24s} pid {p:<8d} {alive}")
            healthy = is_healthy(info)
            print(f"server {info.server}  readyz: {'ok' if healthy else 'FAILING'}")
            print(f"kubeconfig {info.kubeconfig}")
            return 0 if healthy else 1
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
