"""kubeinfer: a Kubernetes operator for model inference.

The sub-packages live in the repository's ``operator/`` and ``runtime/`` folders and are mapped
onto this namespace by ``pyproject.toml``: ``kubeinfer.operator`` (the kopf operator) and
``kubeinfer.runtime`` (the dynamic-batching model server).
"""

__version__ = "0.1.0"
