"""Read a real runtime's model configuration the way perf_analyzer's users do, with ``tritonclient``.

``model_configs`` asks over HTTP (``tritonclient.http``, Triton's JSON) and gRPC (``tritonclient.grpc``,
``as_json=True``: protobuf's JSON of ``ModelConfigResponse``) and parses both into ``tritonclient``'s
``model_config_pb2.ModelConfig``; ``json_format.ParseDict`` refuses any field name Triton's
``model_config.proto`` lacks, so a document that parses has Triton's schema.
"""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException


def model_config_pair(http_address: str, grpc_address: str, model: str) -> tuple[dict[str, Any], Any, Any]:
    """The model's configuration over HTTP (the JSON document), and over HTTP and gRPC as Triton's
    ``ModelConfig`` messages, read one after the other (a hot reload may land between the two reads)."""
    http = httpclient.InferenceServerClient(http_address)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    try:
        doc = http.get_model_config(model)
        over_grpc = grpc.get_model_config(model, as_json=True)
    finally:
        http.close()
        grpc.close()
    config = json_format.ParseDict(doc, model_config_pb2.ModelConfig())
    return doc, config, json_format.ParseDict(over_grpc["config"], model_config_pb2.ModelConfig())


def model_configs(http_address: str, grpc_address: str, model: str) -> tuple[dict[str, Any], Any]:
    """The model's configuration over HTTP (the JSON document) and as Triton's ``ModelConfig`` message.

    Asserts that HTTP and gRPC answer the same message, both parsed into ``ModelConfig``.
    """
    doc, config, over_grpc = model_config_pair(http_address, grpc_address, model)
    assert over_grpc == config
    return doc, config


def tensors(config: Any, which: str) -> list[tuple[str, str, list[int]]]:
    """``(name, data_type name, dims)`` of the config's ``input`` or ``output`` tensors."""
    return [
        (t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in getattr(config, which)
    ]


def assert_unknown_model_is_not_found(http_address: str, grpc_address: str) -> None:
    """An unknown model's configuration is a 404 over HTTP and NOT_FOUND over gRPC."""
    http = httpclient.InferenceServerClient(http_address)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    try:
        with pytest.raises(InferenceServerException) as info:
            http.get_model_config("nope")
        assert info.value.status() == "404" and "unknown model 'nope'" in str(info.value.message())
        with pytest.raises(InferenceServerException) as info:
            grpc.get_model_config("nope")
        assert info.value.status() == "StatusCode.NOT_FOUND"
    finally:
        http.close()
        grpc.close()
