"""Operator settings from the environment (``KUBEINFER_*``) and the command line (which wins)."""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Mapping, Sequence
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

#: A DNS-1123 label: a namespace's or a Service's name.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


class Settings(BaseModel):
    """All settings of ``kubeinfer-operator``.

    Each field ``name`` is read from the environment variable ``KUBEINFER_<NAME>`` and from the flag
    ``--<name with dashes>`` (the flag wins); ``kubeconfig`` also from ``KUBECONFIG``. Each field's
    description (shown by ``kubeinfer-operator --help`` with its variable and default) says what it
    does and its unit. Lists (``namespaces``, the reference patterns) are comma-separated.
    """

    namespaces: list[str] = Field(
        default_factory=list, description="namespaces to handle, comma-separated; empty = all namespaces"
    )
    prometheus_url: str = Field(
        default="http://prometheus:9090", description="Prometheus base URL the autoscaler queries"
    )
    prometheus_bearer_token_file: str | None = Field(
        default=None, description="file whose content is sent to Prometheus as a bearer token"
    )
    prometheus_ca_file: str | None = Field(
        default=None, description="PEM CA bundle that verifies Prometheus' TLS certificate"
    )
    prometheus_insecure_skip_verify: bool = Field(
        default=False, description="true: do not verify Prometheus' TLS certificate (testing only)"
    )
    prometheus_timeout_seconds: float = Field(
        default=5.0, gt=0, description="HTTP timeout of one Prometheus query, seconds"
    )
    prometheus_namespace: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
        max_length=63,
        description="namespace of the Prometheus that scrapes the runtime pods: the NetworkPolicy of an "
        "InferenceService (with spec.server.allowFrom, or any with network_policy_default_deny) admits it "
        "to port 8080 (/metrics); empty = from "
        "prometheus_url (NAME.NAMESPACE.svc...), else the chart's namespace for a bare NAME, else none",
    )
    prometheus_pod_labels: dict[str, str] = Field(
        default_factory=dict,
        description="labels of the Prometheus pods admitted to /metrics, comma-separated k=v; empty = "
        "every pod of prometheus_namespace",
    )
    network_policy_default_deny: bool = Field(
        default=False,
        description="true: every InferenceService gets the NetworkPolicy the operator owns, even without "
        "spec.server.allowFrom, admitting only the Prometheus of prometheus_namespace (to /metrics) and "
        "the peers allowFrom names; false = a NetworkPolicy only with allowFrom (every pod may connect)",
    )
    activator_enabled: bool = Field(
        default=False,
        description="true: the activator is installed and a Service at zero points at it, so an "
        "InferenceService with autoscaling.minReplicas 0 may scale to zero (and back on the activator's "
        "demand); false = minReplicas 0 keeps 1 replica and its ScaleToZero condition says why",
    )
    activator_service: str = Field(
        default="",
        pattern=rf"^({_DNS_LABEL}/{_DNS_LABEL})?$",
        description="NAMESPACE/NAME of the activator's Service (needed with activator_enabled): the Service "
        "of an InferenceService at zero is pointed at its Ready endpoints (the operator watches its "
        "EndpointSlices), and the runtime pods' NetworkPolicy admits the activator pods of NAMESPACE; "
        "with namespaces set, NAMESPACE must be one of them",
    )
    autoscale_interval_seconds: float = Field(
        default=15.0, gt=0, description="period of the autoscaler's decision per InferenceService, seconds"
    )
    resync_seconds: float = Field(
        default=300.0, gt=0, description="period of the level-based resync of every InferenceService, seconds"
    )
    log_format: Literal["plain", "json"] = Field(default="plain", description="plain | json")
    log_level: str = Field(default="INFO", description="DEBUG | INFO | WARNING | ERROR")
    metrics_port: int = Field(default=8000, ge=0, le=65535, description="operator /metrics port; 0 = off")
    health_port: int = Field(default=8081, ge=0, le=65535, description="kopf /healthz port; 0 = off")
    bind_address: str = Field(default="0.0.0.0", description="address of the metrics and health servers")
    peering: str = Field(
        default="kubeinfer", description='kopf peering object name; "" = standalone (no peering)'
    )
    peering_priority: int = Field(
        default_factory=lambda: random.randint(1, 32767),
        description="of two operators the higher priority acts, the other pauses; unset = random 1..32767",
    )
    helm_release: str = Field(
        default="",
        description="set by the chart: a peering object the operator creates carries Helm's ownership "
        "metadata for this release, so `helm install` adopts it (no 'already exists')",
    )
    helm_release_namespace: str = Field(default="", description="set by the chart: the release's namespace")
    peering_wait_seconds: float = Field(
        default=20.0,
        ge=0,
        description="with helm_release set: how long to wait for the chart's peering object before "
        "creating it, seconds (Helm creates it right after the operator's Deployment; creating it first "
        "would fail `helm install` with 'already exists'; keep it under the liveness probe's budget, "
        "50 s with the chart's defaults)",
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file (also KUBECONFIG); unset = in-cluster"
    )
    secret_references_allowed: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Secrets an InferenceService may name (spec.model.credentials, "
        "spec.quantization.calibration.credentials, spec.server.auth.bearerTokenSecretRef, "
        "spec.runtime.env[].valueFrom.secretKeyRef): comma-separated globs of NAME or NAMESPACE/NAME; "
        "'*' = any (the default), empty = none. The runtime pods receive what is named, so without a "
        "limit whoever may create InferenceServices can read any Secret of the namespace through them",
    )
    service_account_references_allowed: list[str] = Field(
        default_factory=lambda: ["*"],
        description="ServiceAccounts spec.serviceAccountName may name (their token is mounted in the "
        "runtime pods): comma-separated globs of NAME or NAMESPACE/NAME; '*' = any (the default), "
        "empty = none",
    )
    image_volumes: bool | None = Field(
        default=None,
        description="whether the cluster serves image volumes (volumes[].image), which oci:// models are "
        "mounted as: auto = from the API server's version (on by default from Kubernetes 1.35); true = "
        "the ImageVolume feature gate is on (e.g. on 1.33 or 1.34); false = never. Where they are not "
        "served an oci:// model is Ready=False ImageVolumeUnsupported and nothing is applied",
    )

    @model_validator(mode="after")
    def _activator_service_needed(self) -> Settings:
        """``activator_enabled`` needs ``activator_service``, in a namespace the operator watches."""
        if self.activator_enabled and not self.activator_service:
            raise ValueError(
                f"{env_var('activator_enabled')}=true needs {env_var('activator_service')} "
                "(NAMESPACE/NAME of the activator's Service)"
            )
        where = self.activator_namespace()
        if self.activator_enabled and self.namespaces and where not in self.namespaces:
            raise ValueError(
                f"{env_var('activator_service')} is in namespace {where!r}, which {env_var('namespaces')} "
                f"({','.join(self.namespaces)}) does not list: the operator watches the activator's "
                "EndpointSlices only in the namespaces it handles"
            )
        return self

    def activator_namespace(self) -> str:
        """NAMESPACE of ``activator_service`` (``""`` when unset)."""
        return self.activator_service.partition("/")[0]

    def activator_name(self) -> str:
        """NAME of ``activator_service`` (``""`` when unset)."""
        return self.activator_service.partition("/")[2]

    @field_validator("image_volumes", mode="before")
    @classmethod
    def _auto(cls, value: object) -> object:
        """``auto`` (any case, or empty) is ``None``; ``true`` / ``false`` are read as booleans."""
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None
        return value

    @field_validator("prometheus_pod_labels", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        """``k=v,k=v`` (as the environment and the flag give it) into a mapping."""
        if not isinstance(value, str):
            return value
        labels: dict[str, str] = {}
        for item in (i.strip() for i in value.split(",")):
            if not item:
                continue
            key, sep, val = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"expected comma-separated key=value labels, got {item!r}")
            labels[key.strip()] = val.strip()
        return labels

    def prometheus_namespace_in_force(self) -> str:
        """The namespace of the Prometheus that scrapes the runtime pods, ``""`` when unknown:
        ``prometheus_namespace``; else NAMESPACE of a ``prometheus_url`` host ``NAME.NAMESPACE.svc[...]``;
        else, for a bare host ``NAME`` (a Service in the operator's namespace), ``helm_release_namespace``.
        An IP address or another host name says nothing about where Prometheus runs."""
        if self.prometheus_namespace:
            return self.prometheus_namespace
        host = urlsplit(self.prometheus_url).hostname or ""
        labels = host.split(".")
        if len(labels) >= 3 and labels[2] == "svc":
            return labels[1]
        if len(labels) == 1 and ":" not in host:  # not an IPv6 address
            return self.helm_release_namespace
        return ""

    @classmethod
    def _env_values(cls, env: Mapping[str, str] | None) -> dict[str, object]:
        """The raw values of the ``KUBEINFER_*`` variables set (and ``KUBECONFIG``), by field."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(env_var(name))
            if raw is None:
                continue
            values[name] = _split(raw) if name in LIST_FIELDS else raw
        if env.get("KUBECONFIG") and "kubeconfig" not in values:
            values["kubeconfig"] = env["KUBECONFIG"]
        return values

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``KUBEINFER_*`` variables. Raises ``pydantic.ValidationError`` naming the variable's field
        (both variables where two settings do not go together)."""
        return cls.model_validate(cls._env_values(env))

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
        """Environment first, then ``--flag`` overrides (``--namespaces a,b``, ``--peering ''`` ...),
        validated together (a flag may complete what a variable needs)."""
        base = cls._env_values(env)
        parser = argparse.ArgumentParser(
            prog="kubeinfer-operator",
            description="The kubeinfer kopf operator. Each flag can also be set by its environment variable.",
        )
        for name, field in cls.model_fields.items():
            default = SHOWN_DEFAULTS.get(name, field.get_default(call_default_factory=True))
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                default=None,
                help=f"{field.description} (env {env_var(name)}; default: {default!r})",
            )
        args = parser.parse_args(argv)
        updates: dict[str, object] = {}
        for name in cls.model_fields:
            value = getattr(args, name)
            if value is not None:
                updates[name] = _split(value) if name in LIST_FIELDS else value
        return cls.model_validate({**base, **updates})


#: How ``--help`` shows the defaults that are not a plain value.
SHOWN_DEFAULTS = {"peering_priority": "random", "image_volumes": "auto"}
#: The settings given as comma-separated lists (environment and flags).
LIST_FIELDS = frozenset({"namespaces", "secret_references_allowed", "service_account_references_allowed"})


def _split(raw: str) -> list[str]:
    """A comma-separated list (items stripped; empty items dropped, so ``""`` is the empty list)."""
    return [n.strip() for n in raw.split(",") if n.strip()]


def env_var(field: str) -> str:
    """The environment variable of the setting ``field``: ``KUBEINFER_`` + its name upper-cased."""
    return f"KUBEINFER_{field.upper()}"
