"""The InferenceService's condition types, every reason its conditions and Events carry, and what each
one means. Pure: no I/O, the standard library only; it imports nothing of the operator.

Each reason the operator writes is defined here once, as a module constant (``MODEL_FETCH_FAILED``)
and as an entry of :data:`REASONS` (a condition's reason) or :data:`EVENTS` (an Event's reason) that
says which condition and status it comes with, whether it also sets ``Stalled=True``, what it means and
what to do. The code uses the constants (a unit test fails on a reason spelt as a literal elsewhere
under ``operator/``); what the code decides from a reason (does it stall, does it post a Warning Event,
which kubelet waiting reasons are carried over) is read from the entries; and docs/troubleshooting.md's
tables are rendered from them by ``hack/reasons.py`` (a unit test fails when the doc is stale). The
``meaning``, ``action`` and ``label`` texts are markdown, with links relative to ``docs/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

# --- condition types -------------------------------------------------------------------------------

#: Condition types the operator writes.
#: Ready: serving the current generation (every desired replica updated, available and ready).
CONDITION_READY = "Ready"
#: Serving: at least one ready pod serves traffic (of any version; true through a rollout).
CONDITION_SERVING = "Serving"
#: Reconciling (kstatus): a creation or rollout is in flight; present only while true.
CONDITION_RECONCILING = "Reconciling"
#: Stalled (kstatus): a fault that will not resolve by itself (bad image, crash loop, ...); only while true.
#: It carries the Ready reason that set it (:attr:`Reason.stalled`), so it has no reasons of its own.
CONDITION_STALLED = "Stalled"
#: AutoscalingActive: the autoscaler's; removed when autoscaling is off.
CONDITION_AUTOSCALING_ACTIVE = "AutoscalingActive"
#: ScaleToZero: whether ``autoscaling.minReplicas: 0`` is in force; present only with it.
CONDITION_SCALE_TO_ZERO = "ScaleToZero"

#: Kubernetes' own condition types that the diagnosis reads (a Deployment's, a pod's). Two share their
#: names with reasons of Ready (``Progressing``, ``ReplicaFailure``): the operator's reasons are named
#: after them.
DEPLOYMENT_AVAILABLE = "Available"
DEPLOYMENT_PROGRESSING = "Progressing"
DEPLOYMENT_REPLICA_FAILURE = "ReplicaFailure"
POD_SCHEDULED = "PodScheduled"

# --- reasons of Ready (Stalled carries the same) ---------------------------------------------------

CREATING = "Creating"
PROGRESSING = "Progressing"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
#: Ready=False from a Deployment's ``Progressing=False`` that gives no reason of its own.
PROGRESS_FAILED = "ProgressFailed"
FAILED_CREATE = "FailedCreate"
#: Ready=False from a Deployment's ``ReplicaFailure=True`` whose pods cannot be deleted.
FAILED_DELETE = "FailedDelete"
#: Ready=False from a Deployment's ``Progressing=False``: its new ReplicaSet cannot be created.
REPLICA_SET_CREATE_ERROR = "ReplicaSetCreateError"
#: Ready=False from a Deployment's ``ReplicaFailure=True`` that gives no reason of its own.
REPLICA_FAILURE = "ReplicaFailure"
MODEL_FETCH_FAILED = "ModelFetchFailed"
MODEL_LOAD_FAILED = "ModelLoadFailed"
QUANTIZATION_BELOW_GATE = "QuantizationBelowGate"
OOM_KILLED = "OOMKilled"
IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
INVALID_IMAGE_NAME = "InvalidImageName"
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
CREATE_CONTAINER_ERROR = "CreateContainerError"
RUN_CONTAINER_ERROR = "RunContainerError"
INVALID_SPEC = "InvalidSpec"
SECRET_NOT_ALLOWED = "SecretNotAllowed"
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
IMAGE_VOLUME_UNSUPPORTED = "ImageVolumeUnsupported"
UNSCHEDULABLE = "Unschedulable"
PERSISTENT_VOLUME_CLAIM_NOT_FOUND = "PersistentVolumeClaimNotFound"
RECONCILE_FAILED = "ReconcileFailed"
API_SERVER_ERROR = "ApiServerError"
MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
#: Ready=True from a Deployment's ``Available`` condition that gives no reason of its own.
ROLLOUT_COMPLETE = "RolloutComplete"
#: Ready of a pooled InferenceService (``spec.pool``) and of a ModelPool itself.
POOL_NOT_FOUND = "PoolNotFound"
POOL_NOT_READY = "PoolNotReady"
POOL_READY = "PoolReady"
MODEL_NAME_TAKEN = "ModelNameTaken"
POOL_NAME_TAKEN = "PoolNameTaken"

# --- reasons of ScaleToZero ------------------------------------------------------------------------

SCALE_TO_ZERO_ENABLED = "ScaleToZeroEnabled"
SCALE_TO_ZERO_UNAVAILABLE = "ScaleToZeroUnavailable"

# --- reasons of Serving and Reconciling ------------------------------------------------------------

READY_REPLICAS = "ReadyReplicas"
NO_READY_REPLICAS = "NoReadyReplicas"
ROLLOUT_IN_PROGRESS = "RolloutInProgress"

# --- reasons of AutoscalingActive ------------------------------------------------------------------

ACTIVE = "Active"
BACKLOG_DRAINED = "BacklogDrained"
AT_MAX_REPLICAS = "AtMaxReplicas"
REPLICAS_STARTING = "ReplicasStarting"
SCALE_UP_COOLING_DOWN = "ScaleUpCoolingDown"
MAX_QUEUE_DELAY_COOLING_DOWN = "MaxQueueDelayCoolingDown"
STABILIZATION_WINDOW = "StabilizationWindow"
ARRIVALS_RISING = "ArrivalsRising"
SCALE_IN_COOLING_DOWN = "ScaleInCoolingDown"
WITHIN_TOLERANCE = "WithinTolerance"
TARGET_MET = "TargetMet"
SCALED_TO_ZERO = "ScaledToZero"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
METRICS_MISSING = "MetricsMissing"
STALE_METRICS = "StaleMetrics"
INVALID_METRICS = "InvalidMetrics"
QUERY_ERROR = "QueryError"
UNUSABLE_SIGNALS = "UnusableSignals"
NO_DEPLOYMENT = "NoDeployment"

# --- reasons of Events -----------------------------------------------------------------------------

CREATED = "Created"
ROLLOUT_STARTED = "RolloutStarted"
SCALED = "Scaled"
MAX_QUEUE_DELAY_CHANGED = "MaxQueueDelayChanged"
ROLLOUT_FINISHED = "RolloutFinished"
DELETED = "Deleted"
AUTOSCALED = "Autoscaled"
DRIFT_REVERTED = "DriftReverted"
SCALED_FROM_ZERO = "ScaledFromZero"
COLD_START = "ColdStart"

# --- the registry ----------------------------------------------------------------------------------

Status = Literal["True", "False"]
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Reason:
    """One reason a condition of the InferenceService carries.

    Attributes:
        name: the reason (CamelCase), as in ``status.conditions[].reason``.
        condition: the condition type it is used on (``Ready``, ``Serving``, ``Reconciling``,
            ``AutoscalingActive``); a name used on two types has an entry for each.
        status: the condition's status with it.
        meaning: what it means (markdown).
        action: what to do about it (markdown); ``""`` when there is nothing to do.
        stalled: Ready=False with it also sets ``Stalled=True`` with the same reason and message: a
            fault that will not resolve by itself.
        expected: Ready=False with it is a step of a healthy start-up or rollout: no Warning Event.
        waiting: a container waiting reason of the kubelet's that the diagnosis carries over as the
            Ready reason, with the kubelet's message.
        label: words after the name in the doc's table (where it comes from, its Event); ``""``: none.
    """

    name: str
    condition: str
    status: Status
    meaning: str
    action: str = ""
    stalled: bool = False
    expected: bool = False
    waiting: bool = False
    label: str = ""


@dataclass(frozen=True)
class EventReason:
    """One reason of an Event the operator posts on the InferenceService (besides the Ready reasons
    its transitions post, :data:`EXPECTED_NOT_READY_REASONS`).

    Attributes:
        name: the Event's reason (CamelCase).
        type: ``Normal`` for an expected transition, ``Warning`` for a fault.
        meaning: when it is posted (markdown).
    """

    name: str
    type: EventType
    meaning: str


def _fault(name: str, meaning: str, action: str, *, waiting: bool = False, label: str = "") -> Reason:
    """A ``Ready=False`` reason of a fault that will not resolve by itself: it also sets ``Stalled``."""
    return Reason(name, CONDITION_READY, "False", meaning, action, stalled=True, waiting=waiting, label=label)


def _hold(name: str, meaning: str, action: str = "") -> Reason:
    """An ``AutoscalingActive=True`` reason: the kind of hold of a tick that changes nothing."""
    return Reason(name, CONDITION_AUTOSCALING_ACTIVE, "True", meaning, action)


def _signal_problem(name: str, meaning: str, action: str = "") -> Reason:
    """An ``AutoscalingActive=False`` reason: the autoscaler cannot act on the signals and changes nothing."""
    return Reason(name, CONDITION_AUTOSCALING_ACTIVE, "False", meaning, action)


# Entries that share one row of the doc's table share their meaning and action (the same text).
_PROGRESS_DEADLINE = (
    "the Deployment's rollout is stuck (image pull, startupProbe failing, no GPU node) and no pod shows a "
    "cause of its own (a pod's reason, below, goes first)",
    "`kubectl describe pod`; the startupProbe allows 120 s (bundled model) or 600 s (any other source) + "
    "60 s per warmup step, counted from the runtime container's start: the fetch init container runs "
    "before it, bounded by `spec.model.fetch` (stall timeout, retries)",
)
_FAILED_CREATE = (
    "pods cannot be created (quota, admission, missing ServiceAccount)",
    "the message says which",
)
_IMAGE_PULL = (
    "a runtime pod cannot pull `spec.runtime.image` (message: which pod, the kubelet's words); "
    "`ErrImagePull` and its back-off are both reported as `ImagePullBackOff`, so the reason does not "
    "alternate",
    "fix the image or the pull secret",
)
_CONTAINER_FAILS = (
    "the runtime container does not start or keeps exiting for another reason; after a crash the message "
    "is `exit code N (Reason)` and the runtime's own one-line termination message when it wrote one (e.g. "
    "`invalid configuration: ...`), never a log tail",
    "the message says why; else `kubectl logs --previous` of that pod (a bad model path, a missing Secret "
    "in `runtime.env`)",
)
_NOT_ALLOWED = (
    "the InferenceService names a Secret (a ServiceAccount) the operator's `secretReferences.allowed` "
    "(`serviceAccountReferences.allowed`) does not let through; the message names it and the field. "
    "Nothing was applied: no Deployment created, an existing one left as it was",
    "use a Secret the policy allows, or ask the cluster admin "
    "([security](security.md#which-secrets-an-inferenceservice-may-name))",
)
_AVAILABLE = (
    "message `n/n replicas ready`: every replica of the current version loaded, warmed up and ready, no "
    "old pod left",
    "",
)

#: Every reason of the InferenceService's conditions, in the order of the doc's tables.
REASONS: tuple[Reason, ...] = (
    # Ready
    Reason(
        CREATING,
        CONDITION_READY,
        "False",
        "the owned objects are being applied; no Deployment yet",
        "wait a few seconds",
        expected=True,
    ),
    Reason(
        PROGRESSING,
        CONDITION_READY,
        "False",
        "creation or a rollout in flight (`Reconciling=True`): replicas are starting (model load, "
        "quantization, warmup: readiness is gated on warmup) or old pods are being replaced; the message "
        "gives the counts",
        "wait; if it lasts, `kubectl get pods -l kubeinfer.io/inferenceservice=NAME` and the runtime's log",
        expected=True,
    ),
    _fault(
        PROGRESS_DEADLINE_EXCEEDED, *_PROGRESS_DEADLINE, label="(from the Deployment's Progressing=False)"
    ),
    _fault(PROGRESS_FAILED, *_PROGRESS_DEADLINE, label="(one without a reason)"),
    _fault(
        REPLICA_SET_CREATE_ERROR,
        "the Deployment cannot create the ReplicaSet of the new pod template (quota, admission, a "
        "webhook that refuses it)",
        "the message is the Deployment controller's; `kubectl describe deployment NAME`",
        label="(from the Deployment's Progressing=False)",
    ),
    _fault(FAILED_CREATE, *_FAILED_CREATE, label="(from the Deployment's ReplicaFailure)"),
    _fault(REPLICA_FAILURE, *_FAILED_CREATE, label="(from one without a reason)"),
    _fault(
        FAILED_DELETE,
        "pods of the Deployment cannot be deleted (admission, a webhook that refuses the deletion)",
        "the message says which",
        label="(from the Deployment's ReplicaFailure)",
    ),
    _fault(
        MODEL_FETCH_FAILED,
        "the model (or the calibration file) cannot be fetched: the `fetch` init container failed (the "
        "message is its one-line cause, e.g. `pod P init container fetch: s3://models/bert: 403 "
        "AccessDenied`, `...: sha256 mismatch (...)`, `...: stalled: no data for 60 s`, `...: the server "
        "answered an HTML page, not a model (...)`: a login page or a web page where the file was asked "
        "for), cannot start "
        '(`CreateContainerConfigError`: `secret "model-s3" not found`, `couldn\'t find key HF_TOKEN in '
        "Secret ns/hf`), or the `oci://` model image cannot be pulled (`model image registry/repo:tag: "
        "...`, the kubelet's message). The same reason and message while it retries (back-off, running "
        "again)",
        "fix the URI, the Secret (its keys per scheme, see [model sources](model-sources.md); an HTML page "
        "is often an expired token), the bucket's policy or the checksum; `kubectl logs POD -c fetch` has "
        "the progress lines",
    ),
    _fault(
        MODEL_LOAD_FAILED,
        "the model was fetched (or is on its path) but the runtime cannot load it; the message is the "
        "runtime's own line: `exit code 1 (Error): model load failed: <exception>: <why>`. On a pooled "
        "InferenceService (`spec.pool`): its model's latest load on a replica of the pool failed (the "
        "operator reads each ready replica's model repository index), the message names the pod and the "
        "runtime's cause; the pool's other models are unaffected, and it clears once a load succeeds (the "
        "model's next request after the runtime's backoff, or a repository load)",
        "a wrong `format`, a directory without the files the format needs (`hf.allowPatterns`), an ONNX "
        "directory with several `.onnx` files; `kubectl logs --previous POD -c runtime` (a pool's: `kubectl "
        "logs POD`, then a request or `tritonclient`'s `load_model`)",
    ),
    _fault(
        QUANTIZATION_BELOW_GATE,
        "the quantized (or exported) model deviates from fp32 more than `quantization.gate` allows, measured "
        "at load; the message gives each figure and its bar: `quantization below the gate: mean cosine "
        "0.981 < min_cosine 0.99 against fp32 on 200 gate texts`",
        "a milder `quantization.mode` (int8-static calibrated on your texts, bf16), `skipModules` for the "
        "layers that lose most, or a lower bar if the figure is good enough for your use",
    ),
    _fault(
        OOM_KILLED,
        "a container was killed for memory (`killed for memory, exit code 137 (memory limit 4Gi)`), also "
        "while it restarts",
        "raise `spec.resources.memory` (quantization, a smaller `batching.maxBatchSize`, `cache.maxBytes` "
        "count toward it)",
    ),
    _fault(IMAGE_PULL_BACK_OFF, *_IMAGE_PULL, waiting=True),
    _fault(INVALID_IMAGE_NAME, *_IMAGE_PULL, waiting=True),
    _fault(CRASH_LOOP_BACK_OFF, *_CONTAINER_FAILS, waiting=True),
    _fault(CREATE_CONTAINER_CONFIG_ERROR, *_CONTAINER_FAILS, waiting=True),
    _fault(CREATE_CONTAINER_ERROR, *_CONTAINER_FAILS, waiting=True),
    _fault(RUN_CONTAINER_ERROR, *_CONTAINER_FAILS, waiting=True),
    _fault(
        INVALID_SPEC,
        "the stored spec does not pass the operator's own validation (an object the API server let "
        "through, e.g. one stored under an older CRD); the message `invalid spec: ...` names the field. "
        "Nothing was applied",
        "fix the field the message names",
    ),
    _fault(SECRET_NOT_ALLOWED, *_NOT_ALLOWED),
    _fault(SERVICE_ACCOUNT_NOT_ALLOWED, *_NOT_ALLOWED),
    _fault(
        IMAGE_VOLUME_UNSUPPORTED,
        "the model is `oci://`, mounted as an image volume, and this cluster does not serve image volumes: "
        "its API server is older than 1.35 (the `ImageVolume` feature gate is off by default before), or "
        "the chart value `imageVolumes` is `false`; the message names the API server's version. Nothing "
        "was applied, rather than a Deployment the API server would refuse or strip the volume from",
        "on 1.33/1.34 with the gate on in the API server and the kubelets, set `imageVolumes: true`; "
        "otherwise serve the model from `s3://`, `https://`, `hf://` or `pvc://` "
        "([model sources](model-sources.md#oci-an-image-volume)). The operator reads the version at start: "
        "restart it after a cluster upgrade",
    ),
    _fault(
        UNSCHEDULABLE,
        "no node can take a replica (e.g. no node with the GPUs / `gpuProduct` asked for)",
        "the message is the scheduler's; check GPU capacity, tolerations, `nodeSelector`",
    ),
    _fault(
        PERSISTENT_VOLUME_CLAIM_NOT_FOUND,
        "a `pvc://` model or calibration URI names a claim that does not exist in the namespace",
        "create the claim",
    ),
    _fault(
        RECONCILE_FAILED,
        "the API server refused one of the operator's writes (forbidden, invalid)",
        "the message carries the API error; check the chart's RBAC and the operator's log",
        label="(+ Warning Event)",
    ),
    Reason(
        API_SERVER_ERROR,
        CONDITION_READY,
        "False",
        "3 reconciles in a row failed with a transient API error (5xx, e.g. a validating webhook that is "
        "down, a conversion error); the operator keeps retrying with back-off (5 s doubling to 60 s) and "
        "clears it on the next success",
        "the message carries the API error; fix the webhook/API server",
        label="(+ Warning Event)",
    ),
    Reason(
        MINIMUM_REPLICAS_AVAILABLE,
        CONDITION_READY,
        "True",
        *_AVAILABLE,
        label="(from the Deployment's Available)",
    ),
    Reason(ROLLOUT_COMPLETE, CONDITION_READY, "True", *_AVAILABLE, label="(one without a reason)"),
    Reason(
        SCALED_TO_ZERO,
        CONDITION_READY,
        "True",
        "the service is healthy at zero replicas (`autoscaling.minReplicas: 0`): it had no requests for "
        "its idle window (`scaleToZero.idleAfter`); a request held by the activator brings a replica back. "
        "kstatus, Flux and Argo CD read it as current / Healthy",
    ),
    # Ready of a pooled InferenceService (spec.pool), and of a ModelPool
    Reason(
        POOL_NOT_FOUND,
        CONDITION_READY,
        "False",
        "`spec.pool` names a ModelPool that does not exist in the namespace; the message names it. Its "
        "Service is applied (selecting the pool's pods, none yet)",
        "create the ModelPool (`kubectl get kpool`), or fix `spec.pool`",
    ),
    _fault(
        MODEL_NAME_TAKEN,
        "another InferenceService of the same pool serves a model of the same name (the first by name "
        "keeps it); this one is left out of the pool's model repository. The message names the other",
        "give one of them another `spec.model.name`",
    ),
    _fault(
        POOL_NAME_TAKEN,
        "on a ModelPool: a Deployment of the pool's name exists and is not the pool's (an "
        "InferenceService's); nothing of the pool was applied",
        "rename the pool (and the `spec.pool` of its InferenceServices)",
    ),
    Reason(
        POOL_NOT_READY,
        CONDITION_READY,
        "False",
        "on a ModelPool and on the InferenceServices naming it: the pool's Deployment has no ready "
        "replica yet (the message gives the counts)",
        "wait; if it lasts, `kubectl get pods -l kubeinfer.io/pool=POOL` and the runtime's log",
        expected=True,
    ),
    Reason(
        POOL_READY,
        CONDITION_READY,
        "True",
        "on a ModelPool: every replica ready; on an InferenceService naming it: the pool has a ready "
        "replica and serves the model (loaded on its first request; where it is loaded, its bytes and "
        "counts: `status.model`)",
    ),
    # Serving
    Reason(
        READY_REPLICAS,
        CONDITION_SERVING,
        "True",
        "at least one ready pod (of any version) serves traffic; the message gives the counts",
    ),
    Reason(NO_READY_REPLICAS, CONDITION_SERVING, "False", "no ready replica serves"),
    Reason(
        SCALED_TO_ZERO,
        CONDITION_SERVING,
        "False",
        "no replica on purpose (scaled to zero): a request waits at the activator while one starts",
    ),
    # Reconciling
    Reason(
        CREATING,
        CONDITION_RECONCILING,
        "True",
        "the owned objects are being applied; no Deployment yet",
    ),
    Reason(
        ROLLOUT_IN_PROGRESS,
        CONDITION_RECONCILING,
        "True",
        "a creation or rollout is in flight; the message gives the counts",
    ),
    # ScaleToZero
    Reason(
        SCALE_TO_ZERO_ENABLED,
        CONDITION_SCALE_TO_ZERO,
        "True",
        "`autoscaling.minReplicas: 0` is in force: after `scaleToZero.idleAfter` without requests the "
        "autoscaler takes the service to zero, and the activator's demand brings a replica back; the "
        "message ends with where the Service routes: to the activator while no replica is Ready (or the "
        "last one drains), else to the pods",
    ),
    Reason(
        SCALE_TO_ZERO_UNAVAILABLE,
        CONDITION_SCALE_TO_ZERO,
        "False",
        "`autoscaling.minReplicas: 0` is asked for but the operator is not told that the activator is "
        "installed: without it a request at zero would be lost, so the service keeps 1 replica",
        "install the activator and set `KUBEINFER_ACTIVATOR_ENABLED=true` and "
        "`KUBEINFER_ACTIVATOR_SERVICE=NAMESPACE/NAME` (the activator's Service) on the operator, or set "
        "`minReplicas: 1`",
    ),
    # AutoscalingActive
    Reason(
        ACTIVE,
        CONDITION_AUTOSCALING_ACTIVE,
        "True",
        "the signals are known and it acts; the message is its last decision",
    ),
    _hold(
        BACKLOG_DRAINED,
        "P99 is over target but the service holds little work (Little's law): the window's P99 is a "
        "drained backlog, so nothing moves until the window catches up",
    ),
    _hold(
        AT_MAX_REPLICAS,
        "a scale-up is due but the replicas are at `autoscaling.maxReplicas`",
        "raise `autoscaling.maxReplicas` if the cluster has room",
    ),
    _hold(REPLICAS_STARTING, "a scale-up waits for the replicas added before to start"),
    _hold(SCALE_UP_COOLING_DOWN, "a scale-up waits for `autoscaling.scaleUpCooldown`"),
    _hold(
        MAX_QUEUE_DELAY_COOLING_DOWN,
        "a change of the max queue delay waits for `autoscaling.maxQueueDelayCooldown`",
    ),
    _hold(
        STABILIZATION_WINDOW,
        "a scale-in waits until `autoscaling.scaleDownStabilization` has been observed",
    ),
    _hold(
        ARRIVALS_RISING,
        "a scale-in waits: the arrival rate is rising and, carried one more tick on that rise, needs more "
        "replicas than the scale-in leaves",
    ),
    _hold(SCALE_IN_COOLING_DOWN, "a scale-in waits for `autoscaling.scaleDownCooldown`"),
    _hold(WITHIN_TOLERANCE, "P99 is within `autoscaling.tolerance` of the target: nothing moves"),
    _hold(TARGET_MET, "P99 is comfortably under target and nothing is due"),
    _hold(
        SCALED_TO_ZERO,
        "the service has no replica: it had no requests for its idle window, and the autoscaler holds at "
        "zero (demand, not the autoscaler, brings a replica back)",
    ),
    _signal_problem(
        PROMETHEUS_UNAVAILABLE,
        "Prometheus's URL does not answer (or answers with a server error)",
        "check the chart value `prometheus.url`",
    ),
    _signal_problem(
        METRICS_MISSING,
        "no series: the runtime pods are not scraped, or their targets lack the "
        "`namespace`/`inferenceservice` labels (a ModelPool's: `pool`; a pool with no model loaded has "
        "no request series)",
        "see the chart's PodMonitor in [Install](install.md#install-on-a-real-cluster)",
    ),
    _signal_problem(
        STALE_METRICS,
        "samples older than the window: scraping stopped",
        "check that Prometheus still scrapes the runtime pods",
    ),
    _signal_problem(INVALID_METRICS, "a signal is NaN/Inf (or negative)"),
    _signal_problem(
        QUERY_ERROR,
        "a query is refused or answers something unexpected: a custom query in `autoscaling.queries` is "
        "wrong",
        "fix the query",
    ),
    _signal_problem(UNUSABLE_SIGNALS, "no request completed while some are queued"),
    _signal_problem(NO_DEPLOYMENT, "the InferenceService has no Deployment yet", "wait a few seconds"),
)

#: Every reason of the Events the operator posts besides the Ready reasons (order of the doc's table).
EVENTS: tuple[EventReason, ...] = (
    EventReason(CREATED, "Normal", "owned objects created"),
    EventReason(ROLLOUT_STARTED, "Normal", "a new pod template is rolled out"),
    EventReason(SCALED, "Normal", "`spec.replicas` applied to the Deployment, e.g. `replicas 1 → 3`"),
    EventReason(
        MAX_QUEUE_DELAY_CHANGED,
        "Normal",
        "`maxQueueDelay` changed with autoscaling off; hot-reloaded, no restart",
    ),
    EventReason(ROLLOUT_FINISHED, "Normal", "`Ready` turned true as a rollout or scale ended"),
    EventReason(DELETED, "Normal", "the PodDisruptionBudget removed when one replica remains"),
    EventReason(
        AUTOSCALED,
        "Normal",
        "each autoscaler action with its reason: replicas scaled or max queue delay changed, e.g. "
        "`P99 0.25 s > target 0.10 s, GPU 0.37 not busy: max queue delay 8 ms → 4 ms`; on a service "
        "without a GPU, "
        "`resources.gpus: 0`, the same reason reads `executor busy time 0.37 (not busy)`",
    ),
    EventReason(DRIFT_REVERTED, "Warning", "someone edited a field the operator owns, and it was put back"),
    EventReason(
        SCALED_FROM_ZERO,
        "Normal",
        "a request waits at the activator (its demand annotation is newer than the scale to zero): "
        "replicas 0 → 1",
    ),
    EventReason(
        COLD_START,
        "Normal",
        "the first replica after a scale from zero turned Ready: where its start went, from the pod's "
        "timestamps, in seconds from the demand (e.g. `first replica Ready 9 s after the demand at T (pod "
        "P): pod created 1 s, scheduled 1 s, sandbox ready 2 s, initialized 2 s, container started 2 s, "
        "Ready 9 s`); the model's load and warmup inside it are the runtime's "
        "`kubeinfer_cold_start_stage_seconds`",
    ),
)


def reasons_of(condition: str, status: Status | None = None) -> tuple[Reason, ...]:
    """The entries of :data:`REASONS` used on ``condition`` (with ``status`` when given), in order."""
    return tuple(r for r in REASONS if r.condition == condition and status in (None, r.status))


#: The Ready=False entries by name.
_NOT_READY: Mapping[str, Reason] = {r.name: r for r in reasons_of(CONDITION_READY, "False")}

#: Ready=False reasons of a healthy start-up or rollout: no Warning Event (the rollout's own Events say
#: it), no Stalled.
EXPECTED_NOT_READY_REASONS = frozenset(r.name for r in _NOT_READY.values() if r.expected)
#: Container waiting reasons of the kubelet's that the diagnosis carries over as the Ready reason.
KUBELET_WAITING_REASONS = frozenset(r.name for r in REASONS if r.waiting)


def sets_stalled(reason: str) -> bool:
    """Whether ``Ready=False`` with ``reason`` also sets ``Stalled=True`` (:attr:`Reason.stalled`). A
    reason not listed here (a Deployment's fault reason carried over, such as ``ReplicaSetCreateError``)
    is a fault that will not resolve by itself: it does."""
    known = _NOT_READY.get(reason)
    return known.stalled if known is not None else True
