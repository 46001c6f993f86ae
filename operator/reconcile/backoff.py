"""Retrying after transient API errors: the back-off between retries, and when the failures show as
``Ready=False ApiServerError``. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator import conditions
from kubeinfer.operator.status import ConditionState, conditions_of

#: Consecutive failed reconciles (transient API errors: 5xx, 429, conflicts, network) of one
#: InferenceService before ``Ready=False ApiServerError`` is written (3 × the 5 s retry ≈ 15–35 s:
#: long enough to ride out an API server restart, short enough for a user to see the cause).
API_ERROR_THRESHOLD = 3
#: Upper bound of the retry back-off, seconds.
RETRY_DELAY_MAX_SECONDS = 60.0


def retry_delay(
    failures: int, *, base: float, cap: float = RETRY_DELAY_MAX_SECONDS, retry_after: float = 0.0
) -> float:
    """Seconds to wait before retrying after the ``failures``-th consecutive failure (≥ 1).

    Exponential back-off ``base · 2^(failures-1)`` capped at ``cap``, never less than the server's
    ``Retry-After`` (``retry_after`` seconds). E.g. base 5 s: 5, 10, 20, 40, 60, 60, … s.
    """
    exponent = min(max(failures, 1) - 1, 30)
    return max(retry_after, min(cap, base * 2.0**exponent))


def api_error_state(
    current_status: Mapping[str, Any], failures: int, error: str, *, threshold: int = API_ERROR_THRESHOLD
) -> ConditionState | None:
    """The ``Ready=False ApiServerError`` state to write after a failed reconcile, or ``None``.

    ``failures``: consecutive failed reconciles of this InferenceService, this one included;
    ``error``: the API error's message (cut to 1000 characters). ``None`` (write nothing) below
    ``threshold`` and when the current Ready condition already has reason ``ApiServerError``: the
    condition is written once, on the transition (status is patched only on change); the next
    successful reconcile replaces it with the state computed from the owned objects.
    """
    if failures < threshold:
        return None
    ready = conditions_of({"status": current_status}).get(conditions.CONDITION_READY)
    if (
        ready is not None
        and ready.get("status") == "False"
        and ready.get("reason") == conditions.API_SERVER_ERROR
    ):
        return None
    message = f"{failures} consecutive reconciles failed; retrying with back-off: {error[:1000]}"
    return ConditionState("False", conditions.API_SERVER_ERROR, message)
