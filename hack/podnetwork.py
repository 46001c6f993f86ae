"""The pod network of the local node: one Linux bridge, a private pod CIDR, and CNI configuration
for containerd (the Debian ``containernetworking-plugins``: bridge, host-local, portmap, loopback).

Pods get addresses from POD_CIDR and two routes: their own subnet (on the bridge) and the Service
CIDR (through the bridge's address, where kube-proxy translates ClusterIPs). They get no default
route, there is no masquerade, and a guard table drops anything the host would forward from the
bridge to another interface (IPv4 and IPv6, whatever the source address): no pod can send to an
address outside this machine. Services of the host itself on the node address stay reachable to
pods, as on any node. The bridge's address is the node's address: the API server, CoreDNS and the
kubelet listen on it. The CNI bridge plugin turns ``net.ipv4.ip_forward`` on (hack/node.py puts it
back at stop); pod to pod through a ClusterIP on the bridge needs ``br_netfilter`` with
``net.bridge.bridge-nf-call-iptables=1``.

``up``/``down`` are idempotent; ``leftovers`` lists what a stopped network left behind (a test
asserts it is empty after ``make cluster-down``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import procs
from hack.controlplane import SERVICE_CIDR

BRIDGE = "kubeinfer0"
POD_CIDR = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
PREFIX_LEN = 24
#: nftables table of the guard rule (family inet).
GUARD_TABLE = "kubeinfer_guard"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
NETWORK_NAME = "kubeinfer"

Say = Callable[[str], None]


def cni_conflist(ipam_dir: Path) -> dict[str, Any]:
    """The CNI network configuration list (CNI spec 1.0.0) of the pod network.

    ``bridge`` attaches each pod's veth to BRIDGE (hairpin on, so a pod reaches itself through its
    Service), without IP masquerade; ``host-local`` IPAM hands out POD_CIDR addresses, keeping its
    leases in ``ipam_dir``, with a route to SERVICE_CIDR only (no default route); ``portmap`` serves
    ``hostPort``.
    """
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": SERVICE_CIDR, "gw": NODE_IP}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def guard_ruleset() -> str:
    """nftables script of the guard table: drop whatever the host would forward from the bridge to
    any other interface, IPv4 and IPv6, whatever its source address (a pod with CAP_NET_RAW can forge
    one). Pod to pod, also through a ClusterIP, stays on the bridge and passes."""
    return (
        f"table inet {GUARD_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority -10; policy accept;\n"
        f'    iifname "{BRIDGE}" oifname != "{BRIDGE}" counter drop\n'
        "  }\n"
        "}\n"
    )


def check_tools() -> None:
    """Raise ClusterError naming what is missing: ``ip``, ``nft`` or a CNI plugin."""
    missing = [t for t in ("ip", "nft") if not _which(t)]
    missing += [str(CNI_BIN_DIR / p) for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
    if missing:
        raise procs.ClusterError(
            f"the pod network needs {', '.join(missing)}: run `make setup` (apt-get install iproute2 "
            "nftables containernetworking-plugins)"
        )


def _which(name: str) -> bool:
    return shutil.which(name) is not None


def up(netdir: Path, say: Say) -> Path:
    """Create BRIDGE with NODE_IP, the guard table, and the CNI configuration under ``netdir``.

    Returns the CNI configuration directory (containerd's ``conf_dir``). Raises ClusterError when a
    tool is missing or a command fails.
    """
    check_tools()
    if not _link_exists(BRIDGE):
        procs.run(["ip", "link", "add", "name", BRIDGE, "type", "bridge"])
    addrs = procs.run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE])
    if f"{NODE_IP}/{PREFIX_LEN}" not in addrs:
        procs.run(["ip", "addr", "add", f"{NODE_IP}/{PREFIX_LEN}", "dev", BRIDGE])
    procs.run(["ip", "link", "set", BRIDGE, "up"])
    procs.run(["nft", "delete", "table", "inet", GUARD_TABLE], check=False)
    procs.run(["nft", "-f", "-"], input=guard_ruleset())
    conf_dir = netdir / "net.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / f"10-{NETWORK_NAME}.conflist").write_text(json.dumps(cni_conflist(netdir / "ipam"), indent=2))
    say(f"pod network: bridge {BRIDGE} {NODE_IP}/{PREFIX_LEN}, pods {POD_CIDR}, no route outside the machine")
    return conf_dir


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def down(netdir: Path, say: Say) -> None:
    """Delete the veths still attached to BRIDGE, BRIDGE itself, the guard table and ``netdir``."""
    if _link_exists(BRIDGE):
        for veth in attached_links():
            procs.run(["ip", "link", "delete", veth], check=False)
        procs.run(["ip", "link", "delete", BRIDGE], check=False)
        say(f"deleted bridge {BRIDGE}")
    procs.run(["nft", "delete", "table", "inet", GUARD_TABLE], check=False)
    shutil.rmtree(netdir, ignore_errors=True)


def attached_links() -> list[str]:
    """Names of the links whose master is BRIDGE (the pods' host-side veths)."""
    brif = Path(f"/sys/class/net/{BRIDGE}/brif")
    return sorted(p.name for p in brif.iterdir()) if brif.is_dir() else []


def leftovers() -> list[str]:
    """What a stopped pod network left behind: the bridge, its veths, the guard table."""
    found = []
    if _link_exists(BRIDGE):
        found.append(f"bridge {BRIDGE} (veths: {', '.join(attached_links()) or 'none'})")
    tables = procs.run(["nft", "list", "tables"], check=False) if _which("nft") else ""
    if f"table inet {GUARD_TABLE}" in tables:
        found.append(f"nftables table inet {GUARD_TABLE}")
    return found
