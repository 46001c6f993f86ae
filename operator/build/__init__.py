"""Pure builders of the objects an InferenceService owns (no I/O, no clock, no randomness)."""

from kubeinfer.operator.build.configmap import build_configmap, config_hash, runtime_config
from kubeinfer.operator.build.deployment import build_deployment
from kubeinfer.operator.build.networkpolicy import build_networkpolicy, scraper_peer
from kubeinfer.operator.build.pdb import build_pdb, wants_pdb
from kubeinfer.operator.build.service import build_service

__all__ = [
    "build_configmap",
    "build_deployment",
    "build_networkpolicy",
    "build_pdb",
    "build_service",
    "config_hash",
    "runtime_config",
    "scraper_peer",
    "wants_pdb",
]
