"""The batch service time s(b) = a + c*b of this replica, fitted from the batches it runs.

The autoscaler's SLO-capacity rule (``kubeinfer.operator.autoscale.policy``) counts the replicas a
demand needs from s(b): one replica serves b / s(b) requests/s at batch size b, the physical limit of a
batching server (Crankshaw et al., "Clipper", NSDI 2017). The runtime knows s(b) better than anyone:
every batch it runs is a sample (rows, seconds). ``ServiceTimeFit`` keeps an exponentially weighted
least-squares line through them (weights halve every ``half_life`` batches, so the fit follows a
change of input lengths or of the device's clocks), seeded at warmup by ``calibrate`` so that a replica
exports a fit from the moment it is ready. The runtime exports it as
``kubeinfer_service_time_intercept_seconds`` (a) and ``kubeinfer_service_time_slope_seconds`` (c).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeinfer.runtime.models.base import ServableModel

__all__ = ["ServiceTimeFit", "calibrate", "calibrate_model"]

log = logging.getLogger(__name__)


class ServiceTimeFit:
    """Exponentially weighted least squares of batch seconds on batch rows: s(b) = a + c*b.

    Thread-safe: executor threads ``observe``, the metrics scrape reads ``intercept``/``slope``.

    Args:
        half_life: batches after which a sample's weight has halved (> 0).

    Raises:
        ValueError: ``half_life`` is not > 0.
    """

    def __init__(self, half_life: float = 500.0) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be > 0 (got {half_life!r})")
        self._decay = 0.5 ** (1.0 / half_life)
        self._lock = threading.Lock()
        # weighted sums: w, w*b, w*b^2, w*s, w*b*s
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]

    def observe(self, rows: int, seconds: float) -> None:
        """Add one batch of ``rows`` rows that took ``seconds`` (preprocess + execute). Ignores a batch
        with no rows or a non-positive or non-finite time."""
        if rows <= 0 or not 0.0 < seconds < float("inf"):
            return
        b = float(rows)
        with self._lock:
            d = self._decay
            w, wb, wbb, ws, wbs = self._sums
            self._sums = [d * w + 1.0, d * wb + b, d * wbb + b * b, d * ws + seconds, d * wbs + b * seconds]

    def estimate(self) -> tuple[float, float] | None:
        """``(a, c)``: seconds and seconds per row, both >= 0 with c > 0; ``None`` until batches of at
        least two sizes are seen. A negative fitted intercept (noise at small batches) is refitted
        through the origin, ``a = 0``."""
        with self._lock:
            w, wb, wbb, ws, wbs = self._sums
        if w <= 0:
            return None
        var = wbb / w - (wb / w) ** 2  # weighted variance of b
        if var <= 1e-9 * max(1.0, (wb / w) ** 2):
            return None
        c = (wbs / w - (wb / w) * (ws / w)) / var
        a = ws / w - c * wb / w
        if a < 0:
            a, c = 0.0, wbs / wbb
        if c <= 0:
            return None
        return a, c

    def intercept(self) -> float:
        """a in seconds, NaN when unknown (what the gauge exports: the autoscaler reads NaN as unknown)."""
        fit = self.estimate()
        return float("nan") if fit is None else fit[0]

    def slope(self) -> float:
        """c in seconds per row, NaN when unknown."""
        fit = self.estimate()
        return float("nan") if fit is None else fit[1]


def calibrate(
    run: Callable[[int], object],
    max_batch_size: int,
    fit: ServiceTimeFit,
    repeats: int = 3,
) -> dict[int, float]:
    """Seed ``fit`` with timed batches at warmup: sizes 1, max/2 and max (distinct ones), ``repeats``
    times each after the model is warm; the median of each size is observed ``repeats`` times.

    Args:
        run: runs one batch of the given number of rows (preprocess + execute), blocking.
        max_batch_size: the largest batch, rows (>= 1).
        fit: the fit to seed.
        repeats: timed runs per size (>= 1).

    Returns:
        ``{rows: median seconds}``.
    """
    sizes = sorted({1, max(1, max_batch_size // 2), max_batch_size})
    medians: dict[int, float] = {}
    for rows in sizes:
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            run(rows)
            times.append(time.perf_counter() - t0)
        medians[rows] = statistics.median(times)
        for _ in range(max(1, repeats)):
            fit.observe(rows, medians[rows])
    log.info(
        "service time: %s; fit s(b) = %.2f ms + %.3f ms/row",
        ", ".join(f"{b} rows {s * 1000:.1f} ms" for b, s in medians.items()),
        fit.intercept() * 1000,
        fit.slope() * 1000,
    )
    return medians


def calibrate_model(model: ServableModel, max_batch_size: int, fit: ServiceTimeFit) -> None:
    """``calibrate`` a warmed-up model on its ``example_inputs`` (one request of b rows, preprocessed and
    executed as the executor does). A model without example inputs is left to the live batches; a
    failure is logged, never raised: the fit is an aid to the autoscaler, not a condition to serve."""

    def run(rows: int) -> object:
        return model.execute(model.preprocess([model.example_inputs(rows)]))

    try:
        calibrate(run, max_batch_size, fit)
    except NotImplementedError:
        log.info("service time: model %r has no example inputs; fitted from live batches only", model.name)
    except Exception as exc:
        log.warning("service time calibration failed (%s); fitted from live batches only", exc)
