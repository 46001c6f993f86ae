"""The runtime's one-line fatal error, written to the container's termination log.

Kubernetes copies the file at the container's ``terminationMessagePath`` (``/dev/termination-log``,
which the kubelet creates in every container) into the pod's status
(``lastState.terminated.message``); the operator's diagnosis reads it from there. With the runtime
container's ``terminationMessagePolicy: FallbackToLogsOnError``, a message written here also keeps
the kubelet from copying the tail of the log instead. What is written is the runtime's own sentence
(the configuration error, the model load's exception), never log text or command-line arguments
(they may carry values expanded from Secrets).

Written only when the file exists (in a container); ``KUBEINFER_TERMINATION_LOG`` names another path
(tests).
"""

from __future__ import annotations

import contextlib
import os

#: The kubelet's default ``terminationMessagePath``.
DEFAULT_PATH = "/dev/termination-log"
#: Characters kept (the kubelet keeps at most 4096 bytes of the file).
MAX_CHARS = 1000


def write_termination_message(message: str, path: str | None = None) -> None:
    """Write ``message`` as one line (at most ``MAX_CHARS``) to the termination log, if it exists.

    ``path`` names the file explicitly (``kubeinfer-runtime fetch --termination-log``): it is
    created when missing. Never raises: the process is exiting anyway, and its log has the same
    error."""
    line = " ".join(message.split())[:MAX_CHARS]
    if path is None:
        path = os.environ.get("KUBEINFER_TERMINATION_LOG", DEFAULT_PATH)
        if not os.path.isfile(path):
            return
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
        f.write(line + "\n")
