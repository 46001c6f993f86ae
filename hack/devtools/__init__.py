"""Processes and servers the tests, the demo and the benchmarks all run, outside the test tree.

``prom`` (a real Prometheus), ``runtime_proc`` (a runtime server process), ``operator_proc`` (the
operator as a local process) and ``runtime_tiny`` (tiny models built on the spot). ``tests/``
imports them from here; ``hack/`` and ``bench/`` never import ``tests`` (a unit test checks).
"""
