"""What a pool's replicas say of their models, and what the statuses make of it. Pure: no I/O.

The operator polls each ready pod of a pool for its model repository index (Triton's ``POST
/v2/repository/index``, with kubeinfer's keys: ``kubeinfer.contract.pool``'s ``INDEX_*``;
:mod:`kubeinfer.operator.reconcile.pool_poller` does the requests). This module turns the answers into:

- :func:`parse_index`: one pod's answer (the JSON array) into :class:`IndexEntry` by model name;
- :class:`PoolIndex`: every answering pod's entries, by pod name (what the poller keeps per pool);
- :func:`pooled_model_status`: ``status.model`` of a pooled InferenceService (loaded on which pods, bytes,
  last use, counts);
- :func:`load_failure`: the pod and cause of a failed load of a model (``Ready=False ModelLoadFailed``);
- :func:`pool_usage`: the ModelPool's loaded models, bytes used of the budget, evictions, per replica.

A field that changes on every request (the last use) is kept to the minute, so that a busy model's
status is written at most once a minute, not on every poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeinfer.contract.activator import RUNTIME_PORT, RUNTIME_PORT_NAME
from kubeinfer.contract.pool import (
    INDEX_EVICTIONS,
    INDEX_LAST_USED,
    INDEX_LOAD_ERROR,
    INDEX_LOAD_FAILURES,
    INDEX_LOADS,
    INDEX_RESIDENT_BYTES,
)

__all__ = [
    "READY",
    "IndexEntry",
    "PoolIndex",
    "format_bytes",
    "index_url",
    "load_failure",
    "parse_index",
    "pool_usage",
    "pooled_model_status",
]

#: Triton's index state of a loaded model.
READY = "READY"
#: The longest cause kept from a runtime's answer (a condition's message has room for more, an
#: answer is not trusted to be short).
MAX_CAUSE_CHARS = 1000


@dataclass(frozen=True)
class IndexEntry:
    """One model of one replica's index. ``last_used``: RFC 3339 to the minute, ``None`` before its first
    request; ``load_error``: the cause of its latest load when that failed."""

    name: str
    state: str = ""
    reason: str = ""
    resident_bytes: int = 0
    last_used: str | None = None
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    load_error: str | None = None

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded on this replica (Triton's ``READY``)."""
        return self.state == READY


@dataclass(frozen=True)
class PoolIndex:
    """The indexes of a pool's ready pods that answered: pod name -> model name -> entry."""

    replicas: Mapping[str, Mapping[str, IndexEntry]] = field(default_factory=dict)

    def entries(self, model: str) -> list[tuple[str, IndexEntry]]:
        """``(pod, entry)`` of ``model`` on each pod whose index lists it, by pod name."""
        found = ((pod, models.get(model)) for pod, models in sorted(self.replicas.items()))
        return [(pod, entry) for pod, entry in found if entry is not None]


def _count(value: Any) -> int:
    """A non-negative integer from an answer's value (anything else: 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _minute(value: Any) -> str | None:
    """An RFC 3339 UTC time truncated to the minute (``2026-12-06T03:12:47Z`` -> ``2026-12-06T03:12:00Z``);
    ``None`` for anything else."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.astimezone(UTC).replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: Any) -> str:
    return " ".join(value.split())[:MAX_CAUSE_CHARS] if isinstance(value, str) else ""


def parse_index(doc: Any) -> dict[str, IndexEntry]:
    """One replica's repository index (the parsed JSON array) by model name. Keys other than Triton's and
    ``kubeinfer.contract.pool``'s are ignored, a missing or ill-typed count is 0, an entry without a
    name is skipped.

    Raises:
        ValueError: ``doc`` is not a JSON array.
    """
    if not isinstance(doc, list):
        raise ValueError(f"the repository index is not a JSON array but {type(doc).__name__}")
    entries: dict[str, IndexEntry] = {}
    for item in doc:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            continue
        error = _text(item.get(INDEX_LOAD_ERROR))
        entries[item["name"]] = IndexEntry(
            name=item["name"],
            state=_text(item.get("state")),
            reason=_text(item.get("reason")),
            resident_bytes=_count(item.get(INDEX_RESIDENT_BYTES)),
            last_used=_minute(item.get(INDEX_LAST_USED)),
            loads=_count(item.get(INDEX_LOADS)),
            load_failures=_count(item.get(INDEX_LOAD_FAILURES)),
            evictions=_count(item.get(INDEX_EVICTIONS)),
            load_error=error or None,
        )
    return entries


def pooled_model_status(model: str, index: PoolIndex | None) -> dict[str, Any] | None:
    """``status.model`` (camelCase) of the pooled InferenceService serving ``model``: ``loadedOn`` (pods,
    sorted), ``replicas`` (pods that answered), ``residentBytes`` (the largest of its loaded processes),
    ``lastUsed`` (the latest, to the minute; absent before its first request), ``loads``,
    ``loadFailures``, ``evictions`` (summed over the pods). ``None`` when no pod answered."""
    if index is None or not index.replicas:
        return None
    found = index.entries(model)
    used = [e.last_used for _, e in found if e.last_used is not None]
    status: dict[str, Any] = {
        "loadedOn": [pod for pod, e in found if e.loaded],
        "replicas": len(index.replicas),
        "residentBytes": max((e.resident_bytes for _, e in found if e.loaded), default=0),
        "loads": sum(e.loads for _, e in found),
        "loadFailures": sum(e.load_failures for _, e in found),
        "evictions": sum(e.evictions for _, e in found),
    }
    if used:
        status["lastUsed"] = max(used)
    return status


def load_failure(model: str, index: PoolIndex | None) -> tuple[str, str] | None:
    """``(pod, cause)`` of the first pod (by name) whose latest load of ``model`` failed; ``None`` when none
    did (or no pod answered)."""
    if index is None:
        return None
    for pod, entry in index.entries(model):
        if entry.load_error is not None:
            return pod, entry.load_error
    return None


def format_bytes(n: int) -> str:
    """Bytes in the largest binary unit that keeps the value at least 1, three significant digits at most
    (``0`` -> ``0``, ``1536`` -> ``1.5Ki``, ``432013312`` -> ``412Mi``, ``3221225472`` -> ``3Gi``)."""
    value, unit = float(n), ""
    for next_unit in ("Ki", "Mi", "Gi", "Ti"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    text = f"{value:.3g}" if value < 1000 else f"{value:.0f}"
    return f"{text}{unit}"


def pool_usage(index: PoolIndex | None, budget: str) -> dict[str, Any]:
    """The ModelPool's status fields (camelCase) from its replicas' indexes: ``loadedModels`` (models
    loaded on at least one pod), ``residentBytes`` (the fullest pod's loaded models together),
    ``memoryUsed`` (that of ``budget``, the spec's ``memoryBudget`` as written, e.g. ``412Mi/1Gi``),
    ``evictions`` (summed), ``replicaModels`` (per pod, by name). Every field ``None`` (removed) when no
    pod answered."""
    if index is None or not index.replicas:
        keys = ("loadedModels", "residentBytes", "memoryUsed", "evictions", "replicaModels")
        return dict.fromkeys(keys)
    replicas: list[dict[str, Any]] = []
    loaded_anywhere: set[str] = set()
    fullest = evictions = 0
    for pod, models in sorted(index.replicas.items()):
        loaded = sorted(e.name for e in models.values() if e.loaded)
        resident = sum(e.resident_bytes for e in models.values() if e.loaded)
        evicted = sum(e.evictions for e in models.values())
        replicas.append({"pod": pod, "loaded": loaded, "residentBytes": resident, "evictions": evicted})
        loaded_anywhere.update(loaded)
        fullest, evictions = max(fullest, resident), evictions + evicted
    return {
        "loadedModels": len(loaded_anywhere),
        "residentBytes": fullest,
        "memoryUsed": f"{format_bytes(fullest)}/{budget}",
        "evictions": evictions,
        "replicaModels": replicas,
    }


def index_url(pod: Mapping[str, Any]) -> str | None:
    """The URL of a ready pool pod's repository index, ``http://POD_IP:PORT/v2/repository/index`` (the
    container port named ``http``, else 8080; an IPv6 address in brackets); ``None`` unless the pod is
    Running, its ``Ready`` condition True, with an IP, and not being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    conds = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    ip = status.get("podIP")
    if status.get("phase") != "Running" or not ready or not ip or meta.get("deletionTimestamp"):
        return None
    port = RUNTIME_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for named in container.get("ports") or []:
            if named.get("name") == RUNTIME_PORT_NAME and isinstance(named.get("containerPort"), int):
                port = named["containerPort"]
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return f"http://{host}:{port}/v2/repository/index"
