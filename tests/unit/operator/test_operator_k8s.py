"""``kubeinfer.operator.k8s``: error mapping, and the request wiring over kubernetes-asyncio.

The wiring tests talk to a small aiohttp server on a free loopback port that records requests and
answers with canned statuses (API faults the real API server cannot be made to produce on cue);
the real API server is exercised by tests/integration/operator.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubeinfer.operator import k8s
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy


def api_exception(status: int, body: str, headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason="X")
    exc.body = body
    exc.headers = CIMultiDictProxy(CIMultiDict(headers or {}))
    return exc


def status_body(code: int, reason: str, message: str) -> str:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": message})


@pytest.mark.parametrize(
    ("code", "cls", "retry_after"),
    [
        (404, k8s.NotFoundError, 1.0),
        (409, k8s.TransientError, 7.0),
        (429, k8s.TransientError, 7.0),
        (503, k8s.TransientError, 7.0),
        (400, k8s.PermanentError, 1.0),
        (403, k8s.PermanentError, 1.0),
        (422, k8s.PermanentError, 1.0),
    ],
)
def test_error_from_api_classes(code: int, cls: type[k8s.KubeError], retry_after: float) -> None:
    exc = api_exception(code, status_body(code, "Because", "spec.x: bad"), {"Retry-After": "7"})
    err = k8s.error_from_api("PATCH", "/api/v1/namespaces/n/configmaps/c", exc)
    assert type(err) is cls
    assert err.status == code and err.reason == "Because"
    assert str(err) == f"PATCH /api/v1/namespaces/n/configmaps/c: {code} spec.x: bad"
    assert err.retry_after == retry_after


def test_error_from_api_non_json_body_and_bad_retry_after() -> None:
    err = k8s.error_from_api(
        "GET", "/p", api_exception(502, "<html>bad gateway</html>", {"Retry-After": "soon"})
    )
    assert isinstance(err, k8s.TransientError)
    assert str(err) == "GET /p: 502 <html>bad gateway</html>" and err.reason == "" and err.retry_after == 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
async def fake_server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """(base URL, recorded requests). Paths ending in /missing answer 404, /busy 429 (Retry-After 3)."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "authorization": request.headers.get("Authorization"),
                "body": json.loads(body) if body else None,
            }
        )
        if request.path.endswith("/missing"):
            return web.Response(status=404, text=status_body(404, "NotFound", "gone"))
        if request.path.endswith("/busy"):
            text = status_body(429, "TooManyRequests", "slow down")
            return web.Response(status=429, text=text, headers={"Retry-After": "3"})
        return web.json_response({"kind": "Thing", "metadata": {"name": "t"}, "items": [{"a": 1}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_requests_raw_json_auth_apply_and_errors(
    fake_server: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    url, seen = fake_server
    kube = await k8s.Kube.from_environment(str(write_kubeconfig(tmp_path / "kc", url, "tok-1")))
    try:
        got = await kube.get("/api/v1/namespaces/n/configmaps/c")
        assert got == {"kind": "Thing", "metadata": {"name": "t"}, "items": [{"a": 1}]}
        assert await kube.list("/api/v1/namespaces/n/pods", label_selector="a=b,c") == [{"a": 1}]
        assert await kube.get("/api/v1/namespaces/n/configmaps/missing") is None
        obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "n"}}
        await kube.apply(obj, field_manager="kubeinfer")
        await kube.patch_merge(
            "/apis/x/v1/namespaces/n/things/t", {"status": {"a": 1}}, field_manager="m", subresource="status"
        )
        assert await kube.delete("/api/v1/namespaces/n/services/missing") is False
        with pytest.raises(k8s.TransientError) as busy:
            await kube.create("/api/v1/namespaces/n/busy", {"kind": "X"})
        assert busy.value.status == 429 and busy.value.retry_after == 3.0
        assert str(busy.value) == "POST /api/v1/namespaces/n/busy: 429 slow down"
    finally:
        await kube.close()

    assert {r["authorization"] for r in seen} == {"Bearer tok-1"}
    assert seen[1]["query"] == {"labelSelector": "a=b,c"}
    apply = seen[3]
    assert apply["method"] == "PATCH" and apply["path"] == "/apis/apps/v1/namespaces/n/deployments/d"
    assert apply["content_type"] == "application/apply-patch+yaml" and apply["body"] == obj
    assert apply["query"] == {"fieldManager": "kubeinfer", "force": "true"}
    merge = seen[4]
    assert merge["path"] == "/apis/x/v1/namespaces/n/things/t/status"
    assert merge["content_type"] == "application/merge-patch+json" and merge["query"] == {"fieldManager": "m"}
    assert seen[5]["method"] == "DELETE" and seen[5]["body"] == {"propagationPolicy": "Background"}
    # Writes the server answered, whatever the status; GETs are not writes.
    assert kube.writes == {
        ("PATCH", "deployments"): 1,
        ("PATCH", "things"): 1,
        ("DELETE", "services"): 1,
        ("POST", "busy"): 1,
    }


async def test_no_server_is_transient(tmp_path: Path) -> None:
    kube = await k8s.Kube.from_environment(
        str(write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}", "t")), timeout=5.0
    )
    try:
        with pytest.raises(k8s.TransientError) as err:
            await kube.get("/api/v1/namespaces")
        assert err.value.status == 0 and err.value.retry_after == 2.0
        assert kube.writes == {}
    finally:
        await kube.close()


async def test_unusable_kubeconfig_is_permanent(tmp_path: Path) -> None:
    with pytest.raises(k8s.PermanentError, match="cannot load Kubernetes credentials"):
        await k8s.Kube.from_environment(str(tmp_path / "does-not-exist"))


class _ConflictOnce(k8s.Kube):
    """A ``Kube`` whose transport is a dict: ``get`` returns the stored object."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        self.stored = stored
        self.gets = 0

    async def get(self, path: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.stored


async def test_retry_on_conflict_rereads_and_retries_then_gives_up() -> None:
    kube = _ConflictOnce({"metadata": {"resourceVersion": "2"}})
    seen: list[str] = []

    async def write(body: Any) -> str:
        seen.append(body["metadata"]["resourceVersion"])
        if body["metadata"]["resourceVersion"] == "1":
            raise k8s.TransientError("conflict", status=409)
        return "ok"

    assert await kube.retry_on_conflict("/p", {"metadata": {"resourceVersion": "1"}}, write) == "ok"
    assert seen == ["1", "2"] and kube.gets == 1

    async def always(body: Any) -> str:
        raise k8s.TransientError("conflict", status=409)

    with pytest.raises(k8s.TransientError):
        await kube.retry_on_conflict("/p", {"metadata": {}}, always, attempts=3)
    assert kube.gets == 3

    async def busy(body: Any) -> str:
        raise k8s.TransientError("busy", status=503)

    with pytest.raises(k8s.TransientError):  # not a conflict: no re-read
        await kube.retry_on_conflict("/p", {}, busy)
    assert kube.gets == 3
    gone = _ConflictOnce(None)
    assert await gone.retry_on_conflict("/p", {}, always) is None
