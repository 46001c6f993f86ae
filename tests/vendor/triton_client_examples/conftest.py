"""The vendored Triton client scripts here are programs, not tests: pytest never collects them, whatever
the collection patterns (they are run as subprocesses by tests/integration/clients)."""

collect_ignore_glob = ["*.py"]
