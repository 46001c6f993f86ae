#!/usr/bin/env python3
"""A real local Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

CLI (used by ``make cluster-up`` / ``make cluster-down``)::

    python hack/cluster.py up      # starts it under .cache/cluster/, prints the kubeconfig path
    python hack/cluster.py status  # pids, ports, health
    python hack/cluster.py down    # stops exactly the recorded processes, removes data + kubeconfig

Python API (used by ``tests/support/cluster.py`` and the demo)::

    from hack.cluster import start, stop, ClusterInfo
    info = start(Path("/tmp/work"))          # -> ClusterInfo (kubeconfig, server, ca_path, pids, ...)
    stop(info)                               # or stop(Path("/tmp/work"))

Several clusters may run at once, one per work directory: every listener is a free loopback port
chosen at start (and chosen again when a port is taken between choice and bind).

What runs (flags modelled on controller-runtime's envtest, with RBAC on):

- etcd (built from go.etcd.io/etcd/server/v3, see hack/go.mod), data in ``<workdir>/etcd``,
  ``--unsafe-no-fsync`` since the data is throwaway.
- kube-apiserver: ``--authorization-mode=RBAC``, self-signed CA and serving certificate, client
  certificate authentication (the admin's certificate carries ``O=system:masters``), a static
  admin token (``--token-auth-file``), service-account signing keys and
  ``--service-account-issuer``.
- kube-controller-manager with its own kubeconfig (a ``system:masters`` client certificate) and the
  controllers kubeinfer relies on: deployment, replicaset, garbage collector (owner references),
  namespace, serviceaccount(+token), endpoints/endpointslice, disruption (PodDisruptionBudget
  status), resourcequota, root-ca-certificate publisher. There is no kubelet and no scheduler:
  Pods are created but never run (``hack/localpods.py`` stands in for the kubelet in the demo).

Certificates and keys are made with the ``openssl`` command (OpenSSL 3).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN_DIR = ROOT / ".cache" / "bin"
DEFAULT_WORKDIR = ROOT / ".cache" / "cluster"
STATE_FILE = "state.json"
CLUSTER_NAME = "kubeinfer-local"
ADMIN_USER = "kubeinfer-admin"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ISSUER = "https://kubernetes.default.svc.cluster.local"
KUBERNETES_VERSION = "v1.37.2"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")
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
)


class ClusterError(RuntimeError):
    """The control plane could not be started, reached or stopped; the message says which part."""


@dataclass(frozen=True)
class ClusterInfo:
    """A running local control plane.

    Attributes:
        workdir: directory holding everything of this cluster (data, pki, kubeconfig, logs).
        kubeconfig: admin kubeconfig (client certificate of group ``system:masters``, CA embedded).
        server: API server URL, ``https://127.0.0.1:<port>``.
        ca_path: PEM of the CA that signed the serving and client certificates.
        admin_token: bearer token of the admin user (group ``system:masters``).
        client_cert, client_key: PEM paths of the admin client certificate.
        pids: ``{"etcd": pid, "kube-apiserver": pid, "kube-controller-manager": pid}``.
        ports: ``{"etcd": client port, "etcd-peer": port, "kube-apiserver": port}``.
        bin_dir: where the binaries were taken from; kubectl_path / helm_path inside it.
        log_dir: one ``<component>.log`` per process.
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

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def helm_path(self) -> Path:
        return self.bin_dir / "helm"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterInfo:
        paths = {"workdir", "kubeconfig", "ca_path", "client_cert", "client_key", "bin_dir", "log_dir"}
        return cls(**{k: (Path(v) if k in paths else v) for k, v in d.items()})


# ----------------------------------------------------------------------------- pure helpers


def free_port(host: str = "127.0.0.1", exclude: Iterable[int] = ()) -> int:
    """Return a TCP port on ``host`` that the OS reports free right now (bind to port 0).

    The port is released before returning, so another process may take it: callers that start a
    server on it must handle "address already in use" by choosing again. Ports in ``exclude`` are
    never returned (raises ClusterError after 50 tries).
    """
    excluded = set(exclude)
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in excluded:
            return port
    raise ClusterError("could not find a free port")


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


def apiserver_args(
    *,
    etcd_url: str,
    port: int,
    pki: Path,
    token_file: Path,
) -> list[str]:
    """kube-apiserver flags (after envtest's defaults, with RBAC and service-account keys)."""
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--endpoint-reconciler-type=none",
        "--v=1",
    ]


def controller_manager_args(*, kubeconfig: Path, pki: Path) -> list[str]:
    """kube-controller-manager flags: the controllers listed in KCM_CONTROLLERS, no HTTPS serving."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--controllers={','.join(KCM_CONTROLLERS)}",
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


# ----------------------------------------------------------------------------- pki


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """Write ca.{crt,key}, apiserver.{crt,key}, admin.{crt,key}, kcm.{crt,key}, sa.{key,pub} (PEM).

    EC P-256 certificates valid 30 days; the service-account signing key is RSA 2048 (RS256).
    Raises ClusterError when openssl is missing or fails.
    """
    if shutil.which("openssl") is None:
        raise ClusterError("the openssl command is missing (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
        "-subj", "/CN=kubeinfer-local-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=pki,
    )  # fmt: skip
    leaves = {
        "apiserver": (
            "/CN=kube-apiserver",
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,"
            "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local\n",
        ),
        "admin": (f"/O=system:masters/CN={ADMIN_USER}", "extendedKeyUsage=clientAuth\n"),
        "kcm": ("/O=system:masters/CN=system:kube-controller-manager", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subj, ext) in leaves.items():
        (pki / f"{name}.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n" + ext
        )
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=pki)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "30", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=pki,
        )  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.glob("*.key"):
        p.chmod(0o600)


# ----------------------------------------------------------------------------- processes


def _proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _is_ours(pid: int, start_time: int | None) -> bool:
    """True when ``pid`` is alive and is the process we recorded (same start time, not a zombie)."""
    st = _proc_start_time(pid)
    if st is None or (start_time is not None and st != start_time):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the thread that started it
    exits (Linux ``prctl(PR_SET_PDEATHSIG)``), so a killed test run or demo leaves no process behind.
    Runs in the child between fork and exec; a failing ``prctl`` is ignored."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _spawn(cmd: list[str], log: Path, with_parent: bool) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent if with_parent else None,
        )


def _terminate(pid: int, start_time: int | None, name: str, timeout: float = 10.0) -> bool:
    """SIGTERM then SIGKILL the recorded process; True when something was stopped."""
    if not _is_ours(pid, start_time):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _is_ours(pid, start_time):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return 0, b""


# ----------------------------------------------------------------------------- start / stop


def check_binaries(bin_dir: Path = DEFAULT_BIN_DIR, names: Sequence[str] = BINARIES) -> None:
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
    if not all(_is_ours(p, info.start_times.get(n)) for n, p in info.pids.items()):
        return False
    ctx = _ssl_context(info.ca_path, info.client_cert, info.client_key)
    return _get(f"{info.server}/readyz", ctx)[0] == 200


def start(
    workdir: Path = DEFAULT_WORKDIR,
    *,
    bin_dir: Path = DEFAULT_BIN_DIR,
    timeout: float = 90.0,
    die_with_parent: bool = False,
    log: Any = None,
) -> ClusterInfo:
    """Start etcd, kube-apiserver and kube-controller-manager for ``workdir`` and wait until ready.

    Ready means: ``/readyz`` of the API server is 200 and kube-controller-manager has created the
    ``default`` ServiceAccount in namespace ``default`` (so its controllers run). A healthy cluster
    already recorded in ``workdir`` is returned as is; a stale one (crashed processes, leftover
    data) is cleaned up first. A port taken between choice and bind makes it choose new ports
    (3 attempts). ``die_with_parent`` sets PR_SET_PDEATHSIG so the processes die with the caller
    (pytest). ``log`` is a callable taking a progress string (default: print to stderr).

    Raises ClusterError (with the failing component's log tail) on missing binaries, a process
    exiting early, or ``timeout`` seconds passing.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    workdir = workdir.resolve()
    bin_dir = bin_dir.resolve()
    check_binaries(bin_dir, ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"))
    old = _load_state(workdir)
    if old is not None:
        if is_healthy(old):
            say(f"cluster already running in {workdir}")
            return old
        say(f"stale cluster state in {workdir}: cleaning up")
        stop(workdir, log=say)
    elif workdir.exists() and any(workdir.iterdir()):
        _remove_data(workdir, say)
    last_error: ClusterError | None = None
    for attempt in range(3):
        try:
            return _start_once(workdir, bin_dir, timeout, die_with_parent, say)
        except _PortTaken as e:
            last_error = e
            say(f"a port was taken ({e}); retrying with new ports (attempt {attempt + 2}/3)")
            stop(workdir, log=lambda _m: None)
    raise ClusterError(f"could not start the control plane: {last_error}")


class _PortTaken(ClusterError):
    pass


def _start_once(workdir: Path, bin_dir: Path, timeout: float, die_with_parent: bool, say: Any) -> ClusterInfo:
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    pki, logs = workdir / "pki", workdir / "logs"
    make_pki(pki)
    token = base64.urlsafe_b64encode(os.urandom(24)).decode("ascii").rstrip("=")
    token_file = pki / "tokens.csv"
    token_file.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    token_file.chmod(0o600)
    etcd_port = free_port()
    peer_port = free_port(exclude={etcd_port})
    api_port = free_port(exclude={etcd_port, peer_port})
    server = f"https://127.0.0.1:{api_port}"
    ca_pem = (pki / "ca.crt").read_bytes()
    kubeconfig = workdir / "kubeconfig"
    _write_yaml(
        kubeconfig,
        render_kubeconfig(
            server,
            ca_pem,
            user=ADMIN_USER,
            client_cert_pem=(pki / "admin.crt").read_bytes(),
            client_key_pem=(pki / "admin.key").read_bytes(),
        ),
    )
    kcm_kubeconfig = pki / "kcm.kubeconfig"
    _write_yaml(
        kcm_kubeconfig,
        render_kubeconfig(
            server,
            ca_pem,
            user="system:kube-controller-manager",
            client_cert_pem=(pki / "kcm.crt").read_bytes(),
            client_key_pem=(pki / "kcm.key").read_bytes(),
        ),
    )
    cmds = {
        "etcd": [
            str(bin_dir / "etcd"),
            *etcd_args(data_dir=workdir / "etcd", client_port=etcd_port, peer_port=peer_port),
        ],
        "kube-apiserver": [
            str(bin_dir / "kube-apiserver"),
            *apiserver_args(
                etcd_url=f"http://127.0.0.1:{etcd_port}", port=api_port, pki=pki, token_file=token_file
            ),
        ],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"),
            *controller_manager_args(kubeconfig=kcm_kubeconfig, pki=pki),
        ],
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for name, cmd in cmds.items():
        procs[name] = _spawn(cmd, logs / f"{name}.log", die_with_parent)
    info = ClusterInfo(
        workdir=workdir,
        kubeconfig=kubeconfig,
        server=server,
        ca_path=pki / "ca.crt",
        admin_token=token,
        client_cert=pki / "admin.crt",
        client_key=pki / "admin.key",
        pids={n: p.pid for n, p in procs.items()},
        ports={"etcd": etcd_port, "etcd-peer": peer_port, "kube-apiserver": api_port},
        bin_dir=bin_dir,
        log_dir=logs,
        start_times={n: _proc_start_time(p.pid) or 0 for n, p in procs.items()},
    )
    (workdir / STATE_FILE).write_text(json.dumps(info.to_json(), indent=2))
    say(f"started etcd :{etcd_port}, kube-apiserver :{api_port}, kube-controller-manager (logs: {logs})")
    ctx = _ssl_context(info.ca_path, info.client_cert, info.client_key)
    deadline = t0 + timeout
    stage = "kube-apiserver /readyz"
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                tail = _log_tail(logs / f"{name}.log")
                err = f"{name} exited with code {p.returncode}; log tail:\n{tail}"
                if "address already in use" in tail:
                    raise _PortTaken(err)
                stop(workdir, log=lambda _m: None)
                raise ClusterError(err)
        if stage == "kube-apiserver /readyz":
            if _get(f"{server}/readyz", ctx)[0] == 200:
                say(f"kube-apiserver ready after {time.monotonic() - t0:.1f}s")
                stage = "kube-controller-manager (default ServiceAccount)"
        else:
            code, _ = _get(f"{server}/api/v1/namespaces/default/serviceaccounts/default", ctx)
            if code == 200:
                say(f"control plane ready after {time.monotonic() - t0:.1f}s; kubeconfig: {kubeconfig}")
                return info
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n}:\n{_log_tail(logs / f'{n}.log', 8)}" for n in procs)
            stop(workdir, log=lambda _m: None)
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {stage}\n{tails}")
        time.sleep(0.2)


def _write_yaml(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


def _remove_data(workdir: Path, say: Any) -> list[Path]:
    removed = []
    for name in ("etcd", "pki", "kubeconfig", STATE_FILE, "kubeconfigs"):
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
    """Stop exactly the processes recorded for the cluster and remove its data and kubeconfig.

    ``target`` is a ClusterInfo or its work directory. Processes are matched by pid AND start time
    (a reused pid is left alone); kube-controller-manager goes first, etcd last. Logs under
    ``<workdir>/logs`` are kept. Returns the removed paths. Safe to call twice or on a crashed
    cluster.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    workdir = (target.workdir if isinstance(target, ClusterInfo) else target).resolve()
    info = target if isinstance(target, ClusterInfo) else _load_state(workdir)
    if info is not None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            pid = info.pids.get(name)
            if pid is not None and _terminate(pid, info.start_times.get(name), name):
                say(f"stopped {name} (pid {pid})")
    return _remove_data(workdir, say)


# ----------------------------------------------------------------------------- other credentials


def kubeconfig_for_token(
    info: ClusterInfo, token: str, path: Path, *, user: str = "token-user", namespace: str | None = None
) -> Path:
    """Write a kubeconfig for ``info``'s API server that authenticates with bearer ``token``."""
    doc = render_kubeconfig(
        info.server, info.ca_path.read_bytes(), user=user, token=token, namespace=namespace
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_yaml(path, doc)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_yaml(path, doc)
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="default: .cache/cluster")
    ap.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR, help="default: .cache/bin")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    args = ap.parse_args(argv)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            info = start(args.workdir, bin_dir=args.bin_dir, timeout=args.timeout)
            print(f"# up in {time.monotonic() - t0:.1f}s; server {info.server}", file=sys.stderr)
            print(f"export KUBECONFIG={info.kubeconfig}", file=sys.stderr)
            print(info.kubeconfig)
        elif args.command == "down":
            removed = stop(args.workdir)
            if not removed:
                print(f"nothing to remove in {args.workdir}", file=sys.stderr)
        else:
            info = _load_state(args.workdir.resolve())
            if info is None:
                print(f"no cluster recorded in {args.workdir}")
                return 1
            for n, p in info.pids.items():
                alive = "running" if _is_ours(p, info.start_times.get(n)) else "NOT running"
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
