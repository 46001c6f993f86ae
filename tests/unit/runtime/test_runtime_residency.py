"""The model repository's eviction planner (runtime/residency.py): least recently used first, never a
pinned model, one in use or the one being loaded, only as many as needed."""

from __future__ import annotations

import pytest
from kubeinfer.runtime.residency import EvictionPlan, Resident, expected_bytes, plan_evictions

MB = 1 << 20


def models(*rows: tuple[str, int, float]) -> list[Resident]:
    return [Resident(name, size * MB, used) for name, size, used in rows]


def test_everything_fits_evicts_nothing() -> None:
    plan = plan_evictions(models(("a", 10, 1.0), ("b", 10, 2.0)), 30 * MB, incoming=10 * MB)
    assert plan == EvictionPlan((), True, 20 * MB)


def test_least_recently_used_first_and_only_as_many_as_needed() -> None:
    resident = models(("a", 10, 3.0), ("b", 10, 1.0), ("c", 10, 2.0))
    assert plan_evictions(resident, 30 * MB, incoming=10 * MB).evict == ("b",)
    assert plan_evictions(resident, 20 * MB, incoming=10 * MB).evict == ("b", "c")
    # after a load: the new model is kept, the others go oldest first
    assert plan_evictions(resident, 15 * MB, keep={"b"}).evict == ("c", "a")


def test_pinned_in_use_and_kept_models_are_never_evicted_and_the_plan_says_it_does_not_fit() -> None:
    resident = [
        Resident("pinned", 10 * MB, 0.0, pinned=True),
        Resident("busy", 10 * MB, 1.0, in_flight=2),
        Resident("new", 10 * MB, 2.0),
        Resident("idle", 10 * MB, 3.0),
    ]
    plan = plan_evictions(resident, 15 * MB, keep={"new"})
    assert plan == EvictionPlan(("idle",), False, 30 * MB)


def test_ties_go_by_name_and_bad_sizes_are_refused() -> None:
    assert plan_evictions(models(("b", 5, 1.0), ("a", 5, 1.0)), 5 * MB).evict == ("a",)
    with pytest.raises(ValueError):
        plan_evictions([], -1)
    with pytest.raises(ValueError):
        plan_evictions(models(("a", -1, 0.0)), 1)


def test_a_model_never_loaded_is_expected_at_the_largest_size_measured() -> None:
    # its own last size first; else the largest other (a small model's process is mostly its floor), so
    # a first load makes room before it starts instead of passing the budget until it is measured
    assert expected_bytes(7 * MB, [3 * MB, 9 * MB]) == 7 * MB
    assert expected_bytes(0, [3 * MB, 9 * MB]) == 9 * MB
    assert expected_bytes(0, []) == 0
    with pytest.raises(ValueError):
        expected_bytes(-1, [])


def test_room_for_two_loads_at_once_counts_both() -> None:
    # two first loads under way in a pool that holds one more model: both reserved, two evicted
    incoming = sum(expected_bytes(0, [10 * MB]) for _ in ("x", "y"))
    plan = plan_evictions(models(("a", 10, 1.0), ("b", 10, 2.0)), 30 * MB, incoming=incoming)
    assert plan.evict == ("a",)
    assert plan_evictions(models(("a", 10, 1.0), ("b", 10, 2.0)), 25 * MB, incoming=incoming).evict == (
        "a",
        "b",
    )
