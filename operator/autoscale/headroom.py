"""Burst headroom: how far the arrival rate has risen within one reaction time, learned from history.

A reactive autoscaler adds capacity one reaction time after the demand asks for it (the next tick plus
a cold start: ``Policy.burst_lead_seconds``). A burst shorter than that meets only the capacity that
was standing when it began, so the only defence is headroom, and the right amount is a property of the
traffic: smooth diurnal traffic needs little, traffic with short x2 bursts needs twice its level. This
module measures it from the arrival-rate samples the controller has already seen, the way
Autopilot's moving-window recommenders size a limit from a high percentile of recent usage rather than
from the last sample (Rzadca et al., "Autopilot: workload autoscaling at Google", EuroSys 2020,
section 3.2), and Nexus and MArk provision for the peak of the next interval rather than its mean
(Shen et al., SOSP 2019; Zhang et al., USENIX ATC 2019):

- the *level* at a sample is the lowest arrival rate of the ``lead`` seconds up to it (``floor_level``:
  the level a burst shorter than the reaction time stands on);
- its *rise* is the highest arrival rate in the ``lead`` seconds after it, over that level (or over
  the level ``2 * lead`` later if higher: a rise that stays is a level shift, which the capacity rule
  follows by itself): what the fleet standing at that moment would have had to absorb before help
  arrived;
- a *burst* is a run of consecutive samples whose rise is over ``min_rise`` (smaller rises are
  noise, or a ramp the capacity rule's planning margin follows) and over the square of the median
  rise (``noise_floor``: noisy traffic rises over its own floor all the time, by about the median
  rise; a burst stands out of that, twice as far on a log scale); its *peak* is the run's largest
  rise;
- the *burst factor* is the ``quantile`` of the peaks of the bursts over the memory, at least 1,
  once ``min_bursts`` of them were seen: headroom for bursts that recur, sized by how large they are
  and not by how often they come (a quantile over every sample, the first design, read frequent small
  bursts and rare large ones alike, and sat under the bursts it was meant to cover). Peaks over
  ``limit`` are left out: bursts that large (x5 in a Markov-modulated trace) outgrow any headroom
  worth paying for, headroom that covers a third of them only delays the breach by seconds, and the
  reactive rules handle them.

A drop is the reverse of a burst, and is remembered the same way: the *left level* is the highest
level (a floor that stood for two reaction times) that the traffic fell under within one reaction time,
by more than ``min_drop`` and the noise floor, over the memory (``left_level``). Traffic that left that
fast (a failover to another region, a client that stops, a job that ends) can come back as fast, a
level shift no reactive rule catches: the capacity rule holds the left level's replicas for the memory
(a level that falls gradually, as a day's traffic does in the evening, is followed down as before).

The capacity rule (``policy``, ``_burst_base``) then provisions for ``factor`` times the present
arrival rate (carried one reaction time ahead on its rise from the floor) at the full SLO capacity of
a replica, beside the demand at its planning utilization; inside a burst (the rate more than halfway
from the floor to ``factor`` times it) the headroom stands on the floor instead, so a burst is not
counted twice. Pure: no clock, no I/O; samples are
``(now, requests/s)`` pairs on any monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Burst", "burst_factor", "burst_peaks", "floor_level", "left_level", "noise_floor"]


@dataclass(frozen=True)
class Burst:
    """The burst headroom at one tick.

    Attributes:
        factor: ratio >= 1 to multiply the level by (1 when nothing was learned).
        level: the arrival rate's floor now, requests/s (``floor_level`` over the last ``lead``
            seconds); ``None`` when no sample is known.
        rises: how many past samples have a known rise (the history the factor was learned from).
        bursts: how many bursts of at most ``limit`` the factor was learned from (0: factor 1).
        left_level: the highest level, requests/s, that the traffic left suddenly within the memory
            (``left_level``); ``None`` when it left none.
    """

    factor: float
    level: float | None
    rises: int
    bursts: int = 0
    left_level: float | None = None


def floor_level(times: Sequence[float], rates: Sequence[float], i: int, span: float) -> float:
    """The lowest of ``rates[: i + 1]`` whose time is within ``span`` seconds of ``times[i]``
    (``rates[i]`` at least), requests/s: the level a burst shorter than ``span`` stands on."""
    low = rates[i]
    j = i - 1
    while j >= 0 and times[i] - times[j] < span:
        low = min(low, rates[j])
        j -= 1
    return low


def _quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation, numpy's default method)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _rise(times: Sequence[float], rates: Sequence[float], i: int, lead: float) -> float | None:
    """The transient rise after sample ``i``: the highest rate within ``lead`` seconds after it, over
    the higher of the floor level at ``i`` and the floor level ``2 * lead`` after it (a rise that stays
    is a level shift, which the capacity rule follows by itself, not a burst). ``None`` when the floor
    is 0 or nothing follows within ``lead``."""
    before = floor_level(times, rates, i, lead)
    j = i + 1
    peak = 0.0
    while j < len(times) and times[j] <= times[i] + lead:
        peak = max(peak, rates[j])
        j += 1
    if j == i + 1:
        return None
    while j < len(times) - 1 and times[j + 1] <= times[i] + 2 * lead:
        j += 1
    base = max(before, floor_level(times, rates, min(j, len(times) - 1), lead))
    return peak / base if base > 0 else None


def left_level(
    times: Sequence[float], rates: Sequence[float], i: int, lead: float, min_drop: float
) -> float | None:
    """The level the traffic left at sample ``i``, requests/s, or ``None``.

    The level is the lowest rate of the ``2 * lead`` seconds up to ``i`` (a level that stood for two
    reaction times: a burst shorter than that is not one); it is left when every rate observed within
    ``lead`` seconds after ``i`` is under it by more than ``min_drop`` (ratio > 1): a sudden drop, as
    in a failover, a client that stops, or a job that ends. The drop counts from the first sample after
    it (a dip that comes back within the lead is held only until it does: the fleet it keeps is the one
    that served the level). ``None`` when nothing follows, or when the samples leave a hole longer than
    ``lead / 2`` in either window or do not reach back ``2 * lead`` (the first samples of the memory, a
    gap in the history: one sample is not a level)."""
    gap = lead / 2
    before, j = rates[i], i
    while j > 0 and times[i] - times[j - 1] < 2 * lead:
        if times[j] - times[j - 1] > gap:
            return None
        j -= 1
        before = min(before, rates[j])
    if times[i] - times[j] < 2 * lead - gap or before <= 0:
        return None
    peak: float | None = None
    k = i + 1
    while k < len(times) and times[k] <= times[i] + lead:
        if times[k] - times[k - 1] > gap:
            return None
        peak = rates[k] if peak is None else max(peak, rates[k])
        k += 1
    if peak is None or (k < len(times) and times[k - 1] < times[i] + lead - gap):
        return None  # nothing after it, or a hole at the window's end
    return before if before > min_drop * peak else None


def burst_peaks(rises: Sequence[float | None], min_rise: float) -> list[float]:
    """The peak of each burst in ``rises`` (one ratio per sample, oldest first; ``None`` where the rise
    is unknown): a burst is a maximal run of consecutive rises over ``min_rise``, its peak the run's
    largest rise."""
    peaks: list[float] = []
    peak: float | None = None
    for rise in (*rises, None):
        if rise is not None and rise > min_rise:
            peak = rise if peak is None else max(peak, rise)
        elif peak is not None:
            peaks.append(peak)
            peak = None
    return peaks


def noise_floor(rises: Sequence[float | None]) -> float:
    """The square of the median of the known ``rises`` (ratios > 0), 1.0 when none is known: the
    rise a burst must exceed to stand out of the traffic's own noise. Without bursts, the rise of a
    sample over its floor is the spread of the noise within two reaction times, and it is there at
    about every sample, so the median measures it; bursts are rarer than half the samples, so they
    move the median little. Squared: twice as far on a log scale."""
    known = sorted(r for r in rises if r is not None and r > 0)
    if not known:
        return 1.0
    return _quantile(known, 0.5) ** 2


def burst_factor(
    samples: Sequence[tuple[float, float]],
    *,
    lead: float,
    quantile: float,
    limit: float,
    min_rise: float,
    min_bursts: int,
    min_drop: float,
) -> Burst:
    """The burst factor learned from ``samples`` (module docstring).

    Args:
        samples: ``(time, arrival requests/s)`` pairs, oldest first, every one within the memory.
        lead: the reaction time, seconds: a rise counts the highest rate within this long after a sample.
        quantile: which quantile of the bursts' peaks is the factor, in (0, 1].
        limit: the largest burst peak that headroom covers, ratio >= 1; larger bursts are left out.
        min_rise: a sample whose rise is over this ratio (>= 1) and over ``noise_floor`` is part of
            a burst.
        min_bursts: how many bursts (of at most ``limit``) must have been seen before the factor is
            more than 1: headroom is for bursts that recur.
        min_drop: a level counts as left (``left_level``) when the rate fell under it by more than
            this ratio (> 1) and than ``noise_floor`` within ``lead``; a ratio <= 1 would read every
            fall, gradual ones included, as a level left.

    Raises:
        ValueError: when ``min_drop`` is not > 1.

    Returns:
        A ``Burst``. A sample teaches once ``2 * lead`` seconds after it are observed.
    """
    if not min_drop > 1:
        raise ValueError(f"burst headroom: min_drop must be > 1 (got {min_drop!r})")
    if not samples:
        return Burst(1.0, None, 0)
    times = [t for t, _ in samples]
    rates = [r for _, r in samples]
    now_level = floor_level(times, rates, len(rates) - 1, lead)
    rises: list[float | None] = []
    for i, when in enumerate(times):
        if when + 2 * lead > times[-1]:
            break
        rises.append(_rise(times, rates, i, lead))
    known = sum(r is not None for r in rises)
    noise = noise_floor(rises)
    # Bursts over the limit outgrow any headroom it allows: leave them to the reactive rules.
    peaks = [p for p in burst_peaks(rises, max(min_rise, noise)) if p <= limit]
    drop = max(min_drop, noise)
    levels = (left_level(times, rates, i, lead, drop) for i in range(len(times) - 1))
    left = max((x for x in levels if x is not None), default=None)
    if not peaks or len(peaks) < min_bursts:
        return Burst(1.0, now_level, known, len(peaks), left)
    return Burst(max(_quantile(peaks, quantile), 1.0), now_level, known, len(peaks), left)
