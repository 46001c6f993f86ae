"""Operator settings from the environment (``KUBEINFER_*``) and the command line (which wins)."""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field


class Settings(BaseModel):
    """All settings of ``kubeinfer-operator``.

    Environment variables: ``KUBEINFER_NAMESPACES`` (comma-separated; empty = all namespaces),
    ``KUBEINFER_PROMETHEUS_URL``, ``KUBEINFER_PROMETHEUS_BEARER_TOKEN_FILE``,
    ``KUBEINFER_PROMETHEUS_CA_FILE``, ``KUBEINFER_PROMETHEUS_INSECURE_SKIP_VERIFY`` (true/false),
    ``KUBEINFER_AUTOSCALE_INTERVAL_SECONDS`` (15), ``KUBEINFER_RESYNC_SECONDS`` (300: period of the
    level-based resync of every InferenceService), ``KUBEINFER_LOG_FORMAT`` (plain|json),
    ``KUBEINFER_LOG_LEVEL`` (INFO), ``KUBEINFER_METRICS_PORT`` (8000; 0 = off),
    ``KUBEINFER_HEALTH_PORT`` (8081; 0 = off), ``KUBEINFER_PEERING`` (kopf peering object name,
    "kubeinfer"; "" = standalone), ``KUBEINFER_PEERING_PRIORITY`` (random 1..32767 when unset: of
    two operators the higher priority acts, the other pauses), ``KUBEINFER_HELM_RELEASE`` and
    ``KUBEINFER_HELM_RELEASE_NAMESPACE`` (set by the chart: a peering object the operator creates
    carries Helm's ownership metadata, so that ``helm install`` adopts it instead of failing with
    "already exists" when the operator pod starts before Helm creates it), ``KUBECONFIG``.
    """

    namespaces: list[str] = Field(default_factory=list)
    prometheus_url: str = "http://prometheus:9090"
    prometheus_bearer_token_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_insecure_skip_verify: bool = False
    autoscale_interval_seconds: float = Field(default=15.0, gt=0)
    resync_seconds: float = Field(default=300.0, gt=0)
    log_format: Literal["plain", "json"] = "plain"
    log_level: str = "INFO"
    metrics_port: int = Field(default=8000, ge=0, le=65535)
    health_port: int = Field(default=8081, ge=0, le=65535)
    bind_address: str = "0.0.0.0"
    peering: str = "kubeinfer"
    peering_priority: int = Field(default_factory=lambda: random.randint(1, 32767))
    helm_release: str = ""
    helm_release_namespace: str = ""
    kubeconfig: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``KUBEINFER_*`` variables. Raises ``pydantic.ValidationError`` naming the variable's field."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(f"KUBEINFER_{name.upper()}")
            if raw is None:
                continue
            values[name] = [n.strip() for n in raw.split(",") if n.strip()] if name == "namespaces" else raw
        if env.get("KUBECONFIG") and "kubeconfig" not in values:
            values["kubeconfig"] = env["KUBECONFIG"]
        return cls.model_validate(values)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
        """Environment first, then ``--flag`` overrides (``--namespaces a,b``, ``--peering ''`` ...)."""
        base = cls.from_env(env)
        parser = argparse.ArgumentParser(
            prog="kubeinfer-operator", description="The kubeinfer kopf operator."
        )
        for name in cls.model_fields:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None)
        args = parser.parse_args(argv)
        updates: dict[str, object] = {}
        for name in cls.model_fields:
            value = getattr(args, name)
            if value is not None:
                updates[name] = [n for n in value.split(",") if n] if name == "namespaces" else value
        return cls.model_validate({**base.model_dump(), **updates}) if updates else base
