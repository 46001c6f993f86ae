"""The Open Inference Protocol's published REST specification as a test: a bounded, seeded schemathesis
fuzz run of ``tests/vendor/open_inference_protocol/open_inference_rest.yaml`` (KServe's
``open_inference_rest.yaml``, unmodified) against real ``kubeinfer-runtime`` processes serving the
bundled ``minilm`` (one BYTES input, ``text``) and Triton's ``simple`` (INT32 ``INPUT0``, ``INPUT1``
[-1, 16], built as ONNX by ``hack.devtools.runtime_tiny.simple_onnx``).

Every operation of the specification gets a fixed number of generated requests (``MAX_EXAMPLES``):
requests the specification's schemas admit (positive) and, for the inference body, requests they do
not (negative), with the request schemas as published, narrowed to the model's tensors, and with the
model's valid tensors (``VARIANTS``); valid requests (``Served.valid``) are sent first.
Each answer must be no 5xx (``not_a_server_error``: a bad request is the client's fault, answered
with a 4xx that names the field), a status the (adapted) specification documents, a documented
content type, and a body that conforms to the specification's schema for that status where it
declares one; a negative request must be refused with a 4xx (``negative_data_rejection``). The run is
derandomized (the same requests every run, no example database), so a failure reproduces, and it
reports every failing operation with a ``curl`` command that reproduces it.

The specification is adapted on a loaded copy (``adapted_spec``), never in the vendored file; each
adaptation says why there. Run it alone with::

    .venv/bin/python -m pytest tests/integration/runtime/test_runtime_openapi_fuzz.py
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx

pytestmark = pytest.mark.timeout(300)

SPEC = Path(__file__).resolve().parents[2] / "vendor" / "open_inference_protocol" / "open_inference_rest.yaml"
#: Generated requests per operation and generation mode: enough to reach the decoder's corners (shapes,
#: datatypes, nested data, parameters), few enough for well under a minute on a loaded 2-core machine.
MAX_EXAMPLES = 50
#: The version the runtime serves of its one model (another is a 404, which the specification does not
#: document for these operations).
VERSION = "1"
#: The element types of the protocol's prose (inference_rest.md, "Tensor Data Types"); the YAML's
#: ``datatype`` is any string.
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
DATATYPES += ["FP16", "FP32", "FP64", "BF16", "BYTES"]
#: The request parameters kubeinfer reads (the binary tensor data and shared-memory extensions, the
#: request timeout and priority): properties of any JSON value, so the fuzzer reaches their checks
#: instead of generating only names nobody reads.
PARAMETERS = ["binary_data", "binary_data_output", "binary_data_size", "shared_memory_region"]
PARAMETERS += ["shared_memory_byte_size", "shared_memory_offset", "timeout", "priority", "classification"]
#: How the request schemas are generated from (``adapted_spec``).
VARIANTS = ["as-published", "model-aware", "valid-tensors"]
#: Any 4xx refuses a request the specification's schemas do not admit (413 when it is also over the limits,
#: 404 ...); schemathesis's default list has no 413. Passed explicitly, so no schemathesis.toml found in the
#: working directory changes the run.
CONFIG = {"checks": {"negative_data_rejection": {"expected-statuses": ["4XX"]}}}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass(frozen=True)
class Served:
    """A model a runtime serves: its name, tensor names and a valid inference request (sent as JSON and
    with its outputs as binary data, then the generated requests)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    valid: dict[str, Any]


MINILM = Served(
    "minilm",
    ("text",),
    ("embedding",),
    {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a cat", "a dog"]}]},
)
SIMPLE = Served(
    "simple",
    ("INPUT0", "INPUT1"),
    ("OUTPUT0", "OUTPUT1"),
    {
        "id": "1",
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for name in ("INPUT0", "INPUT1")
        ],
        "outputs": [{"name": "OUTPUT1"}],
    },
)


def adapted_spec(model: Served, variant: str) -> dict[str, Any]:
    """The vendored specification, loaded, with kubeinfer's documented differences applied, for one of
    ``VARIANTS``: ``as-published``, the request schemas as they are; ``model-aware``, narrowed to what
    ``model`` reads, so that generated tensors get past the name and datatype checks to the decoding of
    their shape, data and parameters (the published schemas allow any string there, which is nearly never
    a name the model has); ``valid-tensors``, the inputs those of ``model.valid``, so that requests reach
    the model with the rest (id, parameters, outputs) generated from the published schemas."""
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    paths: dict[str, Any] = {}
    for path, item in spec["paths"].items():
        # The specification's path templates are written `${MODEL_NAME}` (shell-style, as its prose
        # writes `v2/models/${MODEL_NAME}`); OpenAPI's template is `{MODEL_NAME}`, the `$` would be sent
        # literally as part of the model name.
        path = path.replace("${", "{")
        # `GET /v2/`: the prose's server metadata endpoint is `GET v2`, which kubeinfer serves (as
        # Triton does); `/v2/` is answered with a redirect to it.
        if path == "/v2/":
            path = "/v2"
        paths[path] = item
    spec["paths"] = paths
    infer = paths["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer"]["post"]
    error = {"$ref": "#/components/schemas/inference_error_response"}
    # A request that asks for binary output data (the binary tensor data extension, which the prose
    # describes and kubeinfer serves as Triton does) is answered with a JSON header and the tensors' bytes.
    infer["responses"]["200"]["content"]["application/octet-stream"] = {}
    # The prose says a failed inference is an HTTP error status, "usually 400"; kubeinfer answers 413 for
    # a request over its limits (tensor bytes, elements, text tokens, rows over the warmed batch size),
    # with the same error body.
    infer["responses"]["413"] = {
        "description": "Request over the runtime's limits",
        "content": {"application/json": {"schema": error}},
    }
    schemas = spec["components"]["schemas"]
    request = schemas["inference_request"]["properties"]
    # JSON null reads as an absent field (KServe's Python server, whose fields are optional, does the
    # same), and a numeric id as its text (Triton's JSON id is a string; a number was always served).
    request["id"] = {"anyOf": [{"type": "string", "nullable": True}, {"type": "number"}]}
    request["outputs"]["nullable"] = True
    schemas["parameters"]["nullable"] = True
    if variant == "valid-tensors":
        # The model's own valid inputs; parameters may be those kubeinfer reads (of any JSON value) too.
        request["inputs"] = {"enum": [model.valid["inputs"]]}
        schemas["parameters"]["properties"] = {name: {} for name in PARAMETERS}
    if variant == "model-aware":
        # One to as many inputs as the model has (none is refused at once), each named as one of the
        # model's, of a protocol datatype, with a small shape and a flat list of up to 4 scalars of any
        # JSON type: the number of elements often matches the shape, so the values get decoded (the
        # published schemas' nested data and huge shapes are fuzzed by the other variant).
        request["inputs"].update(minItems=1, maxItems=len(model.inputs))
        tensor = schemas["request_input"]["properties"]
        tensor["name"] = {"enum": list(model.inputs)}
        tensor["datatype"] = {"enum": DATATYPES}
        tensor["shape"].update(maxItems=2)
        tensor["shape"]["items"].update(minimum=0, maximum=2)
        scalar = {"anyOf": [{"type": "number"}, {"type": "string"}, {"type": "boolean"}]}
        tensor["data"] = {"type": "array", "maxItems": 4, "items": scalar}
        schemas["request_output"]["properties"]["name"] = {"enum": list(model.outputs)}
        # Parameters (of the request, an input, an output) are some of those kubeinfer reads, of any JSON
        # value: the published schema's free-form object nearly never names one.
        schemas["parameters"].update(
            properties={name: {} for name in PARAMETERS}, minProperties=1, additionalProperties=False
        )
    return spec


def simple_config(path: Path) -> RuntimeConfig:
    """A CPU runtime serving Triton's ``simple`` as ONNX (its tensors read from the model)."""
    return RuntimeConfig.model_validate(
        {
            "model": {"name": SIMPLE.name, "source": str(path), "format": "onnx"},
            "device": "cpu",
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.001},
        }
    )


def minilm_config() -> RuntimeConfig:
    """A CPU runtime serving the bundled ``minilm``."""
    return RuntimeConfig.model_validate(
        {
            "model": {"max_sequence_length": 64},
            "limits": {"max_text_tokens": 64},
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.001},
            "device": "cpu",
        }
    )


@pytest.fixture(scope="module", params=[MINILM, SIMPLE], ids=lambda m: m.name)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Served, RuntimeProcess]]:
    model: Served = request.param
    if model is SIMPLE:
        cfg = simple_config(simple_onnx(tmp_path_factory.mktemp("simple") / "simple.onnx"))
    else:
        cfg = minilm_config()
    with RuntimeProcess(cfg, ready_timeout=120) as rt:
        yield model, rt


@pytest.fixture
def same_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hypothesis now and then draws a constant found in the source of the local modules loaded (kubeinfer's,
    the tests'), and which modules those are depends on the tests run before in the same session: without
    them, the derandomized run sends the same requests alone and within the suite. (Its cache of allowed
    constants is cleared before, and after for the tests that follow.)"""
    monkeypatch.setattr(providers, "_get_local_constants", Constants)
    providers.CONSTANTS_CACHE.cache.clear()
    yield
    providers.CONSTANTS_CACHE.cache.clear()


def fuzz(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    model: Served,
    base_url: str,
    session: requests.Session,
    statuses: dict[str, Counter[int]],
) -> str | None:
    """Send ``MAX_EXAMPLES`` generated requests of ``operation`` (fewer where it has fewer distinct ones),
    each answer checked; the failure report, or None. ``statuses[label]`` counts the answers' statuses."""
    path_parameters = {}
    if "{MODEL_NAME}" in operation.path:
        # The model name and version must be the served ones, so that requests reach the model (any other
        # is a 404, which the specification does not document for these operations).
        path_parameters = {"MODEL_NAME": model.name, "MODEL_VERSION": VERSION}
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
    negative = mode is schemathesis.GenerationMode.NEGATIVE
    checks = [*CHECKS, negative_data_rejection] if negative else CHECKS
    label = f"{operation.method.upper()} {operation.path} [{mode.value}]"
    seen = statuses.setdefault(label, Counter())

    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(base_url=base_url, session=session, checks=checks, timeout=30)
        seen[response.status_code] += 1

    if operation.body and not negative:
        # Valid requests first, so that the answers of a model that ran (200, its outputs) are checked too:
        # as JSON, and with every output as binary data (the binary tensor data extension).
        binary = {**model.valid, "parameters": {"binary_data_output": True}}
        for body in (model.valid, binary):
            case = operation.Case(body=body, path_parameters=path_parameters, media_type="application/json")
            run = example(case=case)(run)
    run = given(case=strategy)(run)
    run = settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,  # the same requests on every run: a failure reproduces, nothing flakes
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(run)
    try:
        run()
    # a check's failures (a BaseExceptionGroup, with a curl command that reproduces them), a transport error
    except (FailureGroup, Exception) as exc:
        return f"{label}:\n{exc}"
    return None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.usefixtures("same_requests")
def test_the_open_inference_protocol_rest_spec_holds_under_fuzzing(
    served: tuple[Served, RuntimeProcess], variant: str
) -> None:
    model, rt = served
    schema = schemathesis.openapi.from_dict(
        adapted_spec(model, variant), config=schemathesis.Config.from_dict(CONFIG)
    )
    statuses: dict[str, Counter[int]] = {}
    failures: list[str] = []
    started = time.monotonic()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            modes = [schemathesis.GenerationMode.POSITIVE]
            if operation.body and variant != "as-published":
                # Requests the schemas do not admit; the narrowed schemas' negatives include the published
                # ones' (an unknown name or datatype, a wrong type anywhere).
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:
                failure = fuzz(operation, mode, model, rt.url, session, statuses)
                if failure:
                    failures.append(failure)
    seconds = time.monotonic() - started
    counts = {label: dict(seen) for label, seen in statuses.items()}
    total = sum(sum(seen.values()) for seen in statuses.values())
    print(f"{model.name}: {total} requests in {seconds:.1f} s: {counts}")
    assert not failures, "\n\n".join(failures)
    infer = statuses["POST /v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer [positive]"]
    assert infer[200] >= 2, f"the valid requests did not reach the model: {counts}"
    assert rt.proc is not None and rt.proc.poll() is None, f"the runtime exited:\n{rt.tail()}"
