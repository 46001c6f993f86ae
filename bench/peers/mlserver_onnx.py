"""MiniLM on ONNX Runtime as an MLServer model: kubeinfer's own int8 graph behind MLServer's batching.

The runtime class a user of MLServer writes around an exported sentence embedder (MLServer's
``mlserver-onnx`` runtime was removed; a custom ``MLModel`` is its documented way): ``predict`` takes
a BYTES tensor ``text`` [N] and returns FP32 ``embedding`` [N, 384] from ``onnx_minilm.OnnxMiniLM``
(the same graph file, tokenizer and session options as kubeinfer's ``onnxruntime`` engine).
model-settings.json (bench/peers_bench.py writes it): ``parameters.uri`` the graph file,
``parameters.extra.tokenizer`` the model directory, ``parameters.extra.threads`` the session's intra-op
threads. MLServer's adaptive batching (``max_batch_size``, ``max_batch_time``) concatenates the rows of
concurrent requests into one ``predict`` call. Runs in MLServer's venv (``.cache/peer-mlserver``).
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from onnx_minilm import OnnxMiniLM


class MiniLMOnnx(MLModel):  # type: ignore[misc]
    """all-MiniLM-L6-v2 on ONNX Runtime: ``text`` BYTES [N] -> ``embedding`` FP32 [N, 384]."""

    async def load(self) -> bool:
        """Open the graph ``parameters.uri`` with the tokenizer and thread count of ``parameters.extra``."""
        params = self.settings.parameters
        extra = params.extra or {}
        self._model = OnnxMiniLM(params.uri, extra["tokenizer"], int(extra["threads"]))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Embed each row of the request's one input (``text``, BYTES [N]); raises ``ValueError``
        when the request has no input named ``text``."""
        named = {i.name: i for i in payload.inputs}
        if "text" not in named:
            raise ValueError(f"input 'text' is required (got {sorted(named)})")
        texts = [
            t.decode() if isinstance(t, bytes) else str(t) for t in StringCodec.decode_input(named["text"])
        ]
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("embedding", self._model.embed(texts))],
        )
