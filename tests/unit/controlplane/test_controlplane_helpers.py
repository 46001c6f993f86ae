"""Pure helpers of hack/ (cluster, controlplane, pki, procs) and hack/devtools/prom.py: ports,
kubeconfigs, flags, configs."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from hack import cluster as hc
from hack import controlplane as cp
from hack import pki, procs
from hack.devtools import prom


def test_free_port_is_bindable_and_respects_exclude() -> None:
    port = procs.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free right after it was chosen
    other = procs.free_port(exclude={port})
    assert other != port


def test_render_kubeconfig_with_client_certificate() -> None:
    doc = cp.render_kubeconfig(
        "https://127.0.0.1:6443", b"CA", user="admin", client_cert_pem=b"CERT", client_key_pem=b"KEY"
    )
    assert doc["current-context"] == "admin"
    (cluster,) = doc["clusters"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == b"CA"
    (user,) = doc["users"]
    assert base64.b64decode(user["user"]["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["user"]["client-key-data"]) == b"KEY"
    assert "token" not in user["user"]
    # the document round-trips through YAML unchanged
    assert yaml.safe_load(yaml.safe_dump(doc)) == doc


def test_render_kubeconfig_token_namespace_and_impersonation() -> None:
    doc = cp.render_kubeconfig(
        "https://127.0.0.1:1",
        b"CA",
        user="sa",
        token="t0k",
        namespace="ns1",
        impersonate="system:serviceaccount:ns1:op",
        impersonate_groups=["system:serviceaccounts"],
    )
    user = doc["users"][0]["user"]
    assert user == {
        "token": "t0k",
        "as": "system:serviceaccount:ns1:op",
        "as-groups": ["system:serviceaccounts"],
    }
    assert doc["contexts"][0]["context"] == {"cluster": cp.CLUSTER_NAME, "user": "sa", "namespace": "ns1"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # no credential
        {"token": "t", "client_cert_pem": b"c", "client_key_pem": b"k"},  # two credentials
        {"client_cert_pem": b"c"},  # cert without key
    ],
)
def test_render_kubeconfig_rejects_bad_credentials(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"credential|go together"):
        cp.render_kubeconfig("https://127.0.0.1:1", b"CA", user="u", **kwargs)  # type: ignore[arg-type]


def test_render_kubeconfig_rejects_plain_http() -> None:
    with pytest.raises(ValueError, match="https"):
        cp.render_kubeconfig("http://127.0.0.1:1", b"CA", user="u", token="t")


def test_apiserver_args_have_rbac_and_service_account_keys(tmp_path: Path) -> None:
    args = cp.apiserver_args(
        etcd_url="http://127.0.0.1:1", port=2, pki=tmp_path, token_file=tmp_path / "t.csv"
    )
    assert "--authorization-mode=RBAC" in args
    assert "--secure-port=2" in args
    assert "--bind-address=127.0.0.1" in args
    assert f"--service-account-signing-key-file={tmp_path / 'sa.key'}" in args
    assert f"--service-account-issuer={cp.SERVICE_ISSUER}" in args
    assert not any(a.startswith("--authorization-mode=AlwaysAllow") for a in args)


def test_controller_manager_runs_the_controllers_kubeinfer_needs(tmp_path: Path) -> None:
    args = cp.controller_manager_args(kubeconfig=tmp_path / "kc", pki=tmp_path)
    (controllers,) = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--controllers=")]
    for needed in ("deployment-controller", "replicaset-controller", "garbage-collector-controller"):
        assert needed in controllers
    assert "--secure-port=0" in args


def test_etcd_args_use_the_given_ports(tmp_path: Path) -> None:
    args = cp.etcd_args(data_dir=tmp_path, client_port=11, peer_port=12)
    assert "--listen-client-urls=http://127.0.0.1:11" in args
    assert "--initial-cluster=default=http://127.0.0.1:12" in args


def test_make_pki_signs_server_and_admin_certificates(tmp_path: Path) -> None:
    pki.make_pki(tmp_path, cp.control_plane_leaves(["127.0.0.1"], cp.KUBERNETES_SERVICE_IP))
    r = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.crt", "apiserver.crt", "admin.crt", "kcm.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", "apiserver.crt", "-noout", "-text"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text
    subject = subprocess.run(
        ["openssl", "x509", "-in", "admin.crt", "-noout", "-subject"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "O = system:masters" in subject
    assert (tmp_path / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_cluster_info_json_round_trip(tmp_path: Path) -> None:
    info = hc.ClusterInfo(
        workdir=tmp_path,
        kubeconfig=tmp_path / "kubeconfig",
        server="https://127.0.0.1:5",
        ca_path=tmp_path / "ca.crt",
        admin_token="tok",
        client_cert=tmp_path / "a.crt",
        client_key=tmp_path / "a.key",
        pids={"etcd": 1},
        ports={"etcd": 2},
        bin_dir=tmp_path / "bin",
        log_dir=tmp_path / "logs",
        start_times={"etcd": 3},
    )
    again = hc.ClusterInfo.from_json(json.loads(json.dumps(info.to_json())))
    assert again == info
    assert again.kubectl_path == tmp_path / "bin" / "kubectl"


def test_stop_on_an_empty_workdir_is_safe(tmp_path: Path) -> None:
    assert hc.stop(tmp_path, log=lambda _m: None) == []


def test_stop_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    # A pid whose start time differs from the recorded one is not ours: it must survive `down`.
    proc = subprocess.Popen(["sleep", "30"])
    try:
        state = {
            "workdir": str(tmp_path),
            "kubeconfig": str(tmp_path / "kubeconfig"),
            "server": "https://127.0.0.1:1",
            "ca_path": str(tmp_path / "ca.crt"),
            "admin_token": "t",
            "client_cert": str(tmp_path / "c"),
            "client_key": str(tmp_path / "k"),
            "pids": {"etcd": proc.pid},
            "ports": {},
            "bin_dir": str(tmp_path),
            "log_dir": str(tmp_path / "logs"),
            "start_times": {"etcd": 1},
        }
        (tmp_path / hc.STATE_FILE).write_text(json.dumps(state))
        (tmp_path / "kubeconfig").write_text("x")
        removed = hc.stop(tmp_path, log=lambda _m: None)
        assert proc.poll() is None
        assert tmp_path / "kubeconfig" in removed
        assert not (tmp_path / hc.STATE_FILE).exists()
    finally:
        proc.kill()
        proc.wait()


def test_check_binaries_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(hc.ClusterError, match=r"etcd, kube-apiserver.*make setup"):
        hc.check_binaries(tmp_path, ("etcd", "kube-apiserver"))


# ----------------------------------------------------------------------------- prometheus helpers


def test_prom_duration() -> None:
    assert prom.prom_duration(1.0) == "1000ms"
    assert prom.prom_duration(0.25) == "250ms"
    with pytest.raises(ValueError, match="1 ms"):
        prom.prom_duration(0.0)


def test_render_config_uses_file_sd_and_interval(tmp_path: Path) -> None:
    cfg = prom.render_config(tmp_path / "t.json", scrape_interval=0.5)
    (job,) = cfg["scrape_configs"]
    assert job["scrape_interval"] == "500ms"
    assert job["scrape_timeout"] == "500ms"
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / "t.json")], "refresh_interval": "1s"}]


def test_render_targets_and_validation() -> None:
    groups = prom.render_targets([("127.0.0.1:9", {"namespace": "a", "inferenceservice": "b"})])
    assert groups == [{"targets": ["127.0.0.1:9"], "labels": {"namespace": "a", "inferenceservice": "b"}}]
    with pytest.raises(ValueError, match="host:port"):
        prom.render_targets([("127.0.0.1", {})])
    with pytest.raises(ValueError, match="'replica'"):
        prom.render_targets([("h:1", {"replica": 1})])  # type: ignore[dict-item]


def test_set_targets_writes_file_atomically_without_a_running_server(tmp_path: Path) -> None:
    server = prom.PrometheusServer(tmp_path, port=1)
    server.set_targets([("127.0.0.1:5", {"namespace": "n"})])
    assert json.loads((tmp_path / "targets.json").read_text()) == [
        {"targets": ["127.0.0.1:5"], "labels": {"namespace": "n"}}
    ]
    assert not list(tmp_path.glob("*.tmp"))
    assert server.url == "http://127.0.0.1:1"
