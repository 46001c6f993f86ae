"""Large JSON requests are parsed without their inputs' ``data``: ``jsonscan.data_spans`` locates each
``data`` (numpy, the GIL released) and ``protocol.decode_request`` parses the rest, then each ``data``
once it is counted. Checked against msgspec's own reading of the same texts, across block boundaries,
and for the time the interpreter is held on a 64 MB body of numbers."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import msgspec
import numpy as np
import pytest
from kubeinfer.runtime import jsonscan, protocol
from kubeinfer.runtime.config import LimitsConfig
from kubeinfer.runtime.errors import InputError, ProtocolError
from kubeinfer.runtime.protocol import decode_request


class _Input(msgspec.Struct):
    data: msgspec.Raw = msgspec.Raw(b"")


class _Body(msgspec.Struct):
    inputs: list[_Input]


def _noise(rng: random.Random) -> str:
    return "".join(rng.choice('ab"\\,[]{}: \n\u00e9') for _ in range(rng.randint(0, 5)))


def _random_request(rng: random.Random) -> dict[str, Any]:
    """A request of 1 to 4 inputs, each of some datatype and shape, its ``data`` flat, nested, a
    scalar or absent (binary), with parameters and keys in any order, strings full of JSON marks."""
    inputs = []
    for i in range(rng.randint(1, 4)):
        rows, cols = rng.randint(1, 3), rng.randint(1, 3)
        text = rng.random() < 0.5
        values: list[Any] = [_noise(rng) if text else rng.random() for _ in range(rows * cols)]
        data: Any = values
        if rng.random() < 0.3:
            data = [values[r * cols : (r + 1) * cols] for r in range(rows)]
        item: dict[str, Any] = {
            "name": f"in{i}{_noise(rng)}",
            "datatype": "BYTES" if text else "FP64",
            "shape": [rows, cols],
            "data": data,
        }
        if rng.random() < 0.3:
            item["parameters"] = {_noise(rng): [[_noise(rng)], {"x": [1, [2, [3]]]}]}
        keys = list(item)
        rng.shuffle(keys)
        inputs.append({k: item[k] for k in keys})
    body: dict[str, Any] = {"inputs": inputs}
    if rng.random() < 0.5:
        body["id"] = _noise(rng)
    if rng.random() < 0.5:
        body["outputs"] = [{"name": _noise(rng), "parameters": {"binary_data": False}}]
    if rng.random() < 0.5:
        body["parameters"] = {"deep": [[[[_noise(rng)]]]], "priority": 1}
    keys = list(body)
    rng.shuffle(keys)
    return {k: body[k] for k in keys}


@pytest.mark.parametrize("block", [1, 3, 64, jsonscan.BLOCK_BYTES])
def test_the_spans_are_the_data_msgspec_reads(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonscan, "BLOCK_BYTES", block)
    rng = random.Random(block)
    for _ in range(200 if block > 3 else 30):  # a block of a byte or three: numpy calls per byte
        request = _random_request(rng)
        text = json.dumps(request, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2])).encode()
        spans = jsonscan.data_spans(text)
        assert spans is not None, text
        expected = [bytes(i.data) or None for i in msgspec.json.decode(text, type=_Body).inputs]
        assert [None if s is None else text[s[0] : s[1]] for s in spans] == expected, text


@pytest.mark.parametrize(
    "text",
    [
        b"[1, 2]",  # not an object
        b'{"inputs": 5}',  # inputs not a list
        b'{"inputs": [5]}',  # an input not an object
        b'{"inputs": [{"data": [1]}], "inputs": []}',  # inputs twice
        b'{"inputs": [{"data": [1], "data": [2]}]}',  # data twice
        b'{"\\u0069nputs": [{"data": [1]}]}',  # a key written with escapes
        b'{"inputs": [{"data": [1]}]',  # unbalanced
        b'{"inputs": [{"data": [1]}]} {}',  # something after the object
        b'{"parameters": {}}',  # no inputs
    ],
)
def test_texts_that_are_not_clearly_an_outline_are_left_to_the_parser(text: bytes) -> None:
    assert jsonscan.data_spans(text) is None


def test_too_many_marks_outside_the_data_is_left_to_the_parser() -> None:
    text = json.dumps({"inputs": [{"data": [1]}], "x": [0] * (jsonscan.MAX_OUTLINE_MARKS + 1)}).encode()
    assert jsonscan.data_spans(text) is None


def _decoded(request: Any) -> dict[str, Any]:
    return {
        "id": request.id,
        "inputs": {k: v.tolist() for k, v in request.inputs.items()},
        "outputs": request.outputs,
        "parameters": request.parameters,
    }


def test_large_requests_decode_as_the_whole_parse_does(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    bodies = [json.dumps(_random_request(rng)).encode() for _ in range(200)]
    whole = [_decoded(decode_request(b)) for b in bodies]
    monkeypatch.setattr(protocol, "OUTLINE_SCAN_BYTES", 0)
    located = []
    data_spans = jsonscan.data_spans

    def spans(text: Any) -> Any:
        located.append(found := data_spans(text))
        return found

    monkeypatch.setattr(jsonscan, "data_spans", spans)
    assert [_decoded(decode_request(b)) for b in bodies] == whole
    assert len(located) == len(bodies) and all(s is not None for s in located)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # a data that is not JSON is found when that data is parsed, and named
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, ]}]}', "'x': 'data'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}], "id": tru}', "JSON"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": "a"}]}', "'x'"),
    ],
)
def test_bad_json_in_a_large_request_is_still_a_400(
    body: bytes, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "OUTLINE_SCAN_BYTES", 0)
    with pytest.raises(ProtocolError, match=message) as info:
        decode_request(body)
    assert info.value.status == 400


def test_a_64_mb_body_of_numbers_is_refused_without_holding_the_interpreter() -> None:
    # the body the hostile benchmark sends (16M floats declared as such); refused for its declared
    # elements. A thread beside the decode measures how long it waits for the interpreter: parsing the
    # whole text held it about 90 ms on the 2-core development machine; locating the data holds it
    # for a few numpy calls at a time.
    count = 16_000_000
    body = b'{"inputs":[{"name":"text","datatype":"FP32","shape":[%d],"data":[' % count
    body += b"1.0," * (count - 1) + b"1.0]}]}"
    limits = LimitsConfig(max_request_elements=1_000_000)

    def waits() -> list[float]:
        gaps: list[float] = []
        done = threading.Event()

        def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        try:
            with pytest.raises(InputError, match="16000000 elements"):
                decode_request(body, limits=limits)
        finally:
            done.set()
            ticker.join()
        return gaps

    # 1 ms sleeps; the bound is the whole parse's hold (about 90 ms) less a margin for a busy machine.
    # The best of up to three decodes: a hold of the interpreter comes back in each, where a busy
    # machine's scheduler (the other test worker on the same cores) may delay the ticker in one (82 ms
    # in a CI run).
    runs: list[list[float]] = []
    while len(runs) < 3 and not (runs and max(runs[-1]) < 0.05):
        runs.append(waits())
    gaps = min(runs, key=max)
    assert max(gaps) < 0.05, f"longest waits for the interpreter {[round(max(r) * 1000) for r in runs]} ms"
    assert np.median(gaps) < 0.01
