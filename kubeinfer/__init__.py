"""kubeinfer: a Kubernetes operator for model inference.

The sub-packages live in the repository's ``operator/`` and ``runtime/`` folders and are mapped
onto this namespace by ``pyproject.toml``: ``kubeinfer.operator`` (the kopf operator) and
``kubeinfer.runtime`` (the dynamic-batching model server). ``kubeinfer.contract`` lives here, in
``kubeinfer/contract/``: the pure modules both import (what the two sides must agree on).

``__version__`` is the installed distribution's version, i.e. ``project.version`` in
pyproject.toml, the one place it is written: the image tags (``hack/images.py``), the default
runtime image (``operator.api.DEFAULT_IMAGE``) and the server metadata (``runtime.server``) read it
from here. The Helm chart's ``appVersion`` must stay a literal (Helm reads Chart.yaml as data); a unit
test keeps it equal.
"""

from importlib.metadata import version as _version

__version__ = _version("kubeinfer")
