"""Certificates of the local cluster, made with the ``openssl`` command (OpenSSL 3).

One CA signs every serving and client certificate; the service-account signing key is separate.
Client certificates name their Kubernetes user in CN and groups in O, as kubeadm's do.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hack.procs import ClusterError

ADMIN_USER = "kubeinfer-admin"
NODE_NAME = "kubeinfer-node"


@dataclass(frozen=True)
class Leaf:
    """One certificate signed by the CA: file stem, subject (``/O=group/CN=user``) and extensions."""

    name: str
    subject: str
    server_sans: tuple[str, ...] = ()  # serving certificate when set: "IP:..." / "DNS:..." entries

    def extensions(self) -> str:
        base = (
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        if self.server_sans:
            return base + f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(self.server_sans)}\n"
        return base + "extendedKeyUsage=clientAuth\n"


def control_plane_leaves(api_ips: Sequence[str], service_ip: str) -> list[Leaf]:
    """API server serving certificate (SANs: ``api_ips``, the ``kubernetes`` Service IP and names),
    the admin's and kube-controller-manager's client certificates (group ``system:masters``)."""
    sans = [f"IP:{ip}" for ip in (*api_ips, service_ip)] + [
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    return [
        Leaf("apiserver", "/CN=kube-apiserver", tuple(sans)),
        Leaf("admin", f"/O=system:masters/CN={ADMIN_USER}"),
        Leaf("kcm", "/O=system:masters/CN=system:kube-controller-manager"),
    ]


def node_leaves(node_ip: str) -> list[Leaf]:
    """Certificates of the node's components, each a user the default RBAC policy knows:
    ``system:kube-scheduler``, ``system:node:<node>`` (group ``system:nodes``, the Node authorizer),
    ``system:kube-proxy`` (bound to ``system:node-proxier``), CoreDNS's own user, the kubelet's
    serving certificate, and the API server's client certificate towards the kubelet (logs, exec)."""
    return [
        Leaf("scheduler", "/CN=system:kube-scheduler"),
        Leaf("kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}"),
        Leaf("kubelet-serving", f"/CN={NODE_NAME}", (f"IP:{node_ip}", "IP:127.0.0.1", f"DNS:{NODE_NAME}")),
        Leaf("kube-proxy", "/CN=system:kube-proxy"),
        Leaf("coredns", "/CN=kubeinfer:coredns"),
        Leaf("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"),
    ]


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")


def make_pki(pki: Path, leaves: Sequence[Leaf]) -> None:
    """Write ca.{crt,key}, ``<leaf>.{crt,key}`` for each leaf and sa.{key,pub} (PEM) into ``pki``.

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
    for leaf in leaves:
        name = leaf.name
        (pki / f"{name}.ext").write_text(leaf.extensions())
        _openssl(
            "req",
            "-new",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            leaf.subject,
            cwd=pki,
        )
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "30", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=pki,
        )  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.glob("*.key"):
        p.chmod(0o600)
