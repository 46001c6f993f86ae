"""What every model of the API builds on: the base classes of the spec and status models, and the
helpers that write their CEL ``x-kubernetes-validations``.

Rules that span fields are written twice, on purpose: as CEL (so ``kubectl apply`` refuses a bad
manifest, message naming the field) and as pydantic validators (so the operator and unit tests see the
same rules). The names here are private to the package: its modules import them.
"""

from __future__ import annotations

from kubeinfer.operator.api.formats import DURATION_PATTERN
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict


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
