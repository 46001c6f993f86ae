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
