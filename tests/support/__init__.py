"""Helpers shared by tests, the demo and benchmarks (one module per owner)."""
