#!/usr/bin/env python3
"""Render docs/troubleshooting.md's tables of reasons from the registry in operator/conditions.py.

Every reason the operator writes (a condition's, an Event's) is defined once, with what it means and
what to do, in ``kubeinfer.operator.conditions``; this renders three tables from it: the ``Ready``
reasons (status and reason, meaning, what to do, and which of them set ``Stalled``), the
``AutoscalingActive`` reasons, and the Events. docs/troubleshooting.md embeds each between its
markers, ``<!-- reasons:NAME:begin -->`` and ``<!-- reasons:NAME:end -->`` (NAME: ``ready``,
``autoscaling``, ``events``); ``tests/unit/hack/test_reasons_doc.py`` fails when they differ.
Regenerate with::

    .venv/bin/python hack/reasons.py --write
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from kubeinfer.operator import conditions
from kubeinfer.operator.conditions import Reason

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `from hack import apiref` (appended: operator/
    sys.path.append(str(ROOT))  # must not shadow the standard library's operator module)
from hack import apiref  # noqa: E402

DOC = ROOT / "docs" / "troubleshooting.md"
COMMAND = ".venv/bin/python hack/reasons.py --write"


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of the table ``name`` in the doc."""
    return f"<!-- reasons:{name}:begin -->", f"<!-- reasons:{name}:end -->"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _names(reasons: Iterable[Reason]) -> str:
    return ", ".join(f"`{r.name}`" + (f" {r.label}" if r.label else "") for r in reasons)


def _row(*cells: str) -> str:
    return "|" + "|".join(f" {_cell(c)} " if c else " " for c in cells) + "|"


def _rows(reasons: Iterable[Reason]) -> list[str]:
    """One row per run of entries that share status, meaning and action (named together)."""
    out = []
    for (status, meaning, action), group in itertools.groupby(
        reasons, key=lambda r: (r.status, r.meaning, r.action)
    ):
        out.append(_row(f"{status} {_names(group)}", meaning, action))
    return out


def _words(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def render_ready() -> str:
    """The ``Ready`` reasons: the table, then which False reasons do not set ``Stalled``."""
    ready = conditions.reasons_of(conditions.CONDITION_READY)
    calm = [r.name for r in ready if r.status == "False" and not conditions.sets_stalled(r.name)]
    out = [
        "| Status / reason | Meaning | What to do |",
        "|---|---|---|",
        *_rows(ready),
        "",
        f"Every False reason except {_words(calm)} also sets `Stalled=True` with the same reason and "
        "message.",
    ]
    return "\n".join(out) + "\n"


def render_autoscaling() -> str:
    """The ``AutoscalingActive`` reasons: True ``Active``, True with a kind of hold, False."""
    out = [
        "| Status / reason | Meaning | What to do |",
        "|---|---|---|",
        *_rows(conditions.reasons_of(conditions.CONDITION_AUTOSCALING_ACTIVE)),
    ]
    return "\n".join(out) + "\n"


def render_scale_to_zero() -> str:
    """The ``ScaleToZero`` reasons (the condition is present only with ``minReplicas: 0``)."""
    out = [
        "| Status / reason | Meaning | What to do |",
        "|---|---|---|",
        *_rows(conditions.reasons_of(conditions.CONDITION_SCALE_TO_ZERO)),
    ]
    return "\n".join(out) + "\n"


def render_events() -> str:
    """The Events: the registry's, and those of the Ready transitions (their reason is Ready's)."""
    expected = [r.name for r in conditions.reasons_of(conditions.CONDITION_READY, "False") if r.expected]
    normal = [_row(e.type, f"`{e.name}`", e.meaning) for e in conditions.EVENTS if e.type == "Normal"]
    warning = [_row(e.type, f"`{e.name}`", e.meaning) for e in conditions.EVENTS if e.type == "Warning"]
    out = [
        "| Type | Reason | Meaning |",
        "|---|---|---|",
        *normal,
        _row("Normal", "the `Ready` reason", "`Ready` turning true again after a fault (with its reason)"),
        _row(
            "Warning",
            "a fault's `Ready` reason",
            "`Ready` turning false with a fault's reason (the table above; never during a healthy start-up "
            f"or rollout: {_words(expected)})",
        ),
        *warning,
    ]
    return "\n".join(out) + "\n"


#: The doc's tables by marker name.
TABLES: dict[str, Callable[[], str]] = {
    "ready": render_ready,
    "autoscaling": render_autoscaling,
    "scale-to-zero": render_scale_to_zero,
    "events": render_events,
}


def splice(doc: str, name: str, body: str) -> str:
    """Replace the text between the markers of the table ``name`` in ``doc`` with ``body``
    (:func:`hack.apiref.splice`). Raises ValueError if they are absent."""
    begin, end = markers(name)
    return apiref.splice(doc, body, begin, end, doc_name="docs/troubleshooting.md")


def render_doc(doc: str) -> str:
    """``doc`` (docs/troubleshooting.md's text) with every table rendered from the registry."""
    for name, render in TABLES.items():
        doc = splice(doc, name, render())
    return doc


def main(argv: list[str] | None = None) -> int:
    """Print the rendered doc, or with ``--write`` update docs/troubleshooting.md in place."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="update docs/troubleshooting.md in place")
    args = ap.parse_args(argv)
    text = render_doc(DOC.read_text())
    if args.write:
        DOC.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
