"""The table of format x engine x task x quantization rules (kubeinfer.contract.formats): the CRD's CEL and
both sides' pydantic checks come from its rows, and agree with them on a grid of combinations.

No CEL library is installed: a small evaluator of the CEL the table generates (``||``, ``&&``, ``!``,
``? :``, ``==``, ``!=``, ``>``, ``has()``, ``size()``, ``self.a.b``, string and integer literals) runs the
CRD's rules as the API server would."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_args

import pydantic
import pytest
from kubeinfer.operator import api, crdgen
from kubeinfer.operator.builders.configmap import runtime_config
from kubeinfer.runtime import config

from kubeinfer.contract import formats as table
from kubeinfer.contract import sources

pytestmark = pytest.mark.timeout(120)

OPERATOR = api.FORMAT_RULES_SIDE
RUNTIME = config.FORMAT_RULES_SIDE

#: The values each abstract field takes in the grid (None: unset).
GRID: dict[str, tuple[Any, ...]] = {
    "format": table.FORMATS,
    "engine": (None, *table.ENGINES),
    "task": (None, "text-embedding", "token-classification", "reranking"),
    "aggregation_strategy": (None, "simple"),
    "overflow": (None, "truncate", "chunk"),
    "inputs": ((), ("x",)),
    "outputs": ((), ("y",)),
    "uri": (sources.BUNDLED, "/models/m"),
    "quantization": table.QUANTIZATIONS,
    "calibration": (None, "/data/calibration.txt"),
    "skip_modules": ((), ("encoder.layer.0",)),
    "warmup_dims": (None, (8, 16)),
    "gpus": (0, 1, 2),
    "device": table.DEVICES,
}


def _tensors(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": n, "datatype": "FP32", "shape": [-1, 4]} for n in names]


def operator_spec(v: Mapping[str, Any]) -> dict[str, Any]:
    """An InferenceService spec (camelCase, as a manifest writes it) of the combination ``v``: an unset
    or empty optional field left out."""
    model: dict[str, Any] = {"format": v["format"], "uri": v["uri"]}
    for name, key in (
        ("task", "task"),
        ("aggregation_strategy", "aggregationStrategy"),
        ("overflow", "overflow"),
    ):
        if v.get(name) is not None:
            model[key] = v[name]
    for name in ("inputs", "outputs"):
        if v.get(name):
            model[name] = _tensors(v[name])
    quantization: dict[str, Any] = {"mode": v["quantization"]}
    if v.get("calibration"):
        quantization["calibration"] = {"uri": v["calibration"]}
    if v.get("skip_modules"):
        quantization["skipModules"] = list(v["skip_modules"])
    runtime: dict[str, Any] = {"device": v["device"]}
    if v.get("engine") is not None:
        runtime["engine"] = v["engine"]
    spec: dict[str, Any] = {
        "model": model,
        "quantization": quantization,
        "runtime": runtime,
        "resources": {"gpus": v["gpus"]},
        "warmup": {"enabled": True},
    }
    if v.get("warmup_dims") is not None:
        spec["warmup"]["dims"] = list(v["warmup_dims"])
    return spec


def runtime_file(v: Mapping[str, Any]) -> dict[str, Any]:
    """A runtime.yaml (as a mapping) of the combination ``v``."""
    model: dict[str, Any] = {
        "format": v["format"],
        "source": v["uri"],
        "inputs": _tensors(v["inputs"]),
        "outputs": _tensors(v["outputs"]),
    }
    for name in ("engine", "task", "aggregation_strategy", "overflow"):
        if v.get(name) is not None:
            model[name] = v[name]
    data: dict[str, Any] = {
        "model": model,
        "quantization": {
            "mode": v["quantization"],
            "calibration_path": v.get("calibration"),
            "skip_modules": list(v["skip_modules"]),
        },
        "device": v["device"],
    }
    if v.get("warmup_dims") is not None:
        data["warmup"] = {"dims": list(v["warmup_dims"])}
    return data


def _values(v: Mapping[str, Any]) -> dict[str, Any]:
    """``v`` as the table's Python evaluation sees a side's values (tuples as lists)."""
    return {k: list(x) if isinstance(x, tuple) else x for k, x in v.items()}


def _combinations(fields: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Every combination of the grid's values of ``fields``, the other fields at their first value."""
    base = {k: vs[0] for k, vs in GRID.items()}
    for values in itertools.product(*(GRID[f] for f in fields)):
        yield {**base, **dict(zip(fields, values, strict=True))}


def _sample(count: int) -> list[dict[str, Any]]:
    """``count`` combinations of the whole grid (seeded: the same every run), each field's values each
    taken."""
    rng = random.Random(20261205)
    return [{k: rng.choice(vs) for k, vs in GRID.items()} for _ in range(count)]


# --- a CEL evaluator of the table's subset ----------------------------------------------------------

_TOKEN = re.compile(r"\s*(\|\||&&|==|!=|[!?:().>]|'[^']*'|[0-9]+|[A-Za-z_][A-Za-z0-9_]*)")
Node = Callable[[Mapping[str, Any]], Any]
_ABSENT = object()


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
}


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        assert match, f"cannot read CEL at {text[pos:]!r}"
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


class _Cel:
    """A recursive-descent reader of the table's CEL, each production a function of ``self``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        assert expected is None or token == expected, f"expected {expected!r}, got {token!r} in {self.text!r}"
        self.at += 1
        return token

    def expr(self) -> Node:
        cond = self.disjunction()
        if self.peek() != "?":
            return cond
        self.take("?")
        then = self.expr()
        self.take(":")
        other = self.expr()
        return lambda s: then(s) if cond(s) else other(s)

    def disjunction(self) -> Node:
        terms = [self.conjunction()]
        while self.peek() == "||":
            self.take()
            terms.append(self.conjunction())
        return terms[0] if len(terms) == 1 else lambda s: any(t(s) for t in terms)

    def conjunction(self) -> Node:
        terms = [self.unary()]
        while self.peek() == "&&":
            self.take()
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else lambda s: all(t(s) for t in terms)

    def unary(self) -> Node:
        if self.peek() == "!":
            self.take()
            inner = self.unary()
            return lambda s: not inner(s)
        left = self.primary()
        op = self.peek()
        if op not in _COMPARE:
            return left
        self.take()
        right = self.primary()
        compare = _COMPARE[op]
        return lambda s: compare(_defined(left(s)), _defined(right(s)))

    def path(self) -> list[str]:
        self.take("self")
        segments = []
        while self.peek() == ".":
            self.take()
            segments.append(self.take())
        return segments

    def primary(self) -> Node:
        token = self.take()
        if token == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if token in ("has", "size"):
            self.take("(")
            segments = self.path()
            self.take(")")
            if token == "has":
                return lambda s: _lookup(s, segments) is not _ABSENT
            return lambda s: len(_defined(_lookup(s, segments)))
        if token == "self":
            self.at -= 1
            segments = self.path()
            return lambda s: _lookup(s, segments)
        if token.startswith("'"):
            return lambda s: token[1:-1]
        assert token.isdigit(), f"unexpected {token!r} in {self.text!r}"
        return lambda s: int(token)


def cel_compile(text: str) -> Node:
    """The CEL ``text`` (the table's subset) as a function of ``self``."""
    reader = _Cel(text)
    node = reader.expr()
    assert reader.at == len(reader.tokens), f"CEL not read to its end: {text!r}"
    return node


def _lookup(obj: Mapping[str, Any], segments: list[str]) -> Any:
    for segment in segments:
        if not isinstance(obj, Mapping) or segment not in obj:
            return _ABSENT
        obj = obj[segment]
    return obj


def _defined(value: Any) -> Any:
    assert value is not _ABSENT, "CEL read an absent field (no such key): the API server would refuse"
    return value


def _crd_rules() -> dict[str, list[dict[str, Any]]]:
    """The CRD's x-kubernetes-validations of spec and its objects, by path under spec ("": spec)."""
    crd = crdgen.inference_service_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    out = {"": spec.get("x-kubernetes-validations", [])}
    for name, prop in spec["properties"].items():
        out[name] = prop.get("x-kubernetes-validations", [])
    return out


def _at(obj: dict[str, Any], where: str) -> dict[str, Any]:
    for segment in where.split(".") if where else ():
        obj = obj[segment]
    return obj


# --- the tests ----------------------------------------------------------------------------------------


def test_the_names_are_the_table_s() -> None:
    """The runtime's Literal types are the table's, and the CRD's enums list the table's values."""
    assert get_args(config.ModelFormat) == table.FORMATS
    assert get_args(config.Engine) == table.ENGINES
    assert get_args(config.Quantization) == table.QUANTIZATIONS
    assert get_args(config.Task) == table.TASKS
    assert get_args(config.AggregationStrategy) == table.AGGREGATION_STRATEGIES
    assert get_args(config.Device) == table.DEVICES
    props = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    spec = props["spec"]["properties"]
    assert tuple(spec["model"]["properties"]["format"]["enum"]) == table.FORMATS
    assert tuple(spec["quantization"]["properties"]["mode"]["enum"]) == table.QUANTIZATIONS
    assert tuple(spec["runtime"]["properties"]["engine"]["enum"]) == table.ENGINES
    assert set(table.FORMAT_ENGINES) == set(table.FORMATS)


@pytest.mark.parametrize("side", [OPERATOR, RUNTIME], ids=lambda s: s.name)
def test_each_side_maps_the_fields_of_its_rules(side: table.Side) -> None:
    assert set(side.paths) <= set(table.FIELDS)
    for rule in table.rules(side):
        assert set(rule.fields) <= set(side.paths), rule.name


def test_the_runtime_s_rules_are_the_operator_s() -> None:
    """Whatever the runtime refuses in its configuration the API server refused first."""
    operator = {r.name for r in table.rules(OPERATOR)}
    assert {r.name for r in table.rules(RUNTIME)} <= operator
    assert operator == {r.name for r in table.RULES}


def test_a_rule_out_of_its_form_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fields"):
        table.Rule("x", ok=table.Is("colour", "red"), subject="format", message="{format}")
    with pytest.raises(ValueError, match="unknown sides"):
        table.Rule("x", ok=table.Is("format", "onnx"), subject="format", message="m", sides=("kubelet",))


def test_the_crd_carries_every_operator_rule_where_it_belongs() -> None:
    crd_rules = _crd_rules()
    for rule in table.rules(OPERATOR):
        where = table.scope(rule, OPERATOR)
        entry = {
            "rule": table.cel(rule, OPERATOR),
            "message": table.message(rule, OPERATOR),
            "fieldPath": table.field_path(rule, OPERATOR),
            "reason": rule.reason,
        }
        assert entry in crd_rules[where], rule.name


def test_the_scopes() -> None:
    scopes = {r.name: table.scope(r, OPERATOR) for r in table.rules(OPERATOR)}
    assert scopes["torchscript-declares-tensors"] == "model"
    assert scopes["int8-static-calibrates"] == "quantization"
    assert scopes["engine-runs-format"] == ""
    assert scopes["one-gpu-per-replica"] == "resources"
    runtime = {r.name: table.scope(r, RUNTIME) for r in table.rules(RUNTIME)}
    assert runtime == {
        "torchscript-declares-tensors": "model",
        "engine-runs-format": "model",
        "task-of-huggingface": "model",
        "aggregation-of-token-classifiers": "model",
        "overflow-of-text-models": "model",
        "chunk-of-embedders-and-taggers": "model",
        "chunk-merges-entities": "model",
        "int8-static-calibrates": "quantization",
        "warmup-dims-of-tensor-models": "",
    }


@pytest.mark.parametrize("rule", table.rules(OPERATOR), ids=lambda r: r.name)
def test_the_cel_and_the_python_of_a_rule_agree(rule: table.Rule) -> None:
    """On every combination of the rule's fields, the CRD's CEL (run by the evaluator above on the
    manifest's object) and the table's Python evaluation say the same."""
    where = table.scope(rule, OPERATOR)
    program = cel_compile(table.cel(rule, OPERATOR))
    verdicts = set()
    for v in _combinations(rule.fields):
        by_cel = bool(program(_at(operator_spec(v), where)))
        assert by_cel == table.holds(rule.ok, _values(v)), (rule.name, v)
        verdicts.add(by_cel)
    assert verdicts == {True, False}, f"{rule.name}: the grid never breaks (or never keeps) it"


def _first_broken(side: table.Side, v: Mapping[str, Any], scopes: tuple[str, ...]) -> table.Rule | None:
    """The first rule of ``side`` that ``v`` breaks, the rules of the objects at ``scopes`` in that
    order (the order pydantic validates them: nested objects first)."""
    values = _values(v)
    for where in scopes:
        for rule in table.rules_at(side, where):
            if not table.holds(rule.ok, values):
                return rule
    return None


def _error(validate: Callable[[], object]) -> str | None:
    try:
        validate()
    except pydantic.ValidationError as exc:
        return str(exc)
    return None


SAMPLE = _sample(2500)


def test_the_operator_refuses_what_the_table_says() -> None:
    for v in SAMPLE:
        broken = _first_broken(OPERATOR, v, ("model", "quantization", "resources", ""))
        error = _error(lambda v=v: api.InferenceServiceSpec.from_k8s(operator_spec(v)))
        if broken is None:
            assert error is None, (v, error)
        else:
            assert error is not None and table.message(broken, OPERATOR) in error, (v, broken.name, error)


def test_the_runtime_refuses_what_the_table_says() -> None:
    for v in SAMPLE:
        broken = _first_broken(RUNTIME, v, ("model", "quantization", ""))
        error = _error(lambda v=v: config.RuntimeConfig.model_validate(runtime_file(v)))
        if broken is None:
            assert error is None, (v, error)
        else:
            expected = table.refusal(broken, RUNTIME, _values(v))
            assert error is not None and expected in error, (v, broken.name, error)


def test_the_runtime_and_the_operator_refuse_the_same_combinations() -> None:
    """A combination the runtime refuses the API server refuses too; one the operator accepts renders a
    runtime.yaml the runtime accepts; they differ only on the operator's own rules (the GPU count, the
    bundled model, what the runtime refuses when it loads the model)."""
    own = {r.name for r in table.rules(OPERATOR)} - {r.name for r in table.rules(RUNTIME)}
    both_refuse = 0
    for v in SAMPLE:
        by_operator = _error(lambda v=v: api.InferenceServiceSpec.from_k8s(operator_spec(v)))
        by_runtime = _error(lambda v=v: config.RuntimeConfig.model_validate(runtime_file(v)))
        broken_own = any(not table.holds(r.ok, _values(v)) for r in table.rules(OPERATOR) if r.name in own)
        assert (by_operator is not None) == (by_runtime is not None or broken_own), (
            v,
            by_operator,
            by_runtime,
        )
        both_refuse += by_operator is not None and by_runtime is not None
        if by_operator is None:
            isvc = api.InferenceService.from_body(
                {"metadata": {"name": "m", "namespace": "ns1", "uid": "u1"}, "spec": operator_spec(v)}
            )
            rendered = runtime_config(isvc, 0.005).to_yaml()
            config.RuntimeConfig.from_yaml(rendered)
    assert both_refuse > 0


@pytest.mark.parametrize(
    ("v", "message"),
    [
        (
            {"format": "pt2", "engine": "onnxruntime"},
            "model.engine onnxruntime does not run pt2 models; use torch",
        ),
        (
            {"format": "onnx", "engine": "torch"},
            "model.engine torch does not run onnx models; use onnxruntime",
        ),
        ({"format": "onnx", "task": "reranking"}, "model.task applies to huggingface models only, not onnx"),
        (
            {"format": "huggingface", "task": "reranking", "aggregation_strategy": "simple"},
            "model.aggregation_strategy applies to token-classification, not reranking",
        ),
        (
            {"format": "onnx", "aggregation_strategy": "simple"},
            "model.aggregation_strategy applies to huggingface token classifiers only, not onnx",
        ),
        ({"quantization": "int8-static"}, "quantization.calibration_path is required for int8-static"),
    ],
)
def test_the_runtime_s_own_wording(v: dict[str, Any], message: str) -> None:
    base = {k: vs[0] for k, vs in GRID.items()}
    error = _error(lambda: config.RuntimeConfig.model_validate(runtime_file({**base, "uri": "/m", **v})))
    assert error is not None and message in error
