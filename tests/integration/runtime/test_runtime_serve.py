"""A real ``kubeinfer-runtime`` process serving the bundled MiniLM, driven by ``tritonclient.http``.

One process per module (model load + warmup take seconds); the SIGTERM test starts its own.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from tests.support.perf_analyzer import MINILM, check_report, command, perf_analyzer, run

pytestmark = pytest.mark.timeout(300)

SENTENCES = [
    "A man is playing a guitar on stage.",
    "The new movie is awesome.",
    "A cat sits on the windowsill in the sun.",
    "The stock market fell sharply on Monday.",
    "She is cooking pasta for dinner.",
    "Children are playing football in the park.",
    "The train to Berlin was delayed by an hour.",
    "He repaired the bicycle's flat tyre.",
]
PARAPHRASES = [
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The weather is cold and rainy today.", "Today it is chilly and wet outside."),
    ("How do I reset my password?", "What are the steps to change my forgotten password?"),
]
UNRELATED = "Quantum chromodynamics describes the strong interaction."


#: ``server.http_workers`` of the runtimes: one process, and two HTTP front-end processes in front of
#: the model process (the batching, reload and drain tests run on both).
HTTP_WORKERS = [pytest.param(1, id="http_workers=1"), pytest.param(2, id="http_workers=2")]


def base_config(http_workers: int = 1, **batching: object) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "model": {"max_sequence_length": 64},
            "limits": {"max_text_tokens": 64},
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.01, **batching},
            "server": {"http_workers": http_workers},
            "device": "cpu",
        }
    )


@pytest.fixture(scope="module", params=HTTP_WORKERS)
def http_workers(request: pytest.FixtureRequest) -> int:
    workers: int = request.param
    return workers


@pytest.fixture(scope="module")
def runtime(http_workers: int) -> Iterator[RuntimeProcess]:
    with RuntimeProcess(base_config(http_workers)) as rt:
        yield rt


def text_input(texts: list[str], binary: bool = True) -> httpclient.InferInput:
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
    return inp


def embed(client: httpclient.InferenceServerClient, texts: list[str], binary: bool = True) -> np.ndarray:
    outputs = None if binary else [httpclient.InferRequestedOutput("embedding", binary_data=False)]
    result = client.infer("minilm", [text_input(texts, binary)], outputs=outputs)
    out = result.as_numpy("embedding")
    assert out is not None
    return out


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def post(rt: RuntimeProcess, path: str, body: bytes) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(rt.url + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_json_and_binary_inference_on_real_sentences(runtime: RuntimeProcess) -> None:
    client = httpclient.InferenceServerClient(runtime.address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("minilm")
    meta = client.get_model_metadata("minilm")
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    binary = embed(client, SENTENCES)
    as_json = embed(client, SENTENCES, binary=False)
    assert binary.shape == (8, 384) and binary.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(binary, axis=1), 1.0, atol=1e-4)
    np.testing.assert_allclose(binary, as_json, atol=1e-5)
    for a, b in PARAPHRASES:
        e = embed(client, [a, b, UNRELATED])
        close, far = float(e[0] @ e[1]), max(float(e[0] @ e[2]), float(e[1] @ e[2]))
        assert close > far + 0.2, (a, b, close, far)


def test_metrics_carry_the_contract_names(runtime: RuntimeProcess) -> None:
    client = httpclient.InferenceServerClient(runtime.address)
    embed(client, SENTENCES[:2])
    text = runtime.metrics_text()
    for name in (
        "kubeinfer_request_duration_seconds_bucket",
        "kubeinfer_queue_duration_seconds_bucket",
        "kubeinfer_compute_duration_seconds_bucket",
        "kubeinfer_batch_size_bucket",
        "kubeinfer_requests_total",
        "kubeinfer_queue_size",
        "kubeinfer_inflight_requests",
        "kubeinfer_max_queue_delay_seconds",
        "kubeinfer_max_batch_size",
        "kubeinfer_device_utilization_ratio",
        "kubeinfer_model_load_seconds",
        "kubeinfer_warmup_seconds",
        "kubeinfer_quantization_cosine_mean_ratio",
        "kubeinfer_quantization_retrieval_agreement_ratio",
        "kubeinfer_config_reload_errors_total",
        "kubeinfer_service_time_intercept_seconds",
        "kubeinfer_service_time_slope_seconds",
        "kubeinfer_instance_concurrency",
        "kubeinfer_cold_start_stage_seconds_bucket",
    ):
        assert re.search(rf'^{name}{{.*model="minilm"', text, re.MULTILINE), name
    # the process's start, each stage once: the first answer (the request above) after readiness
    starts = dict(
        re.findall(
            r'^kubeinfer_cold_start_stage_seconds_sum\{[^}]*stage="(\w+)"\} (\S+)$', text, re.MULTILINE
        )
    )
    assert list(starts) == ["fetched", "loaded", "warmed", "first_answer"], starts
    assert 0.0 < float(starts["fetched"]) <= float(starts["loaded"]) <= float(starts["warmed"])
    assert float(starts["warmed"]) <= float(starts["first_answer"])
    # CPU: no accelerator memory series (absent, not a misleading zero)
    assert not re.search(r"^kubeinfer_accelerator_memory_bytes\{", text, re.MULTILINE)
    assert 0.0 < metric(text, 'kubeinfer_device_utilization_ratio{model="minilm"}') <= 1.0
    assert metric(text, 'kubeinfer_instance_concurrency{model="minilm"}') == 1.0  # one instance
    assert metric(text, 'kubeinfer_model_load_seconds{model="minilm"}') > 0
    assert metric(text, 'kubeinfer_requests_total{code="200",model="minilm"}') >= 1
    # s(b) = a + c*b, fitted at warmup and from the batches run: a real line, in seconds (MiniLM on
    # CPU takes milliseconds per row, not microseconds or seconds)
    a = metric(text, 'kubeinfer_service_time_intercept_seconds{model="minilm"}')
    c = metric(text, 'kubeinfer_service_time_slope_seconds{model="minilm"}')
    assert 0.0 <= a < 1.0 and 1e-4 < c < 0.5, (a, c)


def test_responses_with_a_body_are_not_delayed_by_nagle(runtime: RuntimeProcess) -> None:
    """Regression: without TCP_NODELAY every response with a body waited ~40 ms for a delayed ACK."""
    conn = http.client.HTTPConnection("127.0.0.1", runtime.port, timeout=10)
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        conn.request("GET", "/v2")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    assert float(np.median(times)) < 0.03, times  # the Nagle + delayed-ACK signature is >= 40 ms


def test_64_concurrent_clients_all_correct_and_batched(runtime: RuntimeProcess) -> None:
    client = httpclient.InferenceServerClient(runtime.address)
    texts = [f"{SENTENCES[i % 8]} Request number {i}." for i in range(64)]
    reference = np.concatenate([embed(client, [t]) for t in texts[:8]])
    before = metric(runtime.metrics_text(), 'kubeinfer_batch_size_count{model="minilm"}')
    pool = httpclient.InferenceServerClient(runtime.address, concurrency=64)
    futures = [pool.async_infer("minilm", [text_input([t])]) for t in texts]
    results = [f.get_result().as_numpy("embedding") for f in futures]
    pool.close()
    for i, out in enumerate(results):
        assert out is not None and out.shape == (1, 384)
        assert np.isclose(np.linalg.norm(out), 1.0, atol=1e-4)
        if i < 8:  # batched with padding gives the same embedding as alone
            np.testing.assert_allclose(out[0], reference[i], atol=2e-4)
    assert len({tuple(np.round(r[0, :4], 5)) for r in results}) == 64  # each client got its own row
    text = runtime.metrics_text()
    batches = metric(text, 'kubeinfer_batch_size_count{model="minilm"}') - before
    assert batches < 64, "no batch carried more than one request"
    ones = metric(text, 'kubeinfer_batch_size_bucket{le="1.0",model="minilm"}')
    total = metric(text, 'kubeinfer_batch_size_count{model="minilm"}')
    assert total - ones > 0, "no batch of more than one row in /metrics"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_sweeps_minilm(runtime: RuntimeProcess, protocol: str, tmp_path: Path) -> None:
    # Triton's load generator, unmodified, on the bundled text model: its random strings (kept short:
    # the runtime refuses texts over 64 tokens here) as the [rows, 1] text the metadata describes.
    address = runtime.address if protocol == "http" else runtime.grpc_address
    report = tmp_path / "report.csv"
    args = command(perf_analyzer(), "minilm", address, protocol, report, *MINILM)
    proc, shown = run(args, tmp_path)
    assert proc.returncode == 0, shown
    rows = check_report(report, shown)
    print(f"\nminilm over {protocol}: " + ", ".join(f"{r['Inferences/Second']:.0f}/s" for r in rows))


def test_error_statuses(runtime: RuntimeProcess) -> None:
    doc = {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    status, _, body = post(runtime, "/v2/models/minilm/infer", json.dumps(doc).encode())
    assert status == 400 and "input tensor 'text': expected datatype BYTES" in json.loads(body)["error"]
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["one"]}]}
    status, _, body = post(runtime, "/v2/models/minilm/infer", json.dumps(doc).encode())
    assert status == 400 and "'text'" in json.loads(body)["error"]
    status, _, body = post(runtime, "/v2/models/nope/infer", b"{}")
    assert status == 404 and "unknown model" in json.loads(body)["error"]
    long_text = " ".join(["word"] * 200)
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [long_text]}]}
    status, _, body = post(runtime, "/v2/models/minilm/infer", json.dumps(doc).encode())
    assert status == 413 and "tokens" in json.loads(body)["error"]
    client = httpclient.InferenceServerClient(runtime.address)
    with pytest.raises(InferenceServerException) as info:
        client.infer("minilm", [text_input(["x"] * 9)])  # more rows than the warmed maximum (8)
    assert info.value.status() == "413"
    # 504: a 1 ms queue timeout behind a backlog of full batches
    pool = httpclient.InferenceServerClient(runtime.address, concurrency=40)
    backlog = [pool.async_infer("minilm", [text_input(SENTENCES)]) for _ in range(24)]
    time.sleep(0.05)
    with pytest.raises(InferenceServerException) as info:
        client.infer("minilm", [text_input(["late"])], timeout=1000)
    assert info.value.status() == "504" and "timed out" in str(info.value)
    for f in backlog:
        f.get_result()
    pool.close()


def test_hot_reload_429_and_invalid_config(runtime: RuntimeProcess, http_workers: int) -> None:
    def gauge(name: str) -> float:
        return metric(runtime.metrics_text(), f'{name}{{model="minilm"}}')

    def wait_gauge(name: str, value: float) -> None:
        deadline = time.monotonic() + 10
        while gauge(name) != value:
            assert time.monotonic() < deadline, f"{name} stayed {gauge(name)}, expected {value}"
            time.sleep(0.2)

    runtime.write_config(
        base_config(http_workers, max_batch_size=4, max_queue_delay_seconds=0.05, max_queue_size=2)
    )
    wait_gauge("kubeinfer_max_batch_size", 4)
    assert gauge("kubeinfer_max_queue_delay_seconds") == 0.05
    # 429 with Retry-After once 2 requests are queued
    pool = httpclient.InferenceServerClient(runtime.address, concurrency=32)
    futures = [pool.async_infer("minilm", [text_input(SENTENCES[:4])]) for _ in range(32)]
    outcomes: list[str] = []
    for f in futures:
        try:
            f.get_result()
            outcomes.append("200")
        except InferenceServerException as exc:
            outcomes.append(str(exc.status()))
    pool.close()
    assert set(outcomes) <= {"200", "429"} and "429" in outcomes and "200" in outcomes
    # invalid content: old settings kept, error counted
    errors = metric(runtime.metrics_text(), 'kubeinfer_config_reload_errors_total{model="minilm"}')
    runtime.write_config("batching:\n  max_batch_size: 0\n")
    deadline = time.monotonic() + 10
    while metric(runtime.metrics_text(), 'kubeinfer_config_reload_errors_total{model="minilm"}') == errors:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert gauge("kubeinfer_max_batch_size") == 4
    assert "batching.max_batch_size" in runtime.log_text()
    runtime.write_config(base_config(http_workers, max_batch_size=64))  # over the warmed maximum: refused
    deadline = time.monotonic() + 10
    while "over the warmed maximum" not in runtime.log_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert gauge("kubeinfer_max_batch_size") == 4
    runtime.write_config(base_config(http_workers))
    wait_gauge("kubeinfer_max_batch_size", 8)


@pytest.mark.parametrize("workers", HTTP_WORKERS)
def test_sigterm_under_load_loses_nothing(workers: int) -> None:
    rt = RuntimeProcess(base_config(workers, max_queue_delay_seconds=0.02), wait_ready=False)
    with rt:
        status, _, body = post(rt, "/v2/models/minilm/infer", b"{}")
        assert status == 503, body  # not ready yet: model loading
        rt.wait_until_ready(120)
        outcomes: list[str] = []
        finished: list[float] = []
        lock = threading.Lock()
        stop = threading.Event()

        def client_loop(i: int) -> None:
            client = httpclient.InferenceServerClient(rt.address, network_timeout=60)
            n = 0
            while not stop.is_set() and n < 200:
                n += 1
                try:
                    out = client.infer("minilm", [text_input([f"client {i} request {n}"])]).as_numpy(
                        "embedding"
                    )
                    ok = out is not None and out.shape == (1, 384)
                    outcome = "200" if ok else "bad"
                except InferenceServerException as exc:
                    outcome = str(exc.status())
                except Exception as exc:  # connection refused after the listener closed
                    outcome = "refused" if "refused" in str(exc).lower() else f"{type(exc).__name__}: {exc}"
                with lock:
                    outcomes.append(outcome)
                    finished.append(time.monotonic())
                if outcome not in ("200",):
                    break

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(outcomes) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        served_before = len(outcomes)
        assert rt.proc is not None
        signalled = time.monotonic()
        code = rt.stop(timeout=60)
        stop.set()
        for t in threads:
            t.join(30)
        assert code == 0, rt.tail()
        assert "drained" in rt.log_text()
    bad = [o for o in outcomes if o not in ("200", "503", "refused")]
    assert not bad, bad[:5]
    in_flight_at_signal = sum(
        1 for o, t in zip(outcomes, finished, strict=True) if o == "200" and t > signalled
    )
    assert in_flight_at_signal >= 1, "no request was in flight at SIGTERM: the test proved nothing"
    print(
        f"outcomes: { {o: outcomes.count(o) for o in set(outcomes)} }, "
        f"200 after SIGTERM: {in_flight_at_signal}"
    )
    assert served_before >= 100 and outcomes.count("200") >= served_before


@pytest.mark.parametrize("workers", HTTP_WORKERS)
def test_responses_after_sigterm_close_their_keep_alive_connections(workers: int) -> None:
    """From the SIGTERM on, a response ends its connection (``Connection: close``): the client's next
    request opens a new connection instead of being sent on one the shutdown closes under it."""
    cfg = base_config(workers)
    cfg.server.shutdown_delay_seconds = 3.0
    body = json.dumps(
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a keep-alive client"]}]}
    )

    def infer(conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
        conn.request("POST", "/v2/models/minilm/infer", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp

    with RuntimeProcess(cfg) as rt:
        conn = http.client.HTTPConnection(rt.address, timeout=30)
        before = infer(conn)
        assert before.status == 200 and before.getheader("connection") != "close"
        assert infer(conn).status == 200 and conn.sock is not None, "keep-alive: the same connection"
        assert rt.proc is not None
        rt.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while rt.get("/v2/health/ready")[0] != 503:
            assert time.monotonic() < deadline, "readiness did not turn false after SIGTERM"
            time.sleep(0.05)
        during = infer(conn)  # within server.shutdown_delay_seconds: served, and the connection ends
        assert during.status == 200
        assert during.getheader("connection") == "close"
        assert conn.sock is None, "http.client keeps a connection the server said it closes"
        again = http.client.HTTPConnection(rt.address, timeout=30)
        served = infer(again)
        assert served.status == 200 and served.getheader("connection") == "close"
        again.close()
        assert rt.proc.wait(60) == 0, rt.tail()
        assert "drained" in rt.log_text()


def test_sigterm_during_model_load_exits_promptly() -> None:
    rt = RuntimeProcess(base_config(), wait_ready=False)
    with rt:
        assert rt.get("/v2/health/ready")[0] == 503
        t0 = time.monotonic()
        code = rt.stop(timeout=30)
        took = time.monotonic() - t0
        assert code == 0, rt.tail()
        assert "ready: serving" not in rt.log_text()
        assert took < 5.0, f"exit took {took:.1f} s (waited for the model load?)"
