"""The Events the reconciler posts: for an update of an owned object, and for a transition of the
Ready condition (never for a resync that changes nothing). Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kubeinfer.operator import api, conditions
from kubeinfer.operator.reconcile.diff import is_subset
from kubeinfer.operator.status import conditions_of

#: An Event to post: ``(type, reason, message)``; type ``Normal`` or ``Warning``.
Event = tuple[str, str, str]


def update_events(
    desired: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    isvc: api.InferenceService,
    *,
    max_queue_delay: tuple[float | None, float],
) -> list[Event]:
    """Normal Events for an update of an owned object from ``current`` to ``desired``: a Deployment
    whose pod template changes ``RolloutStarted``; one whose replicas alone change ``Scaled``
    (``spec.replicas`` with autoscaling off or clamped into its bounds; the autoscaler posts its own
    ``Autoscaled``); a ConfigMap update that changes the max queue delay, with autoscaling off,
    ``MaxQueueDelayChanged`` (the runtime reloads it without a restart).

    ``max_queue_delay``: ``(before, now)`` in seconds, the InferenceService's ``status.maxQueueDelay``
    as the reconcile found it (the value the ConfigMap was last rendered with; ``None``: not known, no
    Event) and the value in force the ConfigMap is rendered with now. The values are compared (to
    within 1 ns, a duration's resolution), not their text nor the ConfigMaps'."""
    if current is None:
        return []
    if desired.get("kind") == "Deployment":
        want, have = desired.get("spec") or {}, current.get("spec") or {}
        if not is_subset(want.get("template") or {}, have.get("template") or {}):
            return [
                (
                    "Normal",
                    conditions.ROLLOUT_STARTED,
                    f"rolling out a new pod template (generation {isvc.generation})",
                )
            ]
        if "replicas" in want and want["replicas"] != have.get("replicas"):
            return [("Normal", conditions.SCALED, f"replicas {have.get('replicas')} → {want['replicas']}")]
    if desired.get("kind") == "ConfigMap" and not isvc.spec.autoscaling.enabled:
        before, now = max_queue_delay
        if before is not None and not math.isclose(before, now, rel_tol=0.0, abs_tol=1e-9):
            change = f"{api.format_duration(before)} → {api.format_duration(now)}"
            return [("Normal", conditions.MAX_QUEUE_DELAY_CHANGED, f"max queue delay {change}")]
    return []


def transition_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], note: str | None = None
) -> list[Event]:
    """The Events for the change of ``status.conditions`` from ``before`` to ``after``.

    Normal for expected transitions: ``RolloutFinished`` when Ready turns true as a rollout
    (Reconciling) ends, else the Ready reason when Ready turns true (e.g. a fault cleared), its
    message followed by ``note`` when given (what the model's fetch took); the
    start of a rollout or a scale is the apply's Event (:func:`update_events`). Warning only for
    faults: Ready turning false, or changing reason while false, with a reason not in
    :data:`conditions.EXPECTED_NOT_READY_REASONS`. Nothing when the conditions did not change in status or
    reason (a new message alone, e.g. new counts).
    """
    old, new = (
        conditions_of({"status": {"conditions": before}}),
        conditions_of({"status": {"conditions": after}}),
    )

    def key(conds: Mapping[str, Mapping[str, Any]], type_: str) -> tuple[str, str]:
        c = conds.get(type_) or {}
        return str(c.get("status", "")), str(c.get("reason", ""))

    events: list[Event] = []
    rec_before, rec_after = (
        key(old, conditions.CONDITION_RECONCILING)[0],
        key(new, conditions.CONDITION_RECONCILING)[0],
    )
    ready = new.get(conditions.CONDITION_READY)
    if ready is None or key(old, conditions.CONDITION_READY) == key(new, conditions.CONDITION_READY):
        return events
    status, reason, message = (
        str(ready.get("status")),
        str(ready.get("reason")),
        str(ready.get("message", "")),
    )
    if status == "True":
        finished = rec_before == "True" and rec_after != "True"
        text = f"Ready=True: {message}" + (f"; {note}" if note else "")
        events.append(("Normal", conditions.ROLLOUT_FINISHED if finished else reason, text))
    elif reason not in conditions.EXPECTED_NOT_READY_REASONS:
        events.append(("Warning", reason, f"Ready={status}: {message}"))
    return events
