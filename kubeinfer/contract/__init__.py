"""What the operator and the runtime (and the activator) must agree on, in pure modules both import.

Standard library only: no pydantic, no Kubernetes client, no torch, nothing of ``kubeinfer.operator``
or ``kubeinfer.runtime`` (pyproject.toml's import-linter contracts). A module here holds data and the
lookups over it; each side derives its own forms (the CRD's pattern and CEL, pod spec, the fetch
dispatch) from that data and never writes it a second time.

- ``sources``: the registry of model source schemes (``s3``, ``https``, ``pvc``, ...), one row each.
- ``formats``: the names of formats, engines, tasks, quantization modes and devices, and the table of
  rules over their combinations (one row each) from which the CRD's CEL and both sides' pydantic checks
  come.
- ``activator``: what the operator and the activator agree on: the InferenceService's API names, the pod
  label, the pods' ports, the demand annotation, and who writes which scale-to-zero transition.
- ``pool``: what the operator and the runtime agree on for a model pool: its API names, the label of its
  pods, the model repository's flat layout (``<model>.yaml``) and where it is mounted.
- ``batching``: the max queue delay's bound (seconds), which the CRD's rules, both sides' checks and the
  pool's termination grace read.
- ``instances``: the bound of a model's instance count (Triton's ``instance_group`` count), which the CRD's
  schema and both sides' checks read.
"""
