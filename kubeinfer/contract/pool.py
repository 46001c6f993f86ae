"""What the operator and the runtime agree on for a model pool (``ModelPool``): the pool's API names, the
label that selects its pods, and the layout of the model repository the operator renders into one
ConfigMap and the runtime serves.

Layout: the pool's ConfigMap holds one key per model, ``<model>.yaml`` (:func:`model_file`): the model's
``runtime.yaml`` (the runtime's ``RuntimeConfig``). It is mounted without ``items`` at
:data:`REPOSITORY_DIR`, so a model joining or leaving changes the ConfigMap only, never the pod template:
the kubelet refreshes the mounted files (within about a minute) and the runtime finds a new file on a
request for a model it does not know and on every repository index. The runtime also accepts the
directory layout (``<model>/runtime.yaml``) in the same directory; a name starting with ``.`` is never a
model (the kubelet's ``..data`` link and timestamped directories).

Pure: standard library only, nothing of the operator or the runtime.
"""

from __future__ import annotations

__all__ = [
    "INDEX_EVICTIONS",
    "INDEX_LAST_USED",
    "INDEX_LOADS",
    "INDEX_LOAD_ERROR",
    "INDEX_LOAD_FAILURES",
    "INDEX_RESIDENT_BYTES",
    "MODEL_FILE_SUFFIX",
    "POOL_KIND",
    "POOL_LABEL",
    "POOL_PLURAL",
    "POOL_SHORT_NAMES",
    "POOL_SINGULAR",
    "REPOSITORY_DIR",
    "model_file",
    "model_of_file",
]

#: The ModelPool's kind and names (group and version: the InferenceService's, ``contract.activator``).
POOL_KIND = "ModelPool"
POOL_PLURAL = "modelpools"
POOL_SINGULAR = "modelpool"
POOL_SHORT_NAMES = ("kpool",)

#: The label carrying the pool's name on its pods (and the objects it owns): the Service of every pooled
#: InferenceService selects the pool's pods by it.
POOL_LABEL = "kubeinfer.io/pool"

#: Where the pool's runtime finds its model repository (the ConfigMap, mounted whole).
REPOSITORY_DIR = "/etc/kubeinfer/models"
#: The suffix of a model's file in the flat layout: ``<model>.yaml``.
MODEL_FILE_SUFFIX = ".yaml"


#: The keys a pool's runtime adds to each model of Triton's repository index (``POST
#: /v2/repository/index``: ``name``, ``version``, ``state``, ``reason``; clients such as ``tritonclient``
#: ignore keys they do not know, and the gRPC ``RepositoryIndex`` carries Triton's four only). The
#: operator polls each Ready pool pod's index for the pool's and its models' status. Counts are the
#: replica's since it started.
#: Bytes resident for the model now: its process's RSS measured after load and warmup; 0 when not loaded.
INDEX_RESIDENT_BYTES = "residentBytes"
#: RFC 3339 UTC time (whole seconds) of the model's latest request; absent when it has had none.
INDEX_LAST_USED = "lastUsed"
#: Loads that succeeded.
INDEX_LOADS = "loads"
#: Loads that failed.
INDEX_LOAD_FAILURES = "loadFailures"
#: Unloads for the memory budget.
INDEX_EVICTIONS = "evictions"
#: The cause of the model's latest load when it failed (one line, the model process's own sentence);
#: absent when its latest load did not fail.
INDEX_LOAD_ERROR = "loadError"


def model_file(model: str) -> str:
    """The ConfigMap key (and file name) of ``model``'s configuration: ``<model>.yaml``."""
    return f"{model}{MODEL_FILE_SUFFIX}"


def model_of_file(name: str) -> str | None:
    """The model a file name of the flat layout configures (``bert.yaml`` -> ``bert``); ``None`` for any
    other name (another suffix, nothing before it, or a hidden name starting with ``.``)."""
    if name.startswith(".") or not name.endswith(MODEL_FILE_SUFFIX):
        return None
    model = name[: -len(MODEL_FILE_SUFFIX)]
    return model or None
