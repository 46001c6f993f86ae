"""MiniLM on ONNX Runtime behind LitServe: kubeinfer's own int8 graph with LitServe's batching.

What a LitServe user writes around an exported sentence embedder: a ``LitAPI`` whose ``setup`` opens
``onnx_minilm.OnnxMiniLM`` (the same graph file, tokenizer and session options as kubeinfer's
``onnxruntime`` engine) and whose ``predict`` embeds a batch of texts; LitServe's batching
(``max_batch_size``, ``batch_timeout``) gathers concurrent requests into one ``predict`` call, in
``workers_per_device`` worker processes. The request and the answer are the Open Inference Protocol's
JSON (input ``text`` BYTES [1], output ``embedding`` FP32 [1, 384]) at ``/v2/models/minilm/infer``, so
the benchmark sends it the same bytes as kubeinfer and MLServer. Runs in LitServe's venv
(``.cache/peer-litserve``), never imported by kubeinfer::

    python litserve_onnx.py --graph G.onnx --tokenizer MODEL_DIR --threads 1 --port 8000 \
        --max-batch-size 16 --batch-timeout 0.01 --workers-per-device 1
"""

# No ``from __future__ import annotations``: LitServe reads ``decode_request``'s annotation at run time
# (a dict: the JSON body), and a string there would make FastAPI take the request from the query.
import argparse
from typing import Any

import litserve as ls
import numpy as np
from onnx_minilm import OnnxMiniLM

PATH = "/v2/models/minilm/infer"


class MiniLMApi(ls.LitAPI):  # type: ignore[misc]
    """all-MiniLM-L6-v2 on ONNX Runtime: one v2 JSON text per request, batched by LitServe."""

    def __init__(self, graph: str, tokenizer: str, threads: int, **kwargs: Any) -> None:
        """``graph``, ``tokenizer`` and ``threads`` as ``OnnxMiniLM`` takes them; ``kwargs`` LitAPI's
        (``max_batch_size``, ``batch_timeout``, ``api_path``)."""
        super().__init__(**kwargs)
        self._args = (graph, tokenizer, threads)

    def setup(self, device: str) -> None:
        """Open the session in this worker process (``device`` is ``cpu``)."""
        self.model = OnnxMiniLM(*self._args)

    def decode_request(self, request: dict[str, Any]) -> str:
        """The text of a v2 request (``inputs[0].data[0]``); ``ValueError`` when it has no ``text``."""
        for tensor in request.get("inputs", []):
            if tensor.get("name") == "text" and tensor.get("data"):
                return str(tensor["data"][0])
        raise ValueError("input 'text' is required")

    def batch(self, inputs: list[str]) -> list[str]:
        """The texts of a batch, as they came."""
        return inputs

    def predict(self, x: list[str]) -> np.ndarray:
        """float32 [len(x), 384]."""
        return self.model.embed(x)

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        """One row per request."""
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict[str, Any]:
        """A v2 answer with the output ``embedding`` FP32 [1, 384]."""
        return {
            "model_name": "minilm",
            "outputs": [
                {"name": "embedding", "shape": [1, len(output)], "datatype": "FP32", "data": output.tolist()}
            ],
        }


def main() -> None:
    """Serve on 127.0.0.1 with the settings of the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-timeout", type=float, default=0.01)
    parser.add_argument("--workers-per-device", type=int, default=1)
    args = parser.parse_args()
    api = MiniLMApi(
        args.graph, args.tokenizer, args.threads,
        max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout, api_path=PATH,
    )  # fmt: skip
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=args.workers_per_device)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
