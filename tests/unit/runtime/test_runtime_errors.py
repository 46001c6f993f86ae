"""The runtime's one error hierarchy (kubeinfer.runtime.errors) and where each error is raised."""

from __future__ import annotations

import numpy as np
import pytest
from kubeinfer.runtime import batching, protocol
from kubeinfer.runtime.errors import HTTPError, InferenceError, InputError, ProtocolError, ServingError
from kubeinfer.runtime.models import base
from kubeinfer.runtime.protocol import InferRequest, check_outputs


@pytest.mark.parametrize(
    ("cls", "status"), [(ProtocolError, 400), (InputError, 400), (ServingError, 500), (HTTPError, 400)]
)
def test_every_error_is_an_inference_error_with_one_argument_order(cls: type, status: int) -> None:
    assert issubclass(cls, InferenceError)
    plain = cls("bad thing")
    assert (plain.message, plain.status, plain.headers, plain.tensor) == ("bad thing", status, {}, None)
    assert str(plain) == "bad thing"
    given = cls("over", 413, {"Retry-After": "1"}, tensor="x")
    assert (given.message, given.status, given.headers, given.tensor) == (
        "over",
        413,
        {"Retry-After": "1"},
        "x",
    )


def test_modules_raise_the_errors_of_the_one_hierarchy() -> None:
    assert protocol.ProtocolError is ProtocolError
    assert base.InputError is InputError
    assert batching.ServingError is ServingError


def test_check_outputs_names_the_unknown_output_and_the_declared_ones() -> None:
    request = InferRequest(
        id=None, inputs={"x": np.zeros((1, 2), np.float32)}, outputs={"y": None, "zz": True}
    )
    with pytest.raises(ProtocolError, match="unknown output 'zz' requested; model 'm' has: y, n") as info:
        check_outputs(request, "m", ["y", "n"])
    assert info.value.status == 400
    check_outputs(request, "m", ["y", "zz"])
    check_outputs(InferRequest(id=None, inputs={}), "m", ["y"])  # no outputs named: all of them
