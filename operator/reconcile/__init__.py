"""Reconciliation: the pure planning modules (``diff``, ``replicas``, ``rollout``, ``diagnosis``,
``report``, ``events``, ``backoff``) and the reconciler (``reconciler``), which applies the plan
through ``kubeinfer.operator.k8s`` and writes status through ``kubeinfer.operator.status``.

Nothing is re-exported here: importing a pure planner (``reconcile.diff``) must not load the
API-server client that ``reconcile.reconciler`` needs."""
