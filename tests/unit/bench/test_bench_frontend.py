"""bench/frontend_bench.py and bench/frontend_floor.py: the granian floors' options, command line and
ratios, and the floor's apps. No server is started, nothing is measured."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from tests.support.bench import load_bench

fb = load_bench("frontend_bench")
floor = load_bench("frontend_floor")


def test_default_granian_floors_are_both_interfaces_on_one_and_two_runtime_threads() -> None:
    settings = fb.parse_granian_settings(fb.DEFAULT_GRANIAN)
    assert [s.label for s in settings] == ["asgi t1", "asgi t2", "rsgi t1", "rsgi t2"]
    fixed = {(s.workers, s.loop, s.http, s.blocking_threads, s.runtime_mode) for s in settings}
    assert fixed == {(1, "uvloop", "1", 1, "auto")}


def test_parse_granian_settings_reads_interface_threads_and_mode() -> None:
    got = fb.parse_granian_settings(" rsgi/2/st , asgi ,, asgi/3/mt")
    assert [(s.interface, s.runtime_threads, s.runtime_mode) for s in got] == [
        ("rsgi", 2, "st"),
        ("asgi", 1, "auto"),
        ("asgi", 3, "mt"),
    ]
    assert [s.label for s in got] == ["rsgi t2 st", "asgi t1", "asgi t3 mt"]
    assert fb.parse_granian_settings("") == [] and fb.parse_granian_settings(" , ") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("wsgi", "interface 'wsgi' is not asgi or rsgi"),
        ("asgi/0", "runtime threads '0' is not an integer >= 1"),
        ("asgi/two", "runtime threads 'two' is not an integer >= 1"),
        ("rsgi/1/fast", "runtime mode 'fast' is not auto, st or mt"),
        ("rsgi/1/st/x", "at most INTERFACE/THREADS/MODE"),
        ("asgi/1,asgi", "'asgi': given twice"),
    ],
)
def test_parse_granian_settings_names_the_bad_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--granian") as info:
        fb.parse_granian_settings(text)
    assert message in str(info.value)


def test_bad_granian_option_is_a_usage_error_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        fb.main(["--granian", "asgi/0", "--out", "/nonexistent/never-written.json"])
    assert info.value.code == 2
    assert "runtime threads '0' is not an integer >= 1" in capsys.readouterr().err


def test_granian_command_line_serves_the_floor_apps_with_the_settings() -> None:
    asgi, rsgi = fb.parse_granian_settings("asgi/2,rsgi/1/st")
    argv = asgi.argv("127.0.0.1", 8123)
    opts = dict(itertools.pairwise(argv))
    assert argv[-1] == "frontend_floor:starlette_app" and "--factory" in argv
    assert (opts["--interface"], opts["--host"], opts["--port"], opts["--workers"]) == (
        "asgi",
        "127.0.0.1",
        "8123",
        "1",
    )
    assert (opts["--runtime-threads"], opts["--runtime-mode"], opts["--loop"], opts["--http"]) == (
        "2",
        "auto",
        "uvloop",
        "1",
    )
    assert (opts["--blocking-threads"], opts["--backlog"]) == ("1", "2048") and "--no-ws" in argv
    assert opts["--working-dir"] == str(fb.ROOT / "bench")  # where frontend_floor.py is
    rargv = rsgi.argv("::1", 9)
    assert rargv[-1] == "frontend_floor:rsgi_app" and "--factory" not in rargv
    assert (
        rargv[rargv.index("--runtime-mode") + 1] == "st" and rargv[rargv.index("--interface") + 1] == "rsgi"
    )


def test_granian_env_points_the_overlay_at_this_venv_and_keeps_the_cwd_off_sys_path() -> None:
    env = fb.granian_env("/x/.venv/lib/python3.11/site-packages")
    assert env["KUBEINFER_BENCH_SITE_PACKAGES"] == "/x/.venv/lib/python3.11/site-packages"
    assert env["PYTHONSAFEPATH"] == "1" and "PATH" in env


def _floor(
    cpu: float | None, ref: float, profile: float, rps: float, ref_rate: float = 300.0
) -> dict[str, Any]:
    return {
        "cpu_us_per_request": cpu,
        "max_rps": rps,
        "ref_rate_rps": ref_rate,
        "cpu_us_per_request_at_ref_rate": ref,
        "profile_rate_rps": 1000.0,
        "cpu_us_per_request_at_profile_rate": profile,
    }


def test_granian_floor_ratios_are_granian_over_uvicorn_at_each_rate() -> None:
    uvicorn = _floor(100.0, 200.0, 150.0, 4000.0)
    granian = {"asgi t1": _floor(80.0, 100.0, 120.0, 6000.0), "rsgi t2 st": _floor(None, 50.0, 75.0, 0.0)}
    got = fb.granian_floor_ratios(uvicorn, granian)
    assert got == {
        "granian_asgi_t1_cpu_over_uvicorn": pytest.approx(0.8),
        "granian_asgi_t1_cpu_over_uvicorn_at_ref_rate": pytest.approx(0.5),
        "granian_asgi_t1_cpu_over_uvicorn_at_profile_rate": pytest.approx(0.8),
        "granian_asgi_t1_max_rps_over_uvicorn": pytest.approx(1.5),
        # no rate met the SLO: no figure at the max, the fixed rates still compare
        "granian_rsgi_t2_st_cpu_over_uvicorn": None,
        "granian_rsgi_t2_st_cpu_over_uvicorn_at_ref_rate": pytest.approx(0.25),
        "granian_rsgi_t2_st_cpu_over_uvicorn_at_profile_rate": pytest.approx(0.5),
        "granian_rsgi_t2_st_max_rps_over_uvicorn": None,
    }
    # figures taken at another reference rate are not compared
    other = fb.granian_floor_ratios(uvicorn, {"asgi t1": _floor(80.0, 100.0, 120.0, 6000.0, ref_rate=30.0)})
    assert other["granian_asgi_t1_cpu_over_uvicorn_at_ref_rate"] is None
    assert fb.granian_floor_ratios(uvicorn, {}) == {}


def test_rsgi_floor_reads_the_body_and_answers_the_fixed_response() -> None:
    calls: list[Any] = []

    class Protocol:
        async def __call__(self) -> bytes:
            calls.append("body")
            return b'{"inputs": []}'

        def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            calls.append((status, headers, body))

    asyncio.run(floor.rsgi_app({"proto": "http"}, Protocol()))
    assert calls == ["body", (200, [("content-type", "application/json")], floor.FLOOR_RESPONSE)]
    assert json.loads(floor.FLOOR_RESPONSE)["outputs"][0]["shape"] == [1, 4]


def _asgi(app: Any, method: str, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
             "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2), "root_path": ""}  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_starlette_floor_answers_infer_posts_only() -> None:
    app = floor.starlette_app()
    assert _asgi(app, "POST", "/v2/models/floor/infer") == (200, floor.FLOOR_RESPONSE)
    assert _asgi(app, "POST", "/v2/models/floor/ready")[0] == 404
    assert _asgi(app, "GET", "/v2/models/floor/infer")[0] == 405


def test_granian_runtime_option_takes_one_asgi_setting(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("rsgi/1", "asgi/1,asgi/2"):
        with pytest.raises(SystemExit) as info:
            fb.main(["--granian-runtime", bad, "--out", "/nonexistent/never-written.json"])
        assert info.value.code == 2
        assert "one setting, interface asgi" in capsys.readouterr().err


def _runtime(cpu: float, ref: float, main: float, rps: float, ref_rate: float = 300.0) -> dict[str, Any]:
    return {
        "cpu_us_per_request": cpu,
        "max_slo_rps": rps,
        "ref_rate_rps": ref_rate,
        "cpu_us_per_request_at_ref_rate": ref,
        "main_thread_cpu_us_per_request_at_ref_rate": main,
    }


def test_granian_runtime_ratios_compare_with_the_granian_floor_and_the_uvicorn_runtime() -> None:
    figures = {
        "floor_granian": {"asgi t1": _floor(50.0, 100.0, 80.0, 5000.0)},
        "tiny": {
            "json": {
                "workers": {"1": _runtime(600.0, 1200.0, 400.0, 1000.0)},
                "granian": {"asgi t1": _runtime(500.0, 900.0, 300.0, 1500.0)},
            },
            # no uvicorn figures, a granian setting with no floor of its own
            "binary": {"workers": {}, "granian": {"asgi t2": _runtime(400.0, 800.0, 200.0, 2000.0)}},
            "grpc": {"workers": {"1": _runtime(700.0, 1400.0, 500.0, 900.0)}},
        },
    }
    got = fb.granian_runtime_ratios(figures)
    assert got == {
        "tiny_json_granian_asgi_t1_cpu_over_granian_floor": pytest.approx(10.0),
        "tiny_json_granian_asgi_t1_cpu_over_granian_floor_at_ref_rate": pytest.approx(9.0),
        "tiny_json_granian_asgi_t1_main_thread_over_granian_floor_at_ref_rate": pytest.approx(3.0),
        "tiny_json_granian_asgi_t1_cpu_over_uvicorn_at_ref_rate": pytest.approx(0.75),
        "tiny_json_granian_asgi_t1_max_rps_over_uvicorn": pytest.approx(1.5),
        "tiny_binary_granian_asgi_t2_cpu_over_granian_floor": None,
        "tiny_binary_granian_asgi_t2_cpu_over_granian_floor_at_ref_rate": None,
        "tiny_binary_granian_asgi_t2_main_thread_over_granian_floor_at_ref_rate": None,
        "tiny_binary_granian_asgi_t2_cpu_over_uvicorn_at_ref_rate": None,
        "tiny_binary_granian_asgi_t2_max_rps_over_uvicorn": None,
    }


def test_runtime_under_granian_starts_no_uvicorn_and_its_serving_ends_when_http_closes() -> None:
    from kubeinfer.runtime.config import RuntimeConfig

    gr = load_bench("granian_runtime")

    async def run() -> None:
        server = gr.GranianServed(RuntimeConfig())
        serving = asyncio.ensure_future(server._start_uvicorn())
        await asyncio.sleep(0.01)
        assert not serving.done() and server._uvicorn is None
        server._close_http()
        await asyncio.wait_for(serving, 1.0)

    asyncio.run(run())
    two = RuntimeConfig()
    two.server.http_workers = 2
    with pytest.raises(ValueError, match="http_workers must be 1"):
        gr.GranianServed(two)._start_uvicorn()
