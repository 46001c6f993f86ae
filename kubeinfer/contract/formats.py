"""The table of format x engine x task x quantization rules: what a served model may combine, written
once, from which both sides derive their checks.

The names (formats, engines, tasks, aggregation strategies, quantization modes, devices) are ``Literal``
types here, with their values as tuples (:data:`FORMATS`, ...): the runtime's configuration and the
operator's spec both type their fields with them.

A rule (:class:`Rule`) is one row: what a valid combination satisfies (``ok``), an expression over
abstract field names (:data:`FIELDS`: ``format``, ``engine``, ``quantization``, ``gpus``, ...), the field
its message blames, and the message. Each side (:class:`Side`) maps the abstract fields to its own paths
(the operator: ``spec.model.format``; the runtime: ``model.format``); from a rule and a side come

- the CEL of the CRD's ``x-kubernetes-validations`` (:func:`cel`, :func:`field_path`, :func:`message`),
  on the object that holds every field of the rule (:func:`scope`: ``spec.model`` for a rule over model
  fields, ``spec`` for one spanning ``spec.model`` and ``spec.quantization``);
- the Python check of the side's pydantic validators (:func:`check`), on that same object.

Some rules apply on one side only (``Rule.sides``): the runtime knows no GPU count, and refuses what it
cannot serve on its device when it loads the model, not in its configuration.

Pure: standard library only, nothing of the operator or the runtime.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from kubeinfer.contract.sources import BUNDLED

#: The format of a served model.
ModelFormat = Literal["huggingface", "torchscript", "onnx", "pt2"]
#: What runs a model.
Engine = Literal["torch", "onnxruntime"]
#: What a Hugging Face model does; unset: detected from its ``config.json``.
Task = Literal["text-embedding", "text-classification", "token-classification", "reranking"]
#: How a token classifier groups its tokens' labels into entities: the transformers
#: ``TokenClassificationPipeline``'s ``aggregation_strategy`` values.
AggregationStrategy = Literal["none", "simple", "first", "average", "max"]
#: What a text model does with a text longer than its window (``max_text_tokens``, at most the model's
#: sequence length): refuse it (413), truncate it as transformers does (a pair: the second text), or, for
#: an embedder or a token classifier, chunk it into overlapping windows whose embeddings are pooled or
#: whose entities are merged.
Overflow = Literal["refuse", "truncate", "chunk"]
#: Post-training quantization applied at load.
Quantization = Literal["none", "fp16", "bf16", "int8-dynamic", "int8-static"]
#: The device a model runs on; ``auto``: a GPU when there is one.
Device = Literal["auto", "cpu", "cuda"]

FORMATS: tuple[ModelFormat, ...] = get_args(ModelFormat)
ENGINES: tuple[Engine, ...] = get_args(Engine)
TASKS: tuple[Task, ...] = get_args(Task)
AGGREGATION_STRATEGIES: tuple[AggregationStrategy, ...] = get_args(AggregationStrategy)
OVERFLOWS: tuple[Overflow, ...] = get_args(Overflow)
QUANTIZATIONS: tuple[Quantization, ...] = get_args(Quantization)
DEVICES: tuple[Device, ...] = get_args(Device)

#: The format of the bundled model (``model.uri`` / ``model.source`` :data:`~.sources.BUNDLED`).
BUNDLED_FORMAT: ModelFormat = "huggingface"
#: The engines that run each format.
FORMAT_ENGINES: Mapping[ModelFormat, tuple[Engine, ...]] = {
    "huggingface": ("torch", "onnxruntime"),
    "torchscript": ("torch",),
    "onnx": ("onnxruntime",),
    "pt2": ("torch",),
}

#: The abstract fields a rule speaks of, each mapped by a side to its path.
FIELDS = (
    "format",  # the model's format
    "engine",  # the engine, optional (unset: the format's default)
    "task",  # a huggingface model's task, optional (unset: detected)
    "aggregation_strategy",  # a token classifier's default aggregation, optional
    "overflow",  # what a text model does with a text longer than its window, optional (unset: refuse)
    "inputs",  # the declared input tensors, a list
    "outputs",  # the declared output tensors, a list
    "uri",  # where the model comes from (BUNDLED: the bundled model)
    "quantization",  # the quantization mode
    "calibration",  # the calibration data of int8-static, optional
    "skip_modules",  # the modules left unquantized, a list
    "warmup_dims",  # the sizes of variable dimensions in warmup, optional
    "gpus",  # the GPUs of a replica, a count
    "device",  # the device asked for
)

#: The sides, as a rule's ``sides`` names them.
OPERATOR = "operator"
RUNTIME = "runtime"

#: The values a rule's expression compares a field with.
Value = str | int


# --- expressions ----------------------------------------------------------------------------------
# A rule's condition, rendered as CEL over a side's paths and evaluated in Python over a side's objects.
# CEL's has() of an optional field is Python's "present": not None, and not an empty string or list (a
# side's pydantic model defaults a list the CRD leaves out to []).


@dataclass(frozen=True)
class Is:
    """``field == value``."""

    field: str
    value: Value


@dataclass(frozen=True)
class IsNot:
    """``field != value``."""

    field: str
    value: Value


@dataclass(frozen=True)
class Above:
    """``field > value`` (a number)."""

    field: str
    value: int


@dataclass(frozen=True)
class Present:
    """The optional ``field`` is set: CEL ``has(field)``."""

    field: str


@dataclass(frozen=True)
class Absent:
    """The optional ``field`` is not set: CEL ``!has(field)``."""

    field: str


@dataclass(frozen=True)
class NonEmpty:
    """The list ``field`` has an item: CEL ``has(field) && size(field) > 0``."""

    field: str


@dataclass(frozen=True)
class Empty:
    """The list ``field`` has no item: CEL ``!has(field) || size(field) == 0``."""

    field: str


@dataclass(frozen=True)
class All:
    """Every term holds: CEL ``a && b``."""

    terms: tuple[Expr, ...]


@dataclass(frozen=True)
class AnyOf:
    """A term holds: CEL ``a || b``."""

    terms: tuple[Expr, ...]


@dataclass(frozen=True)
class IfElse:
    """``then`` where ``cond`` holds, else ``other``: CEL ``cond ? then : other``."""

    cond: Expr
    then: Expr
    other: Expr


Expr = Is | IsNot | Above | Present | Absent | NonEmpty | Empty | All | AnyOf | IfElse


def all_of(*terms: Expr) -> Expr:
    """Every term holds (one term: that term)."""
    return terms[0] if len(terms) == 1 else All(terms)


def any_of(*terms: Expr) -> Expr:
    """A term holds (one term: that term)."""
    return terms[0] if len(terms) == 1 else AnyOf(terms)


def none_of(name: str, values: Iterable[Value]) -> Expr:
    """``name`` is none of ``values``: ``name != a && name != b``, in their order."""
    return all_of(*(IsNot(name, v) for v in values))


def fields_of(expr: Expr) -> tuple[str, ...]:
    """The abstract fields ``expr`` reads, each once, in the order they appear."""
    if isinstance(expr, All | AnyOf):
        return tuple(dict.fromkeys(f for t in expr.terms for f in fields_of(t)))
    if isinstance(expr, IfElse):
        return tuple(dict.fromkeys((*fields_of(expr.cond), *fields_of(expr.then), *fields_of(expr.other))))
    return (expr.field,)


# --- rules ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Explain:
    """A side's own wording of a rule's refusal, where it is not the rule's ``message``: used on
    ``side`` when ``when`` holds (``None``: always), the first such of a rule's ``explain`` winning."""

    side: str
    message: str
    when: Expr | None = None


@dataclass(frozen=True)
class Rule:
    """One rule of the table.

    - ``name``: a short name (tests and reports say it).
    - ``ok``: what a valid combination satisfies, over :data:`FIELDS`.
    - ``subject``: the field the refusal blames (the CRD rule's ``fieldPath``).
    - ``message``: the refusal, a ``str.format`` template in which ``{field}`` is a side's path of the
      field and ``{field.value}`` its value (the CRD's message is static: it names paths only).
    - ``reason``: the CRD rule's ``reason``.
    - ``sides``: the sides that apply the rule.
    - ``explain``: a side's own wording, by case (:class:`Explain`).

    Raises:
        ValueError: a field out of :data:`FIELDS`, or a side that is neither :data:`OPERATOR` nor
            :data:`RUNTIME`.
    """

    name: str
    ok: Expr
    subject: str
    message: str
    reason: str = "FieldValueInvalid"
    sides: tuple[str, ...] = (OPERATOR, RUNTIME)
    explain: tuple[Explain, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"rule {self.name!r}: unknown fields {unknown}; known: {FIELDS}")
        strange = sorted({*self.sides, *(e.side for e in self.explain)} - {OPERATOR, RUNTIME})
        if strange:
            raise ValueError(f"rule {self.name!r}: unknown sides {strange}")

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the rule reads or names (its condition, the cases of its wording, its subject and
        the fields its messages name), each once."""
        named = [n for m in (self.message, *(e.message for e in self.explain)) for n in _placeholders(m)]
        whens = [f for e in self.explain if e.when is not None for f in fields_of(e.when)]
        return tuple(dict.fromkeys((*fields_of(self.ok), *whens, self.subject, *named)))


@dataclass(frozen=True)
class Side:
    """How a side names the abstract fields: ``paths`` maps each field it knows to its dotted path as its
    messages write it (``spec.model.aggregationStrategy``); ``root`` is the path of the side's top object
    (``spec``; ``""``: none). A path's segments, in snake_case, are the Python attributes that reach the
    field's value from the object that holds a rule."""

    name: str
    paths: Mapping[str, str] = field(default_factory=dict)
    root: str = ""


def _placeholders(template: str) -> list[str]:
    """The fields a message template names (``{format}``, ``{format.value}`` -> ``format``)."""
    return [name.split(".")[0] for _, name, _, _ in string.Formatter().parse(template) if name]


def rules(side: Side) -> tuple[Rule, ...]:
    """The rules that ``side`` applies, in the table's order."""
    return tuple(r for r in RULES if side.name in r.sides)


def _relative(side: Side, name: str) -> list[str]:
    """The segments of ``name``'s path below ``side.root``.

    Raises:
        KeyError: ``side`` maps no path for ``name``.
        ValueError: the path is not under ``side.root``.
    """
    path = side.paths[name]
    if side.root:
        if not path.startswith(f"{side.root}."):
            raise ValueError(f"side {side.name!r}: {path!r} is not under {side.root!r}")
        path = path[len(side.root) + 1 :]
    return path.split(".")


def scope(rule: Rule, side: Side) -> str:
    """The path, below ``side.root``, of the object holding ``rule`` on ``side``: the deepest object
    that holds every field the rule reads (``""``: the top object)."""
    parents = [_relative(side, f)[:-1] for f in rule.fields]
    common: list[str] = []
    for segments in zip(*parents, strict=False):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return ".".join(common)


def rules_at(side: Side, where: str) -> tuple[Rule, ...]:
    """The rules of ``side`` held by the object at path ``where`` (below ``side.root``), in order."""
    return tuple(r for r in rules(side) if scope(r, side) == where)


def _below(rule: Rule, side: Side, name: str) -> list[str]:
    """``name``'s path segments below the object holding ``rule``."""
    where = scope(rule, side)
    depth = len(where.split(".")) if where else 0
    return _relative(side, name)[depth:]


def cel(rule: Rule, side: Side) -> str:
    """The CEL of ``rule`` (its ``ok``) on the object holding it, with ``side``'s paths."""
    return _cel(rule.ok, lambda name: "self." + ".".join(_below(rule, side, name)), None)


def field_path(rule: Rule, side: Side) -> str:
    """The CRD rule's ``fieldPath``: the subject's path below the object holding ``rule``."""
    return "." + ".".join(_below(rule, side, rule.subject))


def message(rule: Rule, side: Side) -> str:
    """``rule``'s refusal in ``side``'s static wording (paths, no values): the CRD's message."""
    return rule.message.format_map(_Names(side, {}))


def check(side: Side, where: str, obj: object) -> None:
    """Apply the rules of ``side`` held by the object at ``where`` (below ``side.root``) to ``obj``, that
    object, in the table's order.

    Raises:
        ValueError: the refusal of the first rule ``obj`` breaks, in ``side``'s wording.
    """
    for rule in rules_at(side, where):
        values = {n: _value(obj, _below(rule, side, n)) for n in rule.fields}
        if not holds(rule.ok, values):
            raise ValueError(refusal(rule, side, values))


def refusal(rule: Rule, side: Side, values: Mapping[str, object]) -> str:
    """``rule``'s refusal on ``side`` for a combination of ``values`` (by abstract field) that breaks it:
    the first of the side's :class:`Explain` whose case holds, else the rule's message."""
    template = next(
        (
            e.message
            for e in rule.explain
            if e.side == side.name and (e.when is None or holds(e.when, values))
        ),
        rule.message,
    )
    return template.format_map(_Names(side, values))


def holds(expr: Expr, values: Mapping[str, object]) -> bool:
    """Whether ``expr`` holds for ``values``, by abstract field (a missing one: unset)."""
    if isinstance(expr, All):
        return all(holds(t, values) for t in expr.terms)
    if isinstance(expr, AnyOf):
        return any(holds(t, values) for t in expr.terms)
    if isinstance(expr, IfElse):
        return holds(expr.then if holds(expr.cond, values) else expr.other, values)
    value = values.get(expr.field)
    if isinstance(expr, Is):
        return value == expr.value
    if isinstance(expr, IsNot):
        return value != expr.value
    if isinstance(expr, Above):
        return isinstance(value, int) and value > expr.value
    if isinstance(expr, Present | NonEmpty):
        return _present(value)
    return not _present(value)  # Absent, Empty


def _present(value: object) -> bool:
    return value is not None and value != "" and value != []


def _value(obj: object, segments: list[str]) -> object:
    for segment in segments:
        obj = getattr(obj, _snake(segment))
    return obj


def _snake(segment: str) -> str:
    """A path segment as a Python attribute: ``aggregationStrategy`` -> ``aggregation_strategy``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", segment).lower()


class _Named:
    """A field in a message template: its path as ``{field}``, its value as ``{field.value}``."""

    def __init__(self, path: str, value: object) -> None:
        self.path = path
        self.value = value

    def __format__(self, spec: str) -> str:
        return format(self.path, spec)


class _Names(dict[str, _Named]):
    """The fields of a message template, by name."""

    def __init__(self, side: Side, values: Mapping[str, object]) -> None:
        super().__init__()
        self._side = side
        self._values = values

    def __missing__(self, key: str) -> _Named:
        return _Named(self._side.paths[key], self._values.get(key))


def _literal(value: Value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def _cel(expr: Expr, path: Callable[[str], str], parent: type | None) -> str:
    """``expr`` as CEL; a compound term in a different compound (``a || (b && c)``) is parenthesized,
    terms of the same connective are not (``a && b && c``)."""
    if isinstance(expr, Is):
        return f"{path(expr.field)} == {_literal(expr.value)}"
    if isinstance(expr, IsNot):
        return f"{path(expr.field)} != {_literal(expr.value)}"
    if isinstance(expr, Above):
        return f"{path(expr.field)} > {expr.value}"
    if isinstance(expr, Present):
        return f"has({path(expr.field)})"
    if isinstance(expr, Absent):
        return f"!has({path(expr.field)})"
    kind: type
    if isinstance(expr, NonEmpty):
        text, kind = f"has({path(expr.field)}) && size({path(expr.field)}) > 0", All
    elif isinstance(expr, Empty):
        text, kind = f"!has({path(expr.field)}) || size({path(expr.field)}) == 0", AnyOf
    elif isinstance(expr, All):
        text, kind = " && ".join(_cel(t, path, All) for t in expr.terms), All
    elif isinstance(expr, AnyOf):
        text, kind = " || ".join(_cel(t, path, AnyOf) for t in expr.terms), AnyOf
    else:
        parts = (_cel(expr.cond, path, IfElse), _cel(expr.then, path, IfElse), _cel(expr.other, path, IfElse))
        text, kind = f"{parts[0]} ? {parts[1]} : {parts[2]}", IfElse
    return text if parent is None or (parent is kind and kind is not IfElse) else f"({text})"


# --- the rules ------------------------------------------------------------------------------------
# The order is the order of each CRD object's x-kubernetes-validations and of each side's checks.


def _not_run_by(engine: Engine) -> tuple[ModelFormat, ...]:
    """The formats ``engine`` does not run, in :data:`FORMATS` order."""
    return tuple(f for f in FORMATS if engine not in FORMAT_ENGINES[f])


RULES: tuple[Rule, ...] = (
    Rule(
        "torchscript-declares-tensors",
        ok=any_of(IsNot("format", "torchscript"), all_of(NonEmpty("inputs"), NonEmpty("outputs"))),
        subject="inputs",
        message="{inputs} and {outputs} are required when {format} is torchscript",
        reason="FieldValueRequired",
    ),
    # the runtime loads the bundled model as huggingface whatever the format says: the operator refuses
    *(
        Rule(
            f"bundled-model-is-{BUNDLED_FORMAT}-not-{fmt}",
            ok=any_of(IsNot("format", fmt), IsNot("uri", BUNDLED)),
            subject="uri",
            message=f"{{uri}}: the bundled default model is {BUNDLED_FORMAT}, not {fmt}",
            sides=(OPERATOR,),
        )
        for fmt in FORMATS
        if fmt != BUNDLED_FORMAT
    ),
    # what the GPU count allows: the runtime knows no count (it refuses fp16 off CUDA when it loads)
    Rule(
        "fp16-on-gpus",
        ok=any_of(IsNot("quantization", "fp16"), Above("gpus", 0)),
        subject="quantization",
        message="{quantization} fp16 requires {gpus} > 0",
        sides=(OPERATOR,),
    ),
    Rule(
        "bf16-on-gpus-or-cpu",
        ok=any_of(IsNot("quantization", "bf16"), Above("gpus", 0), Is("device", "cpu")),
        subject="quantization",
        message="{quantization} bf16 requires {gpus} > 0 (or {device} cpu)",
        sides=(OPERATOR,),
    ),
    Rule(
        "cuda-on-gpus",
        ok=any_of(IsNot("device", "cuda"), Above("gpus", 0)),
        subject="device",
        message="{device} cuda requires {gpus} > 0",
        sides=(OPERATOR,),
    ),
    # the runtime places every instance of its model on one device (cuda:0): a second GPU would sit idle
    Rule(
        "one-gpu-per-replica",
        ok=any_of(Is("gpus", 0), Is("gpus", 1)),
        subject="gpus",
        message="{gpus} must be 0 or 1: the runtime runs every instance of the model on one GPU (cuda:0), "
        "so more GPUs per replica would sit idle; scale out with spec.replicas",
        sides=(OPERATOR,),
    ),
    Rule(
        "engine-runs-format",
        ok=any_of(
            Absent("engine"),
            IfElse(
                Is("engine", "onnxruntime"),
                none_of("format", _not_run_by("onnxruntime")),
                none_of("format", _not_run_by("torch")),
            ),
        ),
        subject="engine",
        message="{engine}: torchscript and pt2 models run on torch, onnx models on onnxruntime",
        explain=(
            Explain(
                RUNTIME,
                "{engine} onnxruntime does not run {format.value} models; use torch",
                Is("engine", "onnxruntime"),
            ),
            Explain(RUNTIME, "{engine} torch does not run {format.value} models; use onnxruntime"),
        ),
    ),
    Rule(
        "task-of-huggingface",
        ok=any_of(Absent("task"), Is("format", "huggingface")),
        subject="task",
        message="{task} applies to huggingface models only",
        explain=(Explain(RUNTIME, "{task} applies to huggingface models only, not {format.value}"),),
    ),
    Rule(
        "overflow-of-text-models",
        ok=any_of(Absent("overflow"), Is("format", "huggingface")),
        subject="overflow",
        message="{overflow} applies to huggingface text models only",
        reason="FieldValueForbidden",
        explain=(Explain(RUNTIME, "{overflow} applies to huggingface text models only, not {format.value}"),),
    ),
    Rule(
        "chunk-of-embedders-and-taggers",
        ok=any_of(
            Absent("overflow"),
            IsNot("overflow", "chunk"),
            Absent("task"),
            Is("task", "text-embedding"),
            Is("task", "token-classification"),
        ),
        subject="overflow",
        message="{overflow} chunk applies to text-embedding models (their windows' embeddings are pooled) "
        "and token-classification models (their windows' entities are merged); use truncate or refuse",
        reason="FieldValueForbidden",
        explain=(
            Explain(
                RUNTIME,
                "{overflow} chunk applies to text-embedding and token-classification models, "
                "not {task.value}",
            ),
        ),
    ),
    # transformers' pipeline refuses stride with strategy none: one entity per token of a window, which
    # overlapping windows cannot merge (a detected token classifier: the runtime refuses it at load)
    Rule(
        "chunk-merges-entities",
        ok=any_of(
            Absent("overflow"),
            IsNot("overflow", "chunk"),
            Absent("task"),
            IsNot("task", "token-classification"),
            all_of(Present("aggregation_strategy"), IsNot("aggregation_strategy", "none")),
        ),
        subject="aggregation_strategy",
        message="{overflow} chunk on a token-classification model needs {aggregation_strategy} simple, "
        "first, average or max (overlapping windows' entities are merged; none gives one per token)",
        reason="FieldValueRequired",
    ),
    Rule(
        "aggregation-of-token-classifiers",
        ok=any_of(
            Absent("aggregation_strategy"),
            all_of(
                Is("format", "huggingface"),
                any_of(Absent("task"), Is("task", "token-classification")),
            ),
        ),
        subject="aggregation_strategy",
        message="{aggregation_strategy} applies to huggingface token classifiers only "
        "({task} token-classification, or unset and detected)",
        explain=(
            Explain(
                RUNTIME,
                "{aggregation_strategy} applies to huggingface token classifiers only, not {format.value}",
                IsNot("format", "huggingface"),
            ),
            Explain(RUNTIME, "{aggregation_strategy} applies to token-classification, not {task.value}"),
        ),
    ),
    Rule(
        "int8-static-calibrates",
        ok=any_of(IsNot("quantization", "int8-static"), Present("calibration")),
        subject="calibration",
        message="{calibration} is required when {quantization} is int8-static",
        reason="FieldValueRequired",
        explain=(Explain(RUNTIME, "{calibration} is required for int8-static"),),
    ),
    # the runtime refuses these when it loads the model, on the device it resolved
    Rule(
        "onnxruntime-on-cpu",
        ok=any_of(
            Absent("engine"),
            IsNot("engine", "onnxruntime"),
            all_of(none_of("quantization", ("fp16", "bf16")), Is("gpus", 0), Empty("skip_modules")),
        ),
        subject="engine",
        message="{engine} onnxruntime runs on the CPU, with quantization none, int8-dynamic or int8-static "
        "and no skipModules, in this release ({gpus} 0)",
        sides=(OPERATOR,),
    ),
    Rule(
        "warmup-dims-of-tensor-models",
        ok=any_of(Absent("warmup_dims"), IsNot("format", "huggingface")),
        subject="warmup_dims",
        message="{warmup_dims} applies to onnx, pt2 and torchscript models; a huggingface model warms its "
        "own sequence-length buckets",
        reason="FieldValueForbidden",
    ),
    Rule(
        "onnx-served-as-exported",
        ok=any_of(IsNot("format", "onnx"), Is("quantization", "none")),
        subject="quantization",
        message="{quantization}: ONNX models are served as exported (quantize before export); use none",
        sides=(OPERATOR,),
    ),
    Rule(
        "pt2-served-as-exported",
        ok=any_of(IsNot("format", "pt2"), Is("quantization", "none")),
        subject="quantization",
        message="{quantization}: pt2 programs are served as exported (quantize before export); use none",
        sides=(OPERATOR,),
    ),
)
