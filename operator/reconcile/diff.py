"""Desired against current, for one owned object: what to send, if anything. Pure: no I/O.

The reconciler compares before it writes: an owned object is applied only when it is absent, when the
desired object changed since the last apply (its applied-hash annotation differs), or when someone
edited a field the operator sets (drift). Fields the API server or other field managers add are left
alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kubeinfer.operator.builders.common import APPLIED_HASH_ANNOTATION

#: What to do with one owned object (see :func:`plan_apply`).
Action = Literal["create", "update", "revert", "none"]


def _quantity_equal(a: str, b: str) -> bool:
    try:
        from kubernetes.utils.quantity import parse_quantity

        return bool(parse_quantity(a) == parse_quantity(b))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ImportError):
        return False


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def is_subset(desired: Any, current: Any) -> bool:
    """True when every field set in ``desired`` has the same value in ``current``.

    Fields the API server adds (defaults, status, other managers' fields) are ignored. Equal up to:
    a missing field equals an empty list/map/``None``; quantity strings compare by value (``"1000m"``
    == ``"1"``); list elements compare position by position (same length required).
    """
    if isinstance(desired, Mapping):
        if _empty(current) and not desired:
            return True
        if not isinstance(current, Mapping):
            return False
        return all(is_subset(v, current.get(k)) if k in current else _empty(v) for k, v in desired.items())
    if isinstance(desired, list):
        if _empty(current) and not desired:
            return True
        if not isinstance(current, list) or len(current) != len(desired):
            return False
        return all(is_subset(d, c) for d, c in zip(desired, current, strict=True))
    if desired == current:
        return True
    if isinstance(desired, str) and isinstance(current, str):
        return _quantity_equal(desired, current)
    return False


def applied_hash(obj: Mapping[str, Any] | None) -> str | None:
    """The :data:`APPLIED_HASH_ANNOTATION` of an object, or ``None``."""
    if not obj:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(APPLIED_HASH_ANNOTATION)
    return str(value) if value is not None else None


def plan_apply(desired: Mapping[str, Any], current: Mapping[str, Any] | None) -> Action:
    """What to do with one owned object.

    ``create`` when absent; ``update`` when the desired object changed since the last apply (its
    applied-hash differs); ``revert`` when someone edited a field the operator sets (drift); else
    ``none`` (no request at all).
    """
    if current is None:
        return "create"
    if applied_hash(desired) != applied_hash(current):
        return "update"
    if not is_subset(desired, current):
        return "revert"
    return "none"
