"""Pure configuration of the local node (hack/node.py) and its pod network (hack/podnetwork.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from pathlib import Path

import pytest

from hack import controlplane, node, podnetwork
from hack.pki import node_leaves
from hack.procs import ClusterError


def test_containerd_config_is_version_3_with_runc_cgroupfs_and_the_pod_network(tmp_path: Path) -> None:
    paths = node.NodePaths(tmp_path / "node")
    doc = tomllib.loads(node.containerd_config(paths, tmp_path / "net.d", image_store=tmp_path / "store"))
    assert doc["version"] == 3
    assert doc["root"] == str(tmp_path / "store")
    assert doc["state"] == str(paths.containerd_state)
    assert doc["grpc"]["address"] == str(paths.containerd_socket)
    runtime = doc["plugins"]["io.containerd.cri.v1.runtime"]
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["SystemdCgroup"] is False  # these machines: cgroupfs on cgroups v1
    assert runc["options"]["BinaryName"] == str(node.RUNC)
    assert runtime["cni"]["conf_dir"] == str(tmp_path / "net.d")
    assert runtime["netns_mounts_under_state_dir"] is True  # cleanup finds them under the state dir
    assert runtime["restrict_oom_score_adj"] is True  # a negative oom_score_adj is refused here
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == node.SANDBOX_IMAGE
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"


def test_kubelet_config_runs_on_cgroups_v1_and_never_drops_local_images(tmp_path: Path) -> None:
    cfg = node.kubelet_config(node.NodePaths(tmp_path), tmp_path / "pki", healthz_port=1234)
    assert cfg["failCgroupV1"] is False
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["imageGCHighThresholdPercent"] == 100  # images cannot be pulled again here
    assert cfg["clusterDNS"] == [node.CLUSTER_DNS_IP]
    assert cfg["address"] == podnetwork.NODE_IP
    assert cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authorization"]["mode"] == "Webhook"
    assert cfg["healthzPort"] == 1234


def test_kube_proxy_uses_nftables_and_leaves_conntrack_sysctls_alone(tmp_path: Path) -> None:
    cfg = node.kube_proxy_config(tmp_path / "kc", 1, 2)
    assert cfg["mode"] == "nftables"
    assert cfg["nodePortAddresses"] == [f"{podnetwork.NODE_IP}/32"]
    assert all(v in (0, "0s") for v in cfg["conntrack"].values())
    assert cfg["clusterCIDR"] == podnetwork.POD_CIDR


def test_dns_service_points_at_coredns_on_the_node() -> None:
    objs = {o["kind"]: o for o in node.dns_objects()}
    assert objs["Service"]["spec"]["clusterIP"] == node.CLUSTER_DNS_IP
    assert "selector" not in objs["Service"]["spec"]
    assert ipaddress.ip_address(node.CLUSTER_DNS_IP) in ipaddress.ip_network(controlplane.SERVICE_CIDR)
    (ep,) = objs["EndpointSlice"]["endpoints"]
    assert ep["addresses"] == [podnetwork.NODE_IP]
    assert objs["EndpointSlice"]["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    core = node.corefile(Path("/k"), 1, 2)
    assert f"bind {podnetwork.NODE_IP}" in core
    assert "forward" not in core  # names outside the cluster are not sent anywhere


def test_pod_network_has_no_masquerade_and_no_default_route(tmp_path: Path) -> None:
    conf = podnetwork.cni_conflist(tmp_path / "ipam")
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == podnetwork.BRIDGE
    assert bridge["ipMasq"] is False
    routes = [r["dst"] for r in bridge["ipam"]["routes"]]
    assert "0.0.0.0/0" not in routes
    assert routes == [controlplane.SERVICE_CIDR]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert json.loads(json.dumps(conf)) == conf
    pod_net = ipaddress.ip_network(podnetwork.POD_CIDR)
    assert ipaddress.ip_address(podnetwork.NODE_IP) in pod_net
    assert pod_net.is_private and not pod_net.overlaps(ipaddress.ip_network(controlplane.SERVICE_CIDR))
    guard = podnetwork.guard_ruleset()
    assert f'iifname "{podnetwork.BRIDGE}" oifname != "{podnetwork.BRIDGE}" counter drop' in guard
    assert "table inet" in guard  # IPv4 and IPv6


def test_node_certificates_name_the_users_the_default_rbac_knows() -> None:
    subjects = {leaf.name: leaf.subject for leaf in node_leaves(podnetwork.NODE_IP)}
    assert subjects["kubelet-client"] == "/O=system:nodes/CN=system:node:kubeinfer-node"
    assert subjects["kube-proxy"] == "/CN=system:kube-proxy"
    assert subjects["scheduler"] == "/CN=system:kube-scheduler"
    serving = next(leaf for leaf in node_leaves("10.1.2.3") if leaf.name == "kubelet-serving")
    assert "IP:10.1.2.3" in serving.extensions() and "serverAuth" in serving.extensions()


def test_apiserver_with_a_node_authorizes_kubelets_and_publishes_its_endpoint(tmp_path: Path) -> None:
    args = controlplane.apiserver_args(
        etcd_url="http://127.0.0.1:1", port=2, pki=tmp_path, token_file=tmp_path / "t", bind_ip="10.9.0.1",
        with_node=True,
    )  # fmt: skip
    assert "--authorization-mode=Node,RBAC" in args
    assert "--bind-address=10.9.0.1" in args
    assert "--endpoint-reconciler-type=lease" in args
    alone = controlplane.apiserver_args(
        etcd_url="http://127.0.0.1:1", port=2, pki=tmp_path, token_file=tmp_path
    )
    assert "--endpoint-reconciler-type=none" in alone and "--authorization-mode=RBAC" in alone


def test_a_second_node_on_the_machine_is_refused_naming_the_running_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "node.json"
    monkeypatch.setattr(node, "MACHINE_RECORD", record)
    me = os.getpid()
    record.write_text(
        json.dumps({"workdir": "/elsewhere", "pids": {"kubelet": me}, "start_times": {"kubelet": None}})
    )
    assert node.running_elsewhere(tmp_path / "mine") == "/elsewhere"
    with pytest.raises(
        ClusterError, match=r"already runs on this machine \(work directory /elsewhere\).*down"
    ):
        node.preflight(tmp_path / "mine", tmp_path / "bin")
    # the same work directory is not "elsewhere" (hack/cluster.py reuses or cleans it up)
    assert node.running_elsewhere(Path("/elsewhere")) is None
    # a record whose processes are gone is stale: not a running node
    record.write_text(
        json.dumps({"workdir": "/elsewhere", "pids": {"kubelet": 2**22 + 7}, "start_times": {}})
    )
    assert node.running_elsewhere(tmp_path / "mine") is None


def test_the_store_lock_makes_a_second_holder_wait_and_say_for_what(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image preload holds the store's lock while its containerd runs: a node's start waits for it
    (two containerds on one store would share its metadata database)."""
    import threading

    monkeypatch.setattr(node, "STORE_LOCK", tmp_path / "store.lock")
    said: list[str] = []
    order: list[str] = []
    held = threading.Event()
    release = threading.Event()

    def preload() -> None:
        with node.store_lock(said.append):
            order.append("preload holds")
            held.set()
            release.wait(5)
            order.append("preload releases")

    t = threading.Thread(target=preload)
    t.start()
    assert held.wait(5)
    threading.Timer(0.3, release.set).start()
    with node.store_lock(said.append):
        order.append("node holds")
    t.join(5)
    assert order == ["preload holds", "preload releases", "node holds"]
    assert len(said) == 1 and "waiting for the containerd" in said[0] and "store.lock" in said[0]


def test_preload_refuses_without_its_binaries(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"missing .*containerd.*make setup"):
        node.preload(tmp_path / "w", bin_dir=tmp_path / "bin", load_images=lambda _c, _s: None, say=print)
