"""The model instance count the operator and the runtime agree on: how many instances of a model take
batches from its one queue at once (Triton's ``instance_group`` count). The CRD writes it
``spec.model.instances``, the runtime's file ``instances`` (flag ``--instances``), the model
configuration extension ``instance_group[0].count``; one instance is one executor thread of the model's
process, every instance on the replica's one device. Its bound is :data:`MAX_INSTANCES`.

Pure: standard library only.
"""

from __future__ import annotations

__all__ = ["MAX_INSTANCES"]

#: The most instances of one model: the CRD's schema (``spec.model.instances``' maximum), the operator's
#: check and the runtime's configuration all read it here.
MAX_INSTANCES = 16
