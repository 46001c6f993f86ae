"""docs/api.md's InferenceService reference is the one generated from the CRD (hack/apiref.py)."""

from __future__ import annotations

import pytest

from hack.apiref import API_DOC, BEGIN, END, render, splice


def test_chart_api_doc_field_reference_matches_the_crd() -> None:
    text = API_DOC.read_text()
    assert splice(text, render()) == text, (
        "docs/api.md is stale: run `.venv/bin/python hack/apiref.py --write`"
    )


def test_chart_apiref_covers_every_spec_field() -> None:
    body = render()
    for path in (
        "spec.model.uri",
        "spec.batching.maxQueueDelay",
        "spec.autoscaling.targetP99",
        "spec.runtime.args",
    ):
        assert f"`{path}`" in body
    assert "| `spec.batching.maxQueueDelay` | duration | time | `5ms` |" in body


def test_chart_apiref_splice_needs_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        splice("no markers here", "x")
    assert splice(f"a{BEGIN}old{END}b", "new\n") == f"a{BEGIN}\nnew\n{END}b"
