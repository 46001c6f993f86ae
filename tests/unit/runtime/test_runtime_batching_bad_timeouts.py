"""Request parameters at the edges of what JSON can carry: a 400 naming the parameter, never a 500."""

from __future__ import annotations

import numpy as np
import pytest
from kubeinfer.runtime.batching import Batcher, BatchSettings, InputError
from kubeinfer.runtime.metrics import RuntimeMetrics

from tests.unit.runtime.runtime_fakes import FakeModel


@pytest.mark.parametrize("timeout_us", [10**400, 2**64, -1, "5", 1.5, True])
async def test_out_of_range_timeout_is_an_input_error(timeout_us: object) -> None:
    # 10**400 microseconds overflowed the conversion to seconds: "OverflowError" came back as a 500
    batcher = Batcher(
        FakeModel(),
        BatchSettings(max_batch_size=4, max_queue_delay_seconds=0.0),
        metrics=RuntimeMetrics("fake"),
    )
    with pytest.raises(InputError, match="parameter 'timeout'"):
        await batcher.infer({"x": np.ones((1, 2), np.float32)}, timeout_us=timeout_us)
