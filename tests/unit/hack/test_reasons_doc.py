"""docs/troubleshooting.md's tables of reasons are the ones rendered from the registry in
operator/conditions.py (hack/reasons.py)."""

from __future__ import annotations

import pytest
from kubeinfer.operator import conditions

from hack.reasons import COMMAND, DOC, TABLES, markers, render_doc, splice


def test_troubleshooting_tables_match_the_registry() -> None:
    text = DOC.read_text()
    assert render_doc(text) == text, f"docs/troubleshooting.md is stale: run `{COMMAND}`"


def test_the_tables_name_every_reason() -> None:
    tables = "".join(render() for render in TABLES.values())
    for reason in conditions.reasons_of(conditions.CONDITION_READY):
        assert f"{reason.status} `{reason.name}`" in tables or f", `{reason.name}`" in tables, reason.name
    for reason in conditions.reasons_of(conditions.CONDITION_AUTOSCALING_ACTIVE):
        assert f"| {reason.status} `{reason.name}` |" in tables, reason.name
    for event in conditions.EVENTS:
        assert f"| {event.type} | `{event.name}` |" in tables, event.name
    assert "| False `ImagePullBackOff`, `InvalidImageName` |" in tables  # one row per shared meaning
    assert (
        "Every False reason except `Creating`, `Progressing`, `ApiServerError`, `PoolNotFound` and "
        "`PoolNotReady` also sets" in tables
    )


def test_a_stale_table_is_seen() -> None:
    text = DOC.read_text()
    stale = text.replace("| Normal | `Scaled` |", "| Normal | `Resized` |")
    assert stale != text and render_doc(stale) == text


def test_splice_needs_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        splice("no markers here", "ready", "x")
    begin, end = markers("ready")
    assert splice(f"a{begin}old{end}b", "ready", "new\n") == f"a{begin}\nnew\n{end}b"
