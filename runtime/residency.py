"""Which loaded models stay resident under the memory budget (pure: no process, clock or I/O).

The model repository mode (``kubeinfer.runtime.repository``) keeps each loaded model in its own process
and measures its resident size (RSS after load and warmup). Before a load (with the size the model had
the last time it was loaded, when known) and after it (with the size measured), and whenever a request
ends while the pool is over its budget, it asks ``plan_evictions`` which models to unload:

- least recently used first (``last_used``: the end of the model's latest request, or its load);
- never a pinned model, never one with requests in flight, never one named in ``keep`` (the model being
  loaded or just loaded);
- only as many as needed to bring the resident bytes (plus ``incoming``) to the budget or under it.

When the candidates cannot bring it under (pinned or busy models fill the budget), the plan evicts every
candidate and says ``fits=False``: the pool then runs over its budget until a busy model's requests end
(the next plan evicts it if it is still the least recently used) - a model in use is never unloaded
under its requests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["EvictionPlan", "Resident", "expected_bytes", "plan_evictions"]


@dataclass(frozen=True)
class Resident:
    """A loaded model as the planner sees it.

    Attributes:
        name: the model's name.
        nbytes: its measured resident size, bytes.
        last_used: when it last served (clock seconds; larger is more recent).
        pinned: never evicted (``repository.pinned``).
        in_flight: requests being served now (a model with any is not evicted).
    """

    name: str
    nbytes: int
    last_used: float
    pinned: bool = False
    in_flight: int = 0


@dataclass(frozen=True)
class EvictionPlan:
    """What to unload: ``evict`` (names, least recently used first); ``fits``: whether the resident bytes
    left plus the incoming ones are within the budget after it; ``resident_bytes``: those bytes."""

    evict: tuple[str, ...]
    fits: bool
    resident_bytes: int


def plan_evictions(
    resident: Sequence[Resident], budget: int, *, incoming: int = 0, keep: Collection[str] = ()
) -> EvictionPlan:
    """The models to evict so that ``sum(nbytes) + incoming <= budget``.

    Args:
        resident: the loaded models.
        budget: the memory budget, bytes (>= 0).
        incoming: bytes about to be added (a model to load, its last measured size; 0 when unknown).
        keep: names never evicted by this plan (the model being loaded).

    Returns an ``EvictionPlan``; ``evict`` is empty when everything fits. Ties of ``last_used`` go by
    name, so the plan is deterministic. Raises ``ValueError`` for a negative budget or size."""
    if budget < 0 or incoming < 0 or any(r.nbytes < 0 for r in resident):
        raise ValueError("the budget and the sizes must be >= 0 bytes")
    total = sum(r.nbytes for r in resident) + incoming
    candidates = sorted(
        (r for r in resident if not r.pinned and r.in_flight == 0 and r.name not in keep),
        key=lambda r: (r.last_used, r.name),
    )
    evict: list[str] = []
    for candidate in candidates:
        if total <= budget:
            break
        evict.append(candidate.name)
        total -= candidate.nbytes
    return EvictionPlan(tuple(evict), total <= budget, total - incoming)


def expected_bytes(last: int, measured: Iterable[int]) -> int:
    """The bytes a model's load is expected to add, to make room for before it starts: ``last``, its size
    the last time it was loaded (bytes, 0 when never), else the largest of ``measured`` (the sizes of the
    other models measured by this runtime), else 0. A small model's process is mostly its floor (the
    interpreter and its framework), so another model's size is a better guess than none, and the largest
    errs on the side of the budget. Raises ``ValueError`` for a negative size."""
    sizes = list(measured)
    if last < 0 or any(n < 0 for n in sizes):
        raise ValueError("sizes must be >= 0 bytes")
    return last or max(sizes, default=0)
