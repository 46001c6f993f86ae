"""Mechanisms the runtime and the activator both run, in pure modules both import.

Standard library and asyncio only: no server, network, Kubernetes or third-party code, nothing of
``kubeinfer.operator``, ``kubeinfer.runtime`` or ``kubeinfer.activator`` (pyproject.toml's
import-linter contract; tests/unit/shared checks the imports are the standard library's).
``kubeinfer.contract`` holds what the sides must agree on (names, tables); this package holds code
they share.

- ``hold``: requests wait, bounded, with deadlines and priorities, until their target is ready: the
  activator holds requests for an InferenceService at zero until a replica is Ready, the runtime's
  model repository mode holds requests for a model until it is loaded.
"""
