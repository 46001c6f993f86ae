"""The fetch report, ``<destination>/.kubeinfer-fetch.json``: what the fetch step did.

``{"source": URI, "files": N, "bytes": B, "seconds": S}``: the source (redacted: no userinfo, no
query), the files it wrote into the destination (an archive's members, not the archive), the bytes
it downloaded, and the seconds it took. The runtime reads it at start (``read_report``) and exports
``kubeinfer_model_fetch_seconds`` and ``kubeinfer_model_fetch_bytes``. Written last, atomically: a
destination with the report holds the whole model.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

#: The report's file name in the destination directory (hidden: the loaders skip it).
REPORT_NAME = ".kubeinfer-fetch.json"


@dataclass(frozen=True)
class FetchReport:
    """What a fetch did: ``files`` written, ``bytes`` downloaded, ``seconds`` taken, from ``source``."""

    source: str
    files: int
    bytes: int
    seconds: float

    def to_json(self) -> str:
        """The report as one JSON object."""
        return json.dumps(asdict(self), sort_keys=True)


def write_report(directory: Path, report: FetchReport) -> Path:
    """Write ``report`` as ``directory/.kubeinfer-fetch.json`` (a temporary name, then renamed);
    returns its path. Raises ``OSError`` when the directory cannot be written."""
    path = directory / REPORT_NAME
    tmp = directory / f".{REPORT_NAME}.{secrets.token_hex(4)}.kubeinfer-partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(report.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_report(directory: str | os.PathLike[str]) -> FetchReport | None:
    """The report in ``directory``, or None when ``directory`` is not a directory or has none.

    Raises:
        ValueError: the file exists but is not a report (not JSON, a field missing or of the
            wrong type, a negative or non-finite figure).
    """
    path = Path(directory) / REPORT_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        source, files, nbytes, seconds = data["source"], data["files"], data["bytes"], data["seconds"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a fetch report ({type(exc).__name__}: {exc})") from None
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (files, nbytes))
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not isinstance(source, str) or not ints or not number or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{path}: not a fetch report (source, files, bytes or seconds of the wrong type)")
    return FetchReport(source=source, files=files, bytes=nbytes, seconds=float(seconds))
