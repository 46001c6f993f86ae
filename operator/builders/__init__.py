"""Pure builders of the objects an InferenceService or a ModelPool owns (no I/O, no clock, no randomness)."""

from kubeinfer.operator.builders.configmap import build_configmap, config_hash, runtime_config
from kubeinfer.operator.builders.deployment import build_deployment
from kubeinfer.operator.builders.endpointslice import (
    activator_slice_name,
    build_activator_endpointslice,
    ready_addresses,
    slice_grpc_port,
)
from kubeinfer.operator.builders.networkpolicy import activator_peer, build_networkpolicy, scraper_peer
from kubeinfer.operator.builders.pdb import build_pdb, wants_pdb
from kubeinfer.operator.builders.pool import (
    build_pool_configmap,
    build_pool_deployment,
    pool_claims,
    pool_labels,
)
from kubeinfer.operator.builders.service import build_service

__all__ = [
    "activator_peer",
    "activator_slice_name",
    "build_activator_endpointslice",
    "build_configmap",
    "build_deployment",
    "build_networkpolicy",
    "build_pdb",
    "build_pool_configmap",
    "build_pool_deployment",
    "build_service",
    "config_hash",
    "pool_claims",
    "pool_labels",
    "ready_addresses",
    "runtime_config",
    "scraper_peer",
    "slice_grpc_port",
    "wants_pdb",
]
