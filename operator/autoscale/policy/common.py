"""Small helpers every rule of the policy shares: the rounding guard, the cooldown test, the numbers in
words."""

from __future__ import annotations

__all__ = ["EPS", "cooled", "ms", "rate"]

#: Keeps the tolerance band's edges inside the band despite float rounding (0.18 / 0.2), and a count
#: that is a whole number on paper from rounding up past it (``ceil(3.0000000001)``).
EPS = 1e-9


def cooled(last: float | None, cooldown: float, now: float) -> bool:
    """True when no action of the kind happened (``last`` is ``None``) or ``cooldown`` seconds passed."""
    return last is None or now - last >= cooldown


def ms(seconds: float) -> str:
    """Seconds as milliseconds in words, 3 significant digits: ``0.005`` → ``"5 ms"``."""
    return f"{seconds * 1000:.3g} ms"


def rate(requests_per_second: float) -> str:
    """A rate in words: whole numbers from 10/s up, 2 significant digits under."""
    return f"{requests_per_second:.0f}" if requests_per_second >= 10 else f"{requests_per_second:.2g}"
