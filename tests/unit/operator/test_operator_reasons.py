"""Every condition and Event reason lives in one registry, ``kubeinfer.operator.conditions``: each
is listed once, with a meaning; what the code decides from a reason (Stalled, the Warning Event, the
kubelet reasons carried over) is read from it; the module imports only the standard library; and no
other module under operator/ spells a registered reason as a string literal."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

from kubeinfer.operator import conditions
from kubeinfer.operator.reconcile import diagnosis

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator"
REGISTRY = OPERATOR / "conditions.py"
#: Every registered name: the reasons of conditions and of Events.
NAMES = frozenset({r.name for r in conditions.REASONS} | {e.name for e in conditions.EVENTS})
#: Condition types the operator sets a reason on (Stalled carries the Ready reason that set it).
TYPES = {
    conditions.CONDITION_READY,
    conditions.CONDITION_SERVING,
    conditions.CONDITION_RECONCILING,
    conditions.CONDITION_AUTOSCALING_ACTIVE,
    conditions.CONDITION_SCALE_TO_ZERO,
}


def reason_literals(source: str, names: frozenset[str] = NAMES) -> list[tuple[int, str]]:
    """(line, value) of every string literal in ``source`` equal to one of ``names`` (f-string parts
    included)."""
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    )


def test_every_reason_is_listed_once_with_a_meaning() -> None:
    uses = Counter((r.condition, r.name) for r in conditions.REASONS)
    assert [use for use, n in uses.items() if n > 1] == []
    events = Counter(e.name for e in conditions.EVENTS)
    assert [name for name, n in events.items() if n > 1] == []
    for r in conditions.REASONS:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", r.name), r
        assert r.condition in TYPES and r.status in ("True", "False"), r
        assert r.meaning.strip(), f"{r.name} on {r.condition} has no meaning"
        if r.stalled or r.expected or r.waiting:  # they say what Ready=False does
            assert (r.condition, r.status) == (conditions.CONDITION_READY, "False"), r
        assert not (r.stalled and r.expected), r
    for e in conditions.EVENTS:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", e.name) and e.type in ("Normal", "Warning"), e
        assert e.meaning.strip(), f"Event {e.name} has no meaning"


def test_every_reason_constant_is_registered_and_every_registered_reason_has_one() -> None:
    constants = {value for key, value in vars(conditions).items() if key.isupper() and isinstance(value, str)}
    kubernetes_types = {
        conditions.DEPLOYMENT_AVAILABLE,
        conditions.DEPLOYMENT_PROGRESSING,
        conditions.DEPLOYMENT_REPLICA_FAILURE,
        conditions.POD_SCHEDULED,
    }
    own_types = {*TYPES, conditions.CONDITION_STALLED}
    # Progressing and ReplicaFailure are both a Deployment's condition type and a reason of Ready
    assert (constants - own_types - kubernetes_types) | (NAMES & kubernetes_types) == NAMES


def test_what_the_code_decides_comes_from_the_registry() -> None:
    ready_false = [r.name for r in conditions.reasons_of(conditions.CONDITION_READY, "False")]
    calm = [name for name in ready_false if not conditions.sets_stalled(name)]
    assert calm == [
        conditions.CREATING,
        conditions.PROGRESSING,
        conditions.API_SERVER_ERROR,
        conditions.POOL_NOT_FOUND,  # resolves once the pool is created (an apply of both, in any order)
        conditions.POOL_NOT_READY,
    ]
    assert conditions.sets_stalled("ReplicaSetCreateError")  # a Deployment's reason not listed: a fault
    assert {
        conditions.CREATING,
        conditions.PROGRESSING,
        conditions.POOL_NOT_READY,
    } == conditions.EXPECTED_NOT_READY_REASONS
    assert {
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    } == conditions.KUBELET_WAITING_REASONS
    assert conditions.KUBELET_WAITING_REASONS <= diagnosis.BAD_WAITING_REASONS


def test_the_registry_imports_only_the_standard_library() -> None:
    imported = []
    for node in ast.walk(ast.parse(REGISTRY.read_text())):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.append(str(node.module))
    outside = [m for m in imported if m.split(".")[0] not in {*sys.stdlib_module_names, "__future__"}]
    assert imported and outside == []


def test_the_literal_check_sees_a_reason_spelt_out() -> None:
    source = (
        '"""ModelFetchFailed in a docstring is words."""\n'
        'x = "ModelFetchFailed"\n'
        'post(reason="Scaled", type_="Normal")\n'
        'y = f"{x}: Scaled"\n'
        "z = conditions.MODEL_FETCH_FAILED\n"
    )
    assert reason_literals(source) == [(2, "ModelFetchFailed"), (3, "Scaled")]


def test_no_module_under_operator_spells_a_reason_as_a_literal() -> None:
    modules = sorted(p for p in OPERATOR.rglob("*.py") if p != REGISTRY)
    assert len(modules) > 20
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in modules
        for line, value in reason_literals(path.read_text())
    ]
    assert offenders == [], (
        "reasons are defined once, in operator/conditions.py: use its constants "
        f"(conditions.NAME) instead of {offenders}"
    )
