"""What every model of the API builds on: the base classes of the spec and status models, and the
helpers that write their CEL ``x-kubernetes-validations``.

Rules that span fields are written twice, on purpose: as CEL (so ``kubectl apply`` refuses a bad
manifest, message naming the field) and as pydantic validators (so the operator and unit tests see the
same rules). The rules of the format x engine x task x quantization table (``kubeinfer.contract.formats``)
are written once there and both forms derived here (:func:`_table_rules`, :func:`_check_table`), with the
operator's paths of the table's fields (:data:`FORMAT_RULES_SIDE`). The names here are private to the
package: its modules import them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubeinfer.operator.api.formats import DURATION_PATTERN
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from kubeinfer.contract import formats as table

#: The operator's paths of the fields of the format rules' table, under ``spec``.
FORMAT_RULES_SIDE = table.Side(
    name=table.OPERATOR,
    root="spec",
    paths={
        "format": "spec.model.format",
        "engine": "spec.runtime.engine",
        "task": "spec.model.task",
        "aggregation_strategy": "spec.model.aggregationStrategy",
        "overflow": "spec.model.overflow",
        "inputs": "spec.model.inputs",
        "outputs": "spec.model.outputs",
        "uri": "spec.model.uri",
        "quantization": "spec.quantization.mode",
        "calibration": "spec.quantization.calibration",
        "skip_modules": "spec.quantization.skipModules",
        "warmup_dims": "spec.warmup.dims",
        "gpus": "spec.resources.gpus",
        "device": "spec.runtime.device",
    },
)


class _Spec(BaseModel):
    """Spec models: camelCase aliases, unknown fields refused (the API server prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class _Status(BaseModel):
    """Status models: camelCase aliases, unknown fields ignored (other writers may add fields)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def _if_durations(rule: str, *fields: str) -> str:
    """The CEL ``rule`` guarded so that it runs only once every duration field in ``fields`` (names
    under ``self``) matched :data:`DURATION_PATTERN`: a bad value then gets the pattern's error alone,
    not also CEL's "type conversion error from 'string' to 'google.protobuf.Duration'"."""
    guard = " && ".join(f"self.{f}.matches(r'{DURATION_PATTERN}')" for f in fields)
    return f"!({guard}) || ({rule})"


def _cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> JsonDict:
    """One ``x-kubernetes-validations`` entry (``fieldPath``/``reason`` need Kubernetes >= 1.28)."""
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def _renamed_message(path: str, old: str, new: str) -> str:
    """The refusal of a renamed field under ``path``, e.g. ``spec.autoscaling.batchTimeout is now
    spec.autoscaling.maxQueueDelay``."""
    return f"{path}.{old} is now {path}.{new}"


def _schema_with_renamed(
    rules: list[JsonDict], path: str, renamed: Mapping[str, str]
) -> Callable[[JsonDict, type[BaseModel]], None]:
    """A model's ``json_schema_extra``: its CEL ``rules``, and the fields renamed under ``path`` (the
    object's path, ``spec.autoscaling``; ``renamed``: old name -> new name) kept in the schema only so
    that a CEL rule refuses them naming the new field. Without them in the schema the API server would
    prune an old field without a word, and the object would silently fall back to the defaults. An old
    field has the new one's JSON type (an object of any fields, or a string: CEL sees only typed
    fields), so a manifest from before the rename gets that one message. Pair it with
    :func:`_refuse_renamed` in a ``before`` validator."""

    def extra(schema: JsonDict, model: type[BaseModel]) -> None:
        properties = schema.setdefault("properties", {})
        assert isinstance(properties, dict)
        annotations = {info.alias or name: info.annotation for name, info in model.model_fields.items()}
        for old, new in renamed.items():
            kind = annotations[new]
            is_object = isinstance(kind, type) and issubclass(kind, BaseModel)
            properties[old] = {
                "description": f"Renamed: now {path}.{new} (refused here, the message names it).",
                **({"type": "object", "additionalProperties": True} if is_object else {"type": "string"}),
            }
        schema["x-kubernetes-validations"] = [
            *rules,
            *(
                _cel(f"!has(self.{old})", _renamed_message(path, old, new), f".{old}", "FieldValueForbidden")
                for old, new in renamed.items()
            ),
        ]

    return extra


def _refuse_renamed(data: Any, path: str, renamed: Mapping[str, str]) -> None:
    """Refuse a mapping ``data`` (a model's input, camelCase) holding a field renamed under ``path``,
    as the CRD's rule of :func:`_schema_with_renamed` does.

    Raises:
        ValueError: the first old field found, its message naming the new one.
    """
    if isinstance(data, Mapping):
        for old, new in renamed.items():
            if old in data:
                raise ValueError(_renamed_message(path, old, new))


def _table_rules(where: str) -> list[JsonDict]:
    """The CEL entries of the table's rules held by the object at ``where`` under ``spec`` (``"model"``:
    ``spec.model``; ``""``: ``spec`` itself), in the table's order."""
    side = FORMAT_RULES_SIDE
    return [
        _cel(table.cel(r, side), table.message(r, side), table.field_path(r, side), r.reason)
        for r in table.rules_at(side, where)
    ]


def _check_table(where: str, obj: object) -> None:
    """Apply the table's rules held by the object at ``where`` under ``spec`` to ``obj``, that object.

    Raises:
        ValueError: the first rule ``obj`` breaks, its message as the CRD's.
    """
    table.check(FORMAT_RULES_SIDE, where, obj)


def _cel_literal(value: object) -> str:
    """``value`` (a JSON scalar: bool, int, float, str) as a CEL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise TypeError(f"no CEL literal for {value!r}")


def _cel_at_default(path: str, default: object) -> str:
    """A CEL expression true when the field at ``path`` (``self.resources``) is absent or holds
    ``default``, its default value as JSON (a model's ``model_dump(by_alias=True, mode="json")``): a
    mapping field by field, ``None`` absent, an empty list or map empty, a scalar equal. Written so that
    it holds whether or not the API server filled in the schema's defaults."""
    if default is None:
        return f"!has({path})"
    if isinstance(default, dict) and default:
        fields = " && ".join(_cel_at_default(f"{path}.{k}", v) for k, v in default.items())
        return f"(!has({path}) || ({fields}))"
    if isinstance(default, dict | list):
        if default:
            raise ValueError(f"{path}: a non-empty list default cannot be compared in CEL")
        return f"(!has({path}) || {path}.size() == 0)"
    return f"(!has({path}) || {path} == {_cel_literal(default)})"


def _identity(body: Any) -> dict[str, Any]:
    """The identity of a custom-resource mapping: ``name``, ``namespace`` (``default`` when absent),
    ``uid`` (``""``) and ``generation`` (0), for a resource model's constructor. Raises ``KeyError``
    without ``metadata.name``."""
    meta = body.get("metadata") or {}
    return {
        "name": meta["name"],
        "namespace": meta.get("namespace") or "default",
        "uid": meta.get("uid") or "",
        "generation": int(meta.get("generation") or 0),
    }
