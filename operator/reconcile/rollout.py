"""Where a Deployment's rollout stands, from the Deployment and its ReplicaSets. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Annotation of a Deployment and of its ReplicaSets: the rollout revision (the new ReplicaSet has the
#: Deployment's).
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
#: Label of a ReplicaSet's pods: the hash of the pod template it runs.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"


@dataclass(frozen=True)
class Rollout:
    """Where a Deployment's rollout stands, in the Deployment's own counts.

    ``desired``: ``spec.replicas``; ``replicas``: pods of every ReplicaSet (old and surge ones
    included, as ``status.replicas``); ``updated``: pods of the current template; ``ready``: ready
    pods (any template); ``available``: ready for ``minReadySeconds``; ``updated_ready``: ready pods
    of the current template (the new ReplicaSet's ``readyReplicas``; without it, derived: all ready
    pods when no old pod is left, else the ready pods beyond the old ones, a lower bound);
    ``observed``: the Deployment controller has seen the current template (``observedGeneration``);
    ``new_hash``: the new ReplicaSet's ``pod-template-hash`` (``None`` if unknown).
    """

    desired: int
    replicas: int = 0
    updated: int = 0
    ready: int = 0
    available: int = 0
    updated_ready: int = 0
    observed: bool = False
    new_hash: str | None = None

    @property
    def complete(self) -> bool:
        """Serving the current template with every desired replica and nothing else: observed,
        ``updated == replicas == available == desired`` and every updated pod ready."""
        counts = (self.updated, self.replicas, self.available, self.updated_ready)
        return self.observed and all(c == self.desired for c in counts)

    def summary(self) -> str:
        """``updated-ready/desired``, e.g. ``1/2`` (the Replicas printer column)."""
        return f"{self.updated_ready}/{self.desired}"

    def message(self) -> str:
        """The counts in words: ``1/2 replicas updated and ready (2 updated, 2 ready, 3 pods)``."""
        text = (
            f"{self.summary()} replicas updated and ready "
            f"({self.updated} updated, {self.ready} ready, {self.replicas} pods)"
        )
        return (
            text if self.observed else f"{text}; the Deployment controller has not seen the new template yet"
        )


def _int(mapping: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = mapping.get(key)
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default


def new_replicaset(
    deployment: Mapping[str, Any], replicasets: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The Deployment's new ReplicaSet among ``replicasets``: the one with its revision annotation."""
    revision = ((deployment.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    if revision is None:
        return None
    for rs in replicasets:
        if ((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION) == revision:
            return rs
    return None


def rollout_of(
    deployment: Mapping[str, Any], replicasets: Sequence[Mapping[str, Any]] | None = None
) -> Rollout:
    """The :class:`Rollout` of ``deployment`` (as stored); ``replicasets``: its ReplicaSets when
    listed (for ``updated_ready`` and ``new_hash``)."""
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    meta = deployment.get("metadata") or {}
    replicas, updated, ready = (
        _int(status, "replicas"),
        _int(status, "updatedReplicas"),
        _int(status, "readyReplicas"),
    )
    updated_ready = min(ready, updated) if replicas <= updated else max(0, ready - (replicas - updated))
    new_rs = new_replicaset(deployment, replicasets or [])
    new_hash: str | None = None
    if new_rs is not None:
        updated_ready = _int(new_rs.get("status") or {}, "readyReplicas")
        new_hash = ((new_rs.get("metadata") or {}).get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL)
    return Rollout(
        desired=_int(spec, "replicas", 1),
        replicas=replicas,
        updated=updated,
        ready=ready,
        available=_int(status, "availableReplicas"),
        updated_ready=updated_ready,
        observed=_int(status, "observedGeneration") >= _int(meta, "generation"),
        new_hash=new_hash,
    )


def new_pods(pods: Sequence[Mapping[str, Any]], new_hash: str | None) -> list[Mapping[str, Any]]:
    """The pods of the new ReplicaSet (all pods when it is not known)."""
    if new_hash is None:
        return list(pods)
    return [
        p
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == new_hash
    ]
