"""InferenceService status: the conditions, the counts and the one writer of ``/status``.

Both the reconciler (field manager ``kubeinfer``: Ready, Serving, Reconciling, Stalled, the counts)
and the autoscaler (``kubeinfer-autoscaler``: AutoscalingActive, ``observed``, ``lastDecision``,
``maxQueueDelay``) write status through :class:`StatusWriter`, so the two follow the same rules:

- a write compares before it patches: only the fields whose value differs are sent, and a status
  that already says it all is not written at all (no request);
- a patch that carries ``conditions`` (a list, replaced whole by a merge patch) pins the
  ``resourceVersion`` it was computed from, so that one writer never drops the other's condition:
  the API server answers 409 instead, and :meth:`StatusWriter.update` re-reads the object and
  computes the fields again from it;
- the response of the writer's own last patch is remembered, so that a watch that has not caught up
  yet does not make it write the same fields again.

The condition helpers follow apimachinery's ``meta.SetStatusCondition``: ``lastTransitionTime``
moves only when a condition's status changes, every condition carries the generation it describes
(``observedGeneration``).

No API client is imported here (the writer is handed one, :class:`StatusClient`, which
``kubeinfer.operator.k8s.Kube`` is), so the pure planning modules of the reconciler may use the
condition helpers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kubeinfer.operator import api

T = TypeVar("T")

__all__ = [
    "ConditionState",
    "StatusClient",
    "StatusWrite",
    "StatusWriter",
    "conditions_of",
    "counts",
    "generation_of",
    "isvc_path",
    "merge_patch",
    "object_key",
    "put_condition",
    "remove_condition",
    "resource_version",
    "set_condition",
    "status_patch",
]


# --- conditions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConditionState:
    """What one condition says: ``status`` (``True``/``False``/``Unknown``), ``reason`` (CamelCase)
    and ``message`` (words)."""

    status: api.ConditionStatus
    reason: str
    message: str


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: api.ConditionStatus,
    reason: str,
    message: str,
    now: str,
    observed_generation: int,
) -> list[dict[str, Any]]:
    """``conditions`` (``status.conditions`` items, camelCase) with the one of type ``type_`` set.

    The model is apimachinery's ``meta.SetStatusCondition``: a new type is appended; an existing one
    is replaced in place, keeping its ``lastTransitionTime`` unless ``status`` changes (then it is
    ``now``, an RFC 3339 string). Every other item is copied unchanged. Pure: the input is not
    modified.
    """
    out = [dict(c) for c in conditions]
    transition = now
    for i, c in enumerate(out):
        if c.get("type") != type_:
            continue
        if c.get("status") == status and c.get("lastTransitionTime"):
            transition = str(c["lastTransitionTime"])
        out[i] = _condition(type_, status, reason, message, transition, observed_generation)
        return out
    out.append(_condition(type_, status, reason, message, transition, observed_generation))
    return out


def _condition(
    type_: str, status: str, reason: str, message: str, transition: str, generation: int
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }


def remove_condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> list[dict[str, Any]]:
    """``conditions`` without the one of type ``type_`` (``meta.RemoveStatusCondition``)."""
    return [dict(c) for c in conditions if c.get("type") != type_]


def put_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    state: ConditionState | None,
    now: str,
    generation: int,
) -> list[dict[str, Any]]:
    """:func:`set_condition` from ``state``, or :func:`remove_condition` when ``state`` is ``None``
    (kstatus's abnormal-true conditions, Reconciling and Stalled, are present only while true)."""
    if state is None:
        return remove_condition(conditions, type_)
    return set_condition(conditions, type_, state.status, state.reason, state.message, now, generation)


def conditions_of(obj: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """``status.conditions`` of an object (an InferenceService, a Deployment) by type."""
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in conds if isinstance(c, Mapping)}


# --- the object's identity and counts ------------------------------------------------------------------


def isvc_path(namespace: str, name: str) -> str:
    """API path of an InferenceService (``/apis/kubeinfer.io/v1alpha1/namespaces/<ns>/...``)."""
    return f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}"


def object_key(body: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of an object body: the key of what is remembered of it."""
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def generation_of(body: Mapping[str, Any]) -> int:
    """``metadata.generation`` of an object (0 when absent): the ``observedGeneration`` that status
    and each condition written from this body carry."""
    return int((body.get("metadata") or {}).get("generation") or 0)


def resource_version(obj: Mapping[str, Any] | None) -> int:
    """``metadata.resourceVersion`` as a number, to tell the newer of two copies of one object (0 when
    absent or not a number)."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def counts(deployment: Mapping[str, Any] | None) -> dict[str, int]:
    """The replica counts status mirrors from the Deployment's status (0 when absent): ``replicas``
    (pods of every version, surge and old ones included), ``readyReplicas``, ``updatedReplicas``."""
    dstatus = (deployment or {}).get("status") or {}
    return {
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": int(dstatus.get("readyReplicas") or 0),
        "updatedReplicas": int(dstatus.get("updatedReplicas") or 0),
    }


# --- the diff and the patch ----------------------------------------------------------------------------


def status_patch(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch of ``status``: the desired fields whose value differs (empty = no write).

    A desired ``None`` deletes the field (merge-patch semantics) and is no change where the field is
    already absent. A desired object (mapping) whose current one has keys it lacks carries them as
    ``None``: a merge patch merges objects, and those keys would otherwise stay."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        now = current.get(key)
        if now == value:
            continue
        if isinstance(value, Mapping) and isinstance(now, Mapping):
            value = {**dict.fromkeys(k for k in now if k not in value), **value}
        patch[key] = value
    return patch


def merge_patch(patch: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The request body that merge-patches ``status`` with ``patch``. When ``patch`` carries
    ``conditions`` it also pins ``body``'s ``resourceVersion`` (optimistic concurrency: the list is
    replaced whole, and the other writer's condition in it must not be lost)."""
    merge: dict[str, Any] = {"status": dict(patch)}
    if "conditions" in patch:
        merge["metadata"] = {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion")}
    return merge


# --- the writer ----------------------------------------------------------------------------------------


class StatusClient(Protocol):
    """What :class:`StatusWriter` needs of an API client (``kubeinfer.operator.k8s.Kube``)."""

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch of ``path``'s ``subresource``; returns the object as stored."""
        ...

    async def retry_on_conflict(
        self,
        path: str,
        body: Mapping[str, Any],
        write: Callable[[Mapping[str, Any]], Awaitable[T]],
        *,
        attempts: int = 2,
    ) -> T | None:
        """``write(body)``, and on a 409 ``write`` of the object re-read from ``path``."""
        ...


@dataclass(frozen=True)
class StatusWrite:
    """What one write did: ``body``, the InferenceService it compared with (``{}`` when it is gone);
    ``patch``, the fields sent (``{}``: none); ``stored``, the object as the API server stored it
    (``None``: nothing was sent)."""

    body: Mapping[str, Any]
    patch: dict[str, Any]
    stored: dict[str, Any] | None = None

    @property
    def before(self) -> Mapping[str, Any]:
        """The status the write compared with."""
        before: Mapping[str, Any] = self.body.get("status") or {}
        return before

    @property
    def sent(self) -> bool:
        """True when a request was sent."""
        return self.stored is not None


#: ``desire(current)`` → the status fields wanted given the InferenceService ``current`` (camelCase;
#: a ``None`` value deletes the field), or ``None`` to write nothing.
Desire = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


@dataclass
class StatusWriter:
    """The one writer of InferenceService status (or, with ``path``, of another kind's: the autoscaler's
    of a ModelPool), for one field manager (see the module docstring).

    ``client``: the API client; ``field_manager``: who writes (``kubeinfer``,
    ``kubeinfer-autoscaler``).
    """

    client: StatusClient
    field_manager: str
    #: the API path of an object of the kind written, from its namespace and name
    path: Callable[[str, str], str] = isvc_path
    _stored: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def latest(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The newer (by ``resourceVersion``) of ``body`` and the response of this writer's own last
        patch of that object."""
        mine = self._stored.get(object_key(body))
        return mine if mine is not None and resource_version(mine) > resource_version(body) else body

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is remembered of one InferenceService (it was deleted)."""
        self._stored.pop((namespace, name), None)

    async def write(self, body: Mapping[str, Any], desired: Mapping[str, Any]) -> StatusWrite:
        """Merge-patch the ``desired`` fields that differ from ``body``'s status; nothing when none
        differs. ``desired`` must have been computed from ``body`` (its ``resourceVersion`` is pinned
        when conditions are sent, see :func:`merge_patch`).

        Raises:
            k8s.TransientError: a 409 when ``body`` is no longer current and conditions were sent (the
                caller re-reads and recomputes, or uses :meth:`update`), or another transient error.
            k8s.PermanentError: the API server refused the patch.
        """
        patch = status_patch(desired, body.get("status") or {})
        if not patch:
            return StatusWrite(body, {})
        stored = await self.client.patch_merge(
            self.path(*object_key(body)),
            merge_patch(patch, body),
            field_manager=self.field_manager,
            subresource="status",
        )
        if resource_version(stored) > resource_version(self._stored.get(object_key(body))):
            self._stored[object_key(body)] = stored
        return StatusWrite(body, patch, stored)

    async def update(self, body: Mapping[str, Any], desire: Desire, *, attempts: int = 2) -> StatusWrite:
        """:meth:`write` of ``desire(current)``, ``current`` being the :meth:`latest` copy of ``body``;
        on a 409 the object is re-read and ``desire`` asked again, at most ``attempts`` times in all.
        A ``desire`` that returns ``None`` writes nothing (a decision for an older spec, say).

        Returns:
            What was written; nothing (``patch`` ``{}``) when the object is gone.

        Raises:
            k8s.TransientError: the last attempt's 409, or another transient error.
            k8s.PermanentError: the API server refused the patch or the re-read.
        """

        async def attempt(seen: Mapping[str, Any]) -> StatusWrite:
            current = self.latest(seen)
            desired = desire(current)
            if desired is None:
                return StatusWrite(current, {})
            return await self.write(current, desired)

        written = await self.client.retry_on_conflict(
            self.path(*object_key(body)), body, attempt, attempts=attempts
        )
        return written if written is not None else StatusWrite({}, {})
