"""Test-side handle on a real local control plane (see ``hack/cluster.py``).

Fixtures (``tests/conftest.py``):

- ``cluster`` (session scope) -> :class:`Cluster`. Starts etcd + kube-apiserver +
  kube-controller-manager once per pytest session in a temporary directory, or uses the cluster of
  ``$KUBEINFER_TEST_KUBECONFIG`` when that is set. Fails (not skips) with "run make setup" when the
  binaries are missing. Stopped at session end (and the processes die with pytest if it is killed).
- ``namespace`` (function scope) -> ``str``: a fresh namespace (with its ``default``
  ServiceAccount already created), deleted after the test without waiting for finalization.

:class:`Cluster` API::

    cluster.kubeconfig        Path of an admin kubeconfig (group system:masters)
    cluster.server            "https://127.0.0.1:<port>"
    cluster.env               dict(os.environ) + KUBECONFIG (+ HELM_*_HOME in a temp dir); for subprocesses
    cluster.kubectl_path, cluster.helm_path   Paths of the binaries built by `make setup`
    cluster.info              hack.cluster.ClusterInfo (None when using $KUBEINFER_TEST_KUBECONFIG)
    cluster.kubectl(*args, check=True, input=None, timeout=60.0) -> CompletedProcess[str]
    cluster.helm(*args, check=True, input=None, timeout=180.0)   -> CompletedProcess[str]
    cluster.apply(manifest)   kubectl apply -f - of a dict / list of dicts / YAML string
    cluster.api_client()      -> kubernetes.client.ApiClient for the admin kubeconfig
    cluster.create_namespace(name), cluster.delete_namespace(name), cluster.release_finalizers(name)
                              through one kept admin ApiClient (no kubectl process: most tests make and
                              delete a namespace, and a kubectl run costs about 0.1 s, a request 5 ms)
    cluster.kubeconfig_for_service_account(namespace, name, path) -> Path   (TokenRequest token)
    cluster.kubeconfig_for_impersonation(path, user=..., groups=...) -> Path (kubectl/helm only)
    cluster.get_json(*args)   kubectl get <args> -o json, parsed
    wait_until(predicate, timeout=..., interval=..., message=...) -> the predicate's truthy value

``KubectlError`` (a ``subprocess.CalledProcessError``) is raised on a non-zero exit with
``check=True``; its message includes the command's stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hack.cluster import DEFAULT_BIN_DIR, ClusterInfo

T = TypeVar("T")


class KubectlError(subprocess.CalledProcessError):
    """A kubectl/helm command exited non-zero; ``str()`` includes its stderr."""

    def __str__(self) -> str:
        cmd = " ".join(str(c) for c in self.cmd)
        return (
            f"`{cmd}` exited {self.returncode}: {(self.stderr or '').strip() or (self.output or '').strip()}"
        )


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.2, message: str = "condition"
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Raises TimeoutError naming ``message`` (and the last exception the predicate raised, if any)
    after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # a transient API error is retried, and reported on timeout
            last_exc = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last_exc!r})" if last_exc is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {message}{detail}")
        time.sleep(interval)


class Cluster:
    """A kubeconfig plus the binaries to talk to it; see the module docstring."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        info: ClusterInfo | None = None,
        bin_dir: Path = DEFAULT_BIN_DIR,
        scratch: Path,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.info = info
        self._admin: Any = None  # the kept ApiClient of ``_admin_client``
        self.bin_dir = bin_dir
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        doc = yaml.safe_load(kubeconfig.read_text())
        current = doc.get("current-context")
        ctx = next((c["context"] for c in doc.get("contexts", []) if c["name"] == current), None)
        cluster_name = ctx["cluster"] if ctx else doc["clusters"][0]["name"]
        self.server: str = next(c["cluster"]["server"] for c in doc["clusters"] if c["name"] == cluster_name)
        self.env: dict[str, str] = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(scratch / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(scratch / "helm" / "config"),
            "HELM_DATA_HOME": str(scratch / "helm" / "data"),
        }

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def helm_path(self) -> Path:
        return self.bin_dir / "helm"

    def _run(
        self, cmd: Sequence[str | Path], check: bool, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(c) for c in cmd],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and r.returncode != 0:
            raise KubectlError(r.returncode, r.args, r.stdout, r.stderr)
        return r

    def kubectl(
        self, *args: str | Path, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; text stdout/stderr captured."""
        return self._run([self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args], check, input, timeout)

    def helm(
        self, *args: str | Path, check: bool = True, input: str | None = None, timeout: float = 180.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built helm against this cluster (HELM_*_HOME in a scratch directory)."""
        return self._run([self.helm_path, f"--kubeconfig={self.kubeconfig}", *args], check, input, timeout)

    def apply(
        self, manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]], *args: str
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -f -`` of a YAML string, one object (dict) or a list of objects."""
        if isinstance(manifest, str):
            text = manifest
        elif isinstance(manifest, Mapping):
            text = yaml.safe_dump(dict(manifest))
        else:
            text = yaml.safe_dump_all([dict(m) for m in manifest])
        return self.kubectl("apply", "-f", "-", *args, input=text)

    def get_json(self, *args: str) -> Any:
        """``kubectl get <args> -o json`` parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def _admin_client(self) -> Any:
        """One admin ``kubernetes.client.ApiClient`` kept for this handle's lifetime (its connections
        too), for the namespace helpers below."""
        if self._admin is None:
            self._admin = self.api_client()
        return self._admin

    def create_namespace(self, name: str) -> None:
        """Create namespace ``name`` and wait (30 s) until kube-controller-manager made its ``default``
        ServiceAccount (the ServiceAccount admission plugin rejects Pods before that)."""
        from kubernetes import client

        core = client.CoreV1Api(self._admin_client())
        core.create_namespace({"metadata": {"name": name}})
        wait_until(
            lambda: core.read_namespaced_service_account("default", name),  # 404 until then: retried
            timeout=30,
            interval=0.05,
            message=f"ServiceAccount {name}/default",
        )

    def delete_namespace(self, name: str) -> None:
        """Delete namespace ``name`` without waiting for its finalization; an error (it is gone) is
        ignored: for teardown."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            client.CoreV1Api(self._admin_client()).delete_namespace(name)

    def release_finalizers(self, namespace: str) -> None:
        """Drop the finalizers of the InferenceServices and PVCs of ``namespace``.

        For teardown once the test's operator is gone (kopf's finalizer), and for a PVC still used by a
        pod that is being deleted (the pvc-protection controller keeps its finalizer until the pod is
        gone), so that deleting the namespace does not leave it Terminating for the rest of the
        session. Missing kinds (CRD not installed) are ignored.
        """
        from kubeinfer.operator import api as api_resource
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self._admin_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        patch = {"metadata": {"finalizers": None}}
        merge = "application/merge-patch+json"
        isvc = (api_resource.GROUP, api_resource.VERSION, namespace, api_resource.PLURAL)
        try:
            names = [o["metadata"]["name"] for o in custom.list_namespaced_custom_object(*isvc)["items"]]
        except ApiException:  # the CRD is not installed
            names = []
        for name in names:
            with contextlib.suppress(ApiException):
                custom.patch_namespaced_custom_object(*isvc, name, patch, _content_type=merge)
        try:
            pvcs = core.list_namespaced_persistent_volume_claim(namespace).items
        except ApiException:
            pvcs = []
        for pvc in pvcs:
            with contextlib.suppress(ApiException):
                core.patch_namespaced_persistent_volume_claim(
                    pvc.metadata.name, namespace, patch, _content_type=merge
                )

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A new ``kubernetes.client.ApiClient`` for ``kubeconfig`` (default: the admin one)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def _kubeconfig_doc(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(document, current cluster entry, current user entry) of the admin kubeconfig."""
        doc = yaml.safe_load(self.kubeconfig.read_text())
        ctx_name = doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u for u in doc["users"] if u["name"] == ctx["user"])
        return doc, cluster, user

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, path: Path, *, duration_s: int = 3600
    ) -> Path:
        """Write a kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        The token comes from the TokenRequest API (``kubectl create token``, ``duration_s``
        seconds), so every client works with it, the Python ``kubernetes`` client included.
        Raises KubectlError when the ServiceAccount does not exist.
        """
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration_s}s"
        ).stdout.strip()
        _, cluster, _ = self._kubeconfig_doc()
        sa_user = f"system:serviceaccount:{namespace}:{name}"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": sa_user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": sa_user,
                    "context": {"cluster": cluster["name"], "user": sa_user, "namespace": namespace},
                }
            ],
            "current-context": sa_user,
        }
        return _write_kubeconfig(path, doc)

    def kubeconfig_for_impersonation(
        self, path: Path, *, user: str, groups: Sequence[str] = (), namespace: str | None = None
    ) -> Path:
        """Copy of the admin kubeconfig whose user impersonates ``user``/``groups``.

        ``as``/``as-groups`` are honoured by kubectl and helm (client-go), not by the Python
        ``kubernetes`` client: use :meth:`kubeconfig_for_service_account` there.
        """
        doc, _, admin = self._kubeconfig_doc()
        admin["user"] = {**admin["user"], "as": user}
        if groups:
            admin["user"]["as-groups"] = list(groups)
        if namespace:
            for c in doc["contexts"]:
                c["context"]["namespace"] = namespace
        return _write_kubeconfig(path, doc)


def _write_kubeconfig(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def get_object(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    """``kind``/``name`` in namespace ``ns`` as ``kubectl get -o json`` gives it, ``None`` when it
    cannot be read (absent, or the API refused)."""
    r = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(r.stdout)
    return obj
