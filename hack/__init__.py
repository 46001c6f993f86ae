"""Developer tooling (local control plane, local pods, demo). Importable as ``hack.*`` for tests."""
