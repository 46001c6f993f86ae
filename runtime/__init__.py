"""kubeinfer's batching model server (``kubeinfer-runtime``).

Modules, outermost first (an import-linter layers contract in pyproject.toml keeps the order):

- ``cli``: the console script (``kubeinfer-runtime serve``).
- ``server``: the model process's life cycle (load, warmup, serve, config reload, drain).
- transports, each an adapter that decodes, calls the data plane and encodes: ``rest`` (the Open
  Inference Protocol's REST routes, uvicorn), ``grpc_server`` (its gRPC service), ``frontend`` (an
  HTTP front-end process, ``server.httpWorkers`` > 1, on a ``RemotePlane``), ``frontend_pool`` (the
  model process's side of those: the processes and their IPC endpoint), ``ipc`` (the ZeroMQ messages
  between them).
- ``dataplane``: what every transport calls: model check, admission, validation, the batcher call,
  metrics, errors, health and metadata.
- ``batching`` (the batch planner and the event-loop batcher), ``executor`` (the batch threads).
- ``models``: formats and engines (loaders, quantization, warmup), from a local model directory.
- Beside them: ``config`` (``RuntimeConfig``, rendered by the operator), ``reload`` (the config-file
  watcher), ``process`` (what every process sets up first: open files, event loop), ``protocol`` (the
  v2 codec: JSON and the raw tensor layout), ``dtypes`` (the one datatype table), ``errors`` (the error
  hierarchy), ``metrics`` (Prometheus), ``service_time`` (the s(b) = a + c·b fit).
"""
