"""``status.set_condition``/``remove_condition`` (the model: apimachinery's meta.SetStatusCondition) and the
owned-kinds table that drives the reconciler, the handlers and ``k8s``."""

from __future__ import annotations

from kubeinfer.operator import k8s, status
from kubeinfer.operator.reconcile import owned


def test_set_condition_appends_a_new_type_and_copies_the_others() -> None:
    other = {"type": "Ready", "status": "True", "reason": "R"}
    out = status.set_condition([other], "Serving", "True", "PodsReady", "1 ready", "T1", 3)
    assert out == [
        other,
        {
            "type": "Serving",
            "status": "True",
            "reason": "PodsReady",
            "message": "1 ready",
            "lastTransitionTime": "T1",
            "observedGeneration": 3,
        },
    ]
    assert out[0] is not other  # a copy: the input is not modified


def test_set_condition_keeps_the_transition_time_unless_the_status_changes() -> None:
    first = status.set_condition([], "Ready", "False", "Progressing", "a", "T1", 1)
    same = status.set_condition(first, "Ready", "False", "ImagePullBackOff", "b", "T2", 2)
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["reason"] == "ImagePullBackOff"
    assert same[0]["observedGeneration"] == 2
    flipped = status.set_condition(same, "Ready", "True", "Ready", "c", "T3", 2)
    assert flipped[0]["lastTransitionTime"] == "T3" and len(flipped) == 1


def test_set_condition_replaces_in_place() -> None:
    conds = [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]
    out = status.set_condition(conds, "A", "False", "X", "", "T", 1)
    assert [c["type"] for c in out] == ["A", "B"] and out[0]["status"] == "False"
    assert status.remove_condition(out, "A") == [{"type": "B", "status": "True"}]


def test_owned_kinds_table_names_paths_and_plurals() -> None:
    assert owned.OWNED_KINDS == (
        "ConfigMap",
        "Service",
        "EndpointSlice",
        "Deployment",
        "PodDisruptionBudget",
        "NetworkPolicy",
    )
    assert owned.BY_KIND["ConfigMap"].name_of("m") == "m-runtime"
    assert owned.BY_KIND["EndpointSlice"].name_of("m") == "m-activator"
    assert owned.BY_KIND["Deployment"].name_of("m") == "m"
    pdb = owned.BY_KIND["PodDisruptionBudget"].resource
    assert pdb.path("ns", "m") == "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/m"
    assert (pdb.group, pdb.version) == ("policy", "v1")
    assert (k8s.SERVICE.group, k8s.SERVICE.version) == ("", "v1")
    for o in owned.OWNED:  # k8s resolves every owned kind's path from the same table
        assert k8s.object_path(o.resource.api_version, o.kind, "ns", "x") == o.resource.path("ns", "x")
    assert len({o.index for o in owned.OWNED}) == len(owned.OWNED)
