"""The batching setting the operator and the runtime agree on: the max queue delay (Triton's name), the
longest the oldest queued request waits for its batch to fill, in float seconds end to end. The CRD
writes it ``spec.batching.maxQueueDelay`` (a duration, parsed once into seconds at the API boundary),
the runtime's file ``batching.max_queue_delay_seconds``, the runtime's gauge
``kubeinfer_max_queue_delay_seconds``; its bound is :data:`MAX_QUEUE_DELAY_LIMIT_SECONDS`.

Pure: standard library only.
"""

from __future__ import annotations

__all__ = ["MAX_QUEUE_DELAY_LIMIT_SECONDS"]

#: The longest max queue delay, seconds (an int: the CRD's CEL writes it ``duration('10s')``, a pod's
#: termination grace adds it). The CRD's rules, the operator's checks, the runtime's configuration and
#: the model pool's termination grace all read it here.
MAX_QUEUE_DELAY_LIMIT_SECONDS = 10
