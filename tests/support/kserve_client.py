"""A KServe Python SDK client run against a kubeinfer runtime, in its own virtual environment.

The ``kserve`` package cannot share the project's environment: kserve 0.21.0 pins ``psutil<6`` and
``python-dateutil<3`` while the lock has psutil 7.2.2 and kubernetes 37.0.2 (which needs
python-dateutil>=3). ``make setup`` builds that environment, ``.cache/kserve-client``, from
``requirements/kserve-client.txt`` (hack/setup.sh step 8);
``tests/integration/runtime/test_runtime_kserve_client.py`` runs this file in it as a script; it imports
nothing of kubeinfer.

Usage: ``python kserve_client.py HTTP_URL GRPC_ADDRESS MODEL TEXT...``. Prints one JSON object:
``rest``/``grpc`` health answers (``live``, ``ready``, ``model_ready``) and the output ``embedding``
(rows of floats) of each way of inferring (``rest_json``, ``rest_binary``, ``grpc``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

#: The version requirements/kserve-client.in pins (tests/unit/hack/test_lock.py checks they agree).
KSERVE_VERSION = "0.21.0"


def _texts_input(texts: list[str], binary: bool) -> Any:
    import numpy as np
    from kserve import InferInput

    inp = InferInput(name="text", shape=[len(texts)], datatype="BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
    return inp


def _rows(response: Any) -> list[list[float]]:
    out = next(o for o in response.outputs if o.name == "embedding")
    rows: list[list[float]] = out.as_numpy().astype(float).tolist()
    return rows


async def _rest(url: str, model: str, texts: list[str]) -> dict[str, Any]:
    from kserve import InferenceRESTClient, InferRequest, RESTConfig
    from kserve.protocol.infer_type import RequestedOutput

    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        result: dict[str, Any] = {
            "live": await client.is_server_live(url),
            "ready": await client.is_server_ready(url),
            "model_ready": await client.is_model_ready(url, model),
        }
        json_request = InferRequest(model_name=model, infer_inputs=[_texts_input(texts, binary=False)])
        result["rest_json"] = _rows(await client.infer(url, json_request, model_name=model))
        binary_request = InferRequest(
            model_name=model,
            infer_inputs=[_texts_input(texts, binary=True)],
            request_outputs=[RequestedOutput("embedding", {"binary_data": True})],
        )
        result["rest_binary"] = _rows(await client.infer(url, binary_request, model_name=model))
        return result
    finally:
        await client.close()


async def _grpc(address: str, model: str, texts: list[str]) -> dict[str, Any]:
    from kserve import InferenceGRPCClient, InferRequest

    client = InferenceGRPCClient(address, timeout=60)
    try:
        result: dict[str, Any] = {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready(model),
        }
        request = InferRequest(model_name=model, infer_inputs=[_texts_input(texts, binary=True)])
        result["grpc"] = _rows(await client.infer(request))
        return result
    finally:
        await client.close()


def main(argv: list[str]) -> int:
    url, address, model, *texts = argv
    rest = asyncio.run(_rest(url, model, texts))
    grpc = asyncio.run(_grpc(address, model, texts))
    print(json.dumps({"rest": rest, "grpc": grpc}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
