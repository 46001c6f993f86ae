"""The KServe Python SDK (``kserve.InferenceRESTClient`` with protocol v2, ``kserve.InferenceGRPCClient``)
against a real ``kubeinfer-runtime`` process on the tiny BERT, beside tritonclient: health (the SDK
parses ``{"live": true}`` / ``{"ready": true}``; an empty body raised a JSON decode error), JSON and
binary REST infer, gRPC infer; the embeddings equal tritonclient's.

kserve runs in its own virtual environment, ``.cache/kserve-client``, that ``make setup`` builds from
``requirements/kserve-client.txt`` (hack/setup.sh step 8; see ``tests/support/kserve_client.py`` for why
it cannot share the project's). The test fails, naming ``make setup``, when that environment is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.support import kserve_client

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
#: The kserve environment; KUBEINFER_KSERVE_PYTHON names another interpreter that has kserve.
KSERVE_VENV = REPO / ".cache" / "kserve-client"
MODEL = "tiny"
TEXTS = ["A man is playing a guitar on stage.", "The new movie is awesome.", "ünïcode text"]


def kserve_python() -> Path:
    """The Python of the environment ``make setup`` built with ``kserve==KSERVE_VERSION``
    (``.cache/kserve-client``), or ``$KUBEINFER_KSERVE_PYTHON``.

    Fails the test, naming ``make setup``, when that Python is missing or has another kserve version:
    the test neither builds the environment nor skips."""
    given = os.environ.get("KUBEINFER_KSERVE_PYTHON")
    python = Path(given) if given else KSERVE_VENV / "bin" / "python"
    where = "$KUBEINFER_KSERVE_PYTHON" if given else ".cache/kserve-client"
    if not python.exists():
        pytest.fail(f"{python} ({where}) is missing: run `make setup` (step 8 builds .cache/kserve-client)")
    done = subprocess.run(
        [str(python), "-P", "-c", "import importlib.metadata as m; print(m.version('kserve'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    version = done.stdout.strip()
    if done.returncode != 0 or version != kserve_client.KSERVE_VERSION:
        pytest.fail(
            f"{where} has kserve {version or 'not installed'} ({done.stderr.strip()[-500:]}), the test wants "
            f"{kserve_client.KSERVE_VERSION}: run `make setup` (requirements/kserve-client.txt)"
        )
    return python


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    tiny = tiny_hf_dir(tmp_path_factory.mktemp("tiny"))
    cfg = tiny_hf_config(tiny, batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.01})
    assert cfg.model.name == MODEL
    with RuntimeProcess(cfg, ready_timeout=60) as rt:
        yield rt


def test_kserve_sdk_rest_and_grpc_match_tritonclient(runtime: RuntimeProcess, tmp_path: Path) -> None:
    python = kserve_python()
    model = MODEL
    done = subprocess.run(
        [str(python), kserve_client.__file__, runtime.url, runtime.grpc_address, model, *TEXTS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not the repository root: its operator/ would shadow the standard library's
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout)
    health = {"live": True, "ready": True, "model_ready": True}
    assert {k: got["rest"][k] for k in health} == health
    assert {k: got["grpc"][k] for k in health} == health

    triton = httpclient.InferenceServerClient(runtime.address)
    inp = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    expected = triton.infer(model, [inp]).as_numpy("embedding")
    assert expected is not None and expected.shape[0] == len(TEXTS)
    for way, rows in (("json", got["rest"]["rest_json"]), ("binary", got["rest"]["rest_binary"])):
        np.testing.assert_allclose(np.array(rows), expected, rtol=1e-5, atol=1e-6, err_msg=way)
    np.testing.assert_allclose(np.array(got["grpc"]["grpc"]), expected, rtol=1e-5, atol=1e-6)
