"""kubeinfer's activator: takes an InferenceService's traffic while it has no ready replica.

It holds REST and gRPC requests (``hold``: bounded per target, deadline- and priority-aware), asks for a
replica, and forwards the held requests once one is ready; requests for a ready target are forwarded at
once. ``targets`` says which target a request is for and where it is served; ``kube`` keeps the targets from
the Kubernetes API (``kubestate``: the pure part); ``rest`` and ``grpc_proxy`` are the two fronts; ``cli``
runs them (``kubeinfer-activator``). It imports nothing of the operator or the runtime (import-linter): it
speaks the Open Inference Protocol on the wire only, and shares with the operator only
``kubeinfer.contract.activator`` (names, ports, the demand annotation).
"""
