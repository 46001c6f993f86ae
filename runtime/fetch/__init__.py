"""``kubeinfer-runtime fetch``: a model from where it lives (s3, https, the Hugging Face Hub) into a
local directory, the init container's job (``docs/runtime.md``, "kubeinfer-runtime fetch").

Modules: ``source`` (URI -> ``Source``, pure), ``run`` (``fetch``: the steps), the backends ``http``
(httpx), ``s3`` (boto3) and ``hf`` (huggingface_hub), and their shared parts: ``files`` (temp then
rename, sha256 while streaming, the size limit, safe paths), ``archive`` (safe unpacking),
``progress``, ``retry``, ``redact``, ``report`` (``.kubeinfer-fetch.json``, which the runtime reads
at start). This package imports no server, transport or model module of the runtime, and importing
it loads none of httpx, boto3 or huggingface_hub (the backends import them).
"""

from __future__ import annotations

from kubeinfer.runtime.fetch.context import FetchOptions
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.report import REPORT_NAME, FetchReport, read_report
from kubeinfer.runtime.fetch.source import Source, parse_source

__all__ = [
    "REPORT_NAME",
    "FetchError",
    "FetchOptions",
    "FetchReport",
    "Source",
    "parse_source",
    "read_report",
]
