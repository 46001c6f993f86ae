#!/usr/bin/env python3
"""Render the InferenceService field reference (markdown) from the generated CRD.

The CRD (``crds/inferenceservices.kubeinfer.io.yaml``, written by ``make crds`` from
``operator/api/``) is what the API server validates against, so the reference is taken from it:
every ``spec`` field with its type, default, validation and description, then the cross-field CEL
rules. docs/api.md embeds the output between ``<!-- apiref:begin -->`` and ``<!-- apiref:end -->``;
``tests/unit/chart/test_chart_apiref.py`` fails when they differ. Regenerate with::

    .venv/bin/python hack/apiref.py --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "inferenceservices.kubeinfer.io.yaml"
API_DOC = ROOT / "docs" / "api.md"
BEGIN, END = "<!-- apiref:begin -->", "<!-- apiref:end -->"
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"


def _type(s: dict[str, Any]) -> str:
    t = s.get("type", "object")
    if s.get("pattern") == DURATION_PATTERN:
        return "duration"
    if t == "array":
        return f"[]{_type(s.get('items') or {})}"
    if t == "object" and "additionalProperties" in s:
        return f"map[string]{_type(s['additionalProperties'])}"
    if s.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    return str(t)


def _range(lo: Any, hi: Any) -> str | None:
    if lo is not None and hi is not None:
        return f"{lo}..{hi}"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return None


def _pattern(s: dict[str, Any]) -> str | None:
    if s.get("pattern") == DURATION_PATTERN:
        return "Go duration (`10ms`, `1.5s`, `5m`)"
    return f"pattern `{s['pattern']}`" if s.get("pattern") else None


def _items_range(s: dict[str, Any]) -> str | None:
    it = s.get("items") if "items" in s else None
    if it is None or it.get("type") not in ("integer", "number") or not ("minimum" in it or "maximum" in it):
        return None
    return f"items {it.get('minimum', '')}..{it.get('maximum', '')}"


def _validation(s: dict[str, Any]) -> str:
    parts = [" | ".join(f"`{v}`" for v in s["enum"])] if "enum" in s else []
    parts += [p for p in (_range(s.get("minimum"), s.get("maximum")), _pattern(s)) if p]
    for k, label in (("minLength", "min length"), ("minItems", "min items"), ("maxItems", "max items")):
        if k in s:
            parts.append(f"{label} {s[k]}")
    items = _items_range(s)
    return "; ".join([*parts, items] if items else parts)


def _default(s: dict[str, Any]) -> str:
    if "default" not in s or s.get("type") == "object":  # an object's defaults show on its fields
        return ""
    d = s["default"]
    if d == {} or d == []:
        return ""
    if d == "":
        return '`""`'
    return f"`{json.dumps(d)}`" if not isinstance(d, str) else f"`{d}`"


#: Units by field name (the last path element); durations and quantities are typed in the column.
UNITS = {
    "maxBatchSize": "rows",
    "preferredBatchSizes": "rows",
    "maxQueueSize": "requests",
    "steps": "passes over the batch sizes",
    "gpus": "GPUs per replica",
    "cpu": "cores (quantity) per replica",
    "memory": "bytes (quantity) per replica",
    "replicas": "replicas",
    "minReplicas": "replicas",
    "maxReplicas": "replicas",
    "maxScaleUpStep": "replicas per decision",
    "low": "ratio 0..1",
    "high": "ratio 0..1",
    "tolerance": "ratio",
    "planUtilization": "ratio",
    "tolerationSeconds": "seconds",
}


def _unit(name: str, s: dict[str, Any]) -> str:
    if s.get("pattern") == DURATION_PATTERN:
        return "time"
    return UNITS.get(name, "")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def walk(s: dict[str, Any], path: str, rows: list[str], rules: list[tuple[str, str]]) -> None:
    """Append one table row per field under ``s`` (depth first), and the CEL rules met on the way."""
    for r in s.get("x-kubernetes-validations") or []:
        rules.append((path, r["message"]))
    props = s.get("properties") or {}
    required = set(s.get("required") or [])
    for name, sub in props.items():
        p = f"{path}.{name}"
        req = " (required)" if name in required else ""
        desc = _cell((sub.get("description") or "").replace("``", "`"))
        rows.append(
            f"| `{p}`{req} | {_type(sub)} | {_unit(name, sub)} | {_default(sub)} | {_cell(_validation(sub))} "
            f"| {desc} |"
        )
        if sub.get("type") == "object" and sub.get("properties"):
            walk(sub, p, rows, rules)
        elif sub.get("type") == "array" and (sub.get("items") or {}).get("properties"):
            walk(sub["items"], f"{p}[]", rows, rules)


def render(crd_path: Path = CRD) -> str:
    """The markdown reference for ``spec`` (table + cross-field rules)."""
    crd = yaml.safe_load(crd_path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rows: list[str] = []
    rules: list[tuple[str, str]] = []
    walk(spec, "spec", rows, rules)
    out = [
        f"`{crd['spec']['group']}/{version['name']}`, kind `{crd['spec']['names']['kind']}` "
        f"(short name `{', '.join(crd['spec']['names'].get('shortNames') or [])}`), namespaced. "
        "Generated from the CRD by `hack/apiref.py`.",
        "",
        "| Field | Type | Unit | Default | Validation | Description |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Cross-field rules (CEL, enforced by the API server; the message names the field):",
        "",
        *[f"- {msg}" for _, msg in rules],
    ]
    return "\n".join(out) + "\n"


def splice(doc: str, body: str, begin: str = BEGIN, end: str = END, doc_name: str = "docs/api.md") -> str:
    """Replace the text between the markers ``begin`` and ``end`` in ``doc`` (the generated part of a
    doc: the API reference here, docs/troubleshooting.md's tables in hack/reasons.py) with ``body``.

    Raises:
        ValueError: a marker is absent (the message names ``doc_name`` and the markers).
    """
    try:
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
    except ValueError as e:
        raise ValueError(f"{doc_name} lacks the {begin} ... {end} markers") from e
    return f"{head}{begin}\n{body}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="update docs/api.md in place")
    args = ap.parse_args(argv)
    body = render()
    if args.write:
        API_DOC.write_text(splice(API_DOC.read_text(), body))
    else:
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
