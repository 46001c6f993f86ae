"""Adversarial request bodies against the v2 codec: each is a 400 ``ProtocolError``, never another
exception (which the server would turn into a 500)."""

from __future__ import annotations

import pytest
from kubeinfer.runtime.protocol import ProtocolError, decode_request


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":'
        + b"[" * 5_000
        + b'"a"'
        + b"]" * 5_000
        + b"}]}",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    ],
    ids=["nested-arrays", "nested-data", "nested-objects"],
)
def test_deeply_nested_json_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode_request(body)
