"""kubeinfer's batching model server (``kubeinfer-runtime``).

Modules: ``config`` (RuntimeConfig, the file the operator renders), ``batching`` (the dynamic batcher),
``protocol`` (Open Inference Protocol v2 codec), ``server`` (routes, health, ``/metrics``), ``metrics``
(Prometheus metrics), ``reload`` (config-file watcher), ``cli`` (the console script), ``models``
(loaders, quantization, warmup).
"""
