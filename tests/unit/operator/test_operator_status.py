"""kubeinfer.operator.status: the one status writer (compare before patch, resourceVersion pinned with
conditions, conflict retry, the watch lag) and the condition helpers both controllers use."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from kubeinfer.operator import k8s, status
from kubeinfer.operator.status import ConditionState, StatusWriter


class FakeApi:
    """An InferenceService on an API server: a merge patch of status pinned to an old resourceVersion
    is a 409, every write bumps the resourceVersion; ``interfere`` is another writer's status change
    that lands right before our next patch."""

    def __init__(self, isvc: dict[str, Any]) -> None:
        self.isvc = isvc
        self.patches: list[dict[str, Any]] = []
        self.reads = 0
        self.interfere: dict[str, Any] | None = None

    def _bump(self) -> None:
        self.isvc["metadata"]["resourceVersion"] = str(int(self.isvc["metadata"]["resourceVersion"]) + 1)

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        assert path == "/apis/kubeinfer.io/v1alpha1/namespaces/ns/inferenceservices/m"
        assert subresource == "status" and field_manager == "kubeinfer-test"
        if self.interfere is not None:
            self.isvc.setdefault("status", {}).update(self.interfere)
            self.interfere = None
            self._bump()
        self.patches.append(copy.deepcopy(patch))
        pinned = (patch.get("metadata") or {}).get("resourceVersion")
        if pinned is not None and pinned != self.isvc["metadata"]["resourceVersion"]:
            raise k8s.TransientError("conflict", status=409)
        for key, value in patch["status"].items():
            if value is None:
                self.isvc.setdefault("status", {}).pop(key, None)
            else:
                self.isvc.setdefault("status", {})[key] = copy.deepcopy(value)
        self._bump()
        return copy.deepcopy(self.isvc)

    async def get(self, path: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.isvc)

    retry_on_conflict = k8s.Kube.retry_on_conflict


def isvc(status_: dict[str, Any] | None = None, rv: str = "5") -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "ns", "generation": 2, "resourceVersion": rv},
        "status": status_ or {},
    }


def writer() -> tuple[StatusWriter, FakeApi]:
    fake = FakeApi(isvc({"replicas": 1, "url": "http://m"}))
    return StatusWriter(fake, "kubeinfer-test"), fake  # type: ignore[arg-type]


async def test_a_status_that_already_says_it_all_writes_nothing() -> None:
    w, fake = writer()
    written = await w.write(copy.deepcopy(fake.isvc), {"replicas": 1, "url": "http://m", "observed": None})
    assert not written.sent and written.patch == {} and fake.patches == []
    assert not (await w.update(copy.deepcopy(fake.isvc), lambda current: {"replicas": 1})).sent
    assert not (await w.update(copy.deepcopy(fake.isvc), lambda current: None)).sent  # nothing wanted
    assert fake.patches == []


async def test_only_the_fields_that_differ_are_sent_and_conditions_pin_the_resource_version() -> None:
    w, fake = writer()
    written = await w.write(copy.deepcopy(fake.isvc), {"replicas": 3, "url": "http://m"})
    assert written.patch == {"replicas": 3} and fake.patches == [{"status": {"replicas": 3}}]  # no pin
    body = copy.deepcopy(fake.isvc)
    conds = status.set_condition([], "Ready", "True", "Ok", "", "T", 2)
    await w.write(body, {"conditions": conds, "url": "http://m"})
    assert fake.patches[-1] == {"status": {"conditions": conds}, "metadata": {"resourceVersion": "6"}}


async def test_a_conflict_rereads_and_computes_the_fields_again() -> None:
    w, fake = writer()
    fake.interfere = {  # the other writer's condition, written between our read and our patch
        "conditions": [{"type": "AutoscalingActive", "status": "True", "reason": "Active", "message": ""}]
    }
    seen: list[list[str]] = []

    def desire(current: Mapping[str, Any]) -> dict[str, Any]:
        conds = (current.get("status") or {}).get("conditions") or []
        seen.append([c["type"] for c in conds])
        return {"conditions": status.set_condition(conds, "Ready", "False", "Progressing", "", "T", 2)}

    written = await w.update(copy.deepcopy(fake.isvc), desire)
    assert written.sent and fake.reads == 1 and seen == [[], ["AutoscalingActive"]]
    assert [c["type"] for c in fake.isvc["status"]["conditions"]] == ["AutoscalingActive", "Ready"]


async def test_a_conflict_on_every_attempt_is_raised() -> None:
    w, fake = writer()

    def desire(current: Mapping[str, Any]) -> dict[str, Any]:
        fake.interfere = {"replicas": 9}  # someone else always writes first
        return {"conditions": status.set_condition([], "Ready", "True", "Ok", "", "T", 2)}

    with pytest.raises(k8s.TransientError):
        await w.update(copy.deepcopy(fake.isvc), desire, attempts=2)
    assert len(fake.patches) == 2


async def test_a_watch_that_lags_behind_our_own_patch_writes_nothing_again() -> None:
    w, fake = writer()
    stale = copy.deepcopy(fake.isvc)  # what the watch still shows after our patch
    first = await w.update(stale, lambda current: {"replicas": 4})
    assert first.sent and first.stored is not None
    assert w.latest(stale) == first.stored
    again = await w.update(stale, lambda current: {"replicas": 4})  # compared with our stored patch
    assert not again.sent and len(fake.patches) == 1
    # someone resets the field later (a newer resourceVersion than our patch): written again
    fake.isvc["status"]["replicas"] = 1
    fake._bump()
    assert (await w.update(copy.deepcopy(fake.isvc), lambda current: {"replicas": 4})).sent
    w.forget("ns", "m")
    assert w.latest(stale) is stale


async def test_the_object_gone_on_the_reread_writes_nothing() -> None:
    w, fake = writer()
    fake.interfere = {"replicas": 2}

    async def gone(path: str) -> dict[str, Any] | None:
        return None

    fake.get = gone  # type: ignore[method-assign]
    written = await w.update(
        copy.deepcopy(fake.isvc),
        lambda current: {"conditions": status.set_condition([], "Ready", "True", "Ok", "", "T", 2)},
    )
    assert not written.sent and written.patch == {}


def test_condition_transitions_move_the_time_only_when_the_status_changes() -> None:
    progressing = status.put_condition([], "Ready", ConditionState("False", "Progressing", "0/1"), "T1", 1)
    broken = status.put_condition(
        progressing, "Ready", ConditionState("False", "CrashLoopBackOff", "x"), "T2", 2
    )
    assert broken[0]["lastTransitionTime"] == "T1"  # still False: the transition time stays
    assert (broken[0]["reason"], broken[0]["observedGeneration"]) == ("CrashLoopBackOff", 2)
    ready = status.put_condition(broken, "Ready", ConditionState("True", "Available", "1/1"), "T3", 2)
    assert ready[0]["lastTransitionTime"] == "T3"
    stalled = status.put_condition(ready, "Stalled", ConditionState("True", "X", ""), "T4", 2)
    assert [c["type"] for c in stalled] == ["Ready", "Stalled"]
    assert [c["type"] for c in status.put_condition(stalled, "Stalled", None, "T5", 2)] == ["Ready"]
    assert status.conditions_of({"status": {"conditions": stalled}})["Stalled"]["reason"] == "X"


def test_counts_generation_and_patch_helpers() -> None:
    assert status.counts(None) == {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0}
    dep = {"status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1}}
    assert status.counts(dep) == {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1}
    assert status.generation_of(isvc()) == 2 and status.generation_of({}) == 0
    assert status.resource_version(isvc(rv="12")) == 12 and status.resource_version({}) == 0
    assert status.object_key(isvc()) == ("ns", "m")
    assert status.status_patch({"a": 1, "b": None}, {"a": 1}) == {}
    assert status.merge_patch({"a": 1}, isvc()) == {"status": {"a": 1}}
