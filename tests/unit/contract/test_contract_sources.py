"""The registry of model source schemes (kubeinfer.contract.sources): the operator's grammars, CEL and
credential env and the runtime's parse and fetch dispatch come from its rows; a scheme registered in a
test (one row, one backend function here) is in the CRD's pattern and is fetched, no other file changed."""

from __future__ import annotations

import ast
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api, crdgen
from kubeinfer.operator.builders import source as builders_source
from kubeinfer.runtime.fetch import FetchOptions
from kubeinfer.runtime.fetch.context import Context, Fetched
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.run import fetch
from kubeinfer.runtime.fetch.source import SCHEMES, GenericSource, parse_source

from kubeinfer.contract import sources as contract
from kubeinfer.contract.sources import Credential, SourceScheme

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[3]
TOY_URI = "toy://shelf/bert.v1"


def fetch_toy(source: GenericSource, ctx: Context) -> Fetched:
    """The toy scheme's backend: one file naming what follows ``toy://``."""
    body = f"a toy model from {source.rest}\n".encode()
    (ctx.dest / "model.txt").write_bytes(body)
    return Fetched(files=1, bytes=len(body))


def _toy_row(**changes: Any) -> SourceScheme:
    fields: dict[str, Any] = {
        "name": "toy",
        "uri_pattern": r"[a-z]+/[a-z0-9.]+",
        "settings": ("credentials", "fetch"),
        "credentials": (Credential("TOY_TOKEN", "TOKEN"),),
        "backend": f"{__name__}:fetch_toy",
    }
    return SourceScheme(**{**fields, **changes})


def _crd_uri_pattern() -> str:
    crd = crdgen.inference_service_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pattern: str = schema["properties"]["spec"]["properties"]["model"]["properties"]["uri"]["pattern"]
    return pattern


def test_the_operator_names_are_the_registry_s() -> None:
    assert api.MODEL_URI_PATTERN == contract.model_uri_pattern() == _crd_uri_pattern()
    assert contract.data_uri_pattern() == api.DATA_URI_PATTERN
    assert api.FETCHED_SCHEMES == contract.fetched_schemes() == ("s3", "https", "http", "hf")
    assert SCHEMES == ("s3", "https", "http", "hf", "pvc", "oci")
    # the CEL of each setting, as the CRD has always had it
    cel = {name: contract.cel_scheme_test(contract.schemes_taking(name)) for name in contract.SETTINGS}
    assert cel == {
        "sha256": "self.uri.matches('^(s3|https?)://')",
        "s3": "self.uri.startsWith('s3://')",
        "hf": "self.uri.startsWith('hf://')",
        "credentials": "self.uri.matches('^(s3|https?|hf|oci)://')",
        "fetch": "self.uri.matches('^(s3|https?|hf)://')",
        "caBundle": "self.uri.matches('^(s3|https|hf)://')",
    }
    assert contract.schemes_taking("caBundle", data=True) == ("s3", "https")


def test_the_credential_env_is_the_row_s() -> None:
    env = builders_source.credential_env("s3://b/k", api.CredentialsSpec(secret_name="creds"))
    assert [(e["name"], e["valueFrom"]["secretKeyRef"]["optional"]) for e in env] == [
        ("AWS_ACCESS_KEY_ID", False),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("AWS_SESSION_TOKEN", True),
    ]
    assert builders_source.credential_env("oci://r.io/m:1", api.CredentialsSpec(secret_name="c")) == []
    assert builders_source.credential_env("/models/m", api.CredentialsSpec(secret_name="c")) == []


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"name": "Toy"}, "lowercase letters and digits"),
        ({"name": "a+b"}, "lowercase letters and digits"),
        ({"uri_pattern": "(unclosed"}, "missing"),
        ({"settings": ("fetch", "colour")}, "unknown settings"),
        ({"mounted": "a toy volume"}, "either a backend"),
        ({"backend": ""}, "either a backend"),
        ({"settings": ()}, "fetch setting exactly when fetched"),
        ({"backend": "no_colon"}, "not an import path"),
    ],
)
def test_a_row_out_of_its_form_is_refused(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        _toy_row(**changes)


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        contract.register(_toy_row(name="s3"))
    with pytest.raises(KeyError):
        contract.unregister("toy")


def test_a_scheme_registered_in_a_test_is_in_the_crd_and_is_fetched(tmp_path: Path) -> None:
    assert not re.match(_crd_uri_pattern(), TOY_URI)
    contract.register(_toy_row())
    try:
        # the operator: the CRD made now has its grammar; it is fetched, with its credential variable
        assert re.match(_crd_uri_pattern(), TOY_URI)
        assert api.is_fetched(TOY_URI)
        env = builders_source.credential_env(TOY_URI, api.CredentialsSpec(secret_name="toy-creds"))
        assert [(e["name"], e["valueFrom"]["secretKeyRef"]["key"]) for e in env] == [("TOY_TOKEN", "TOKEN")]
        # the runtime: parsed by the generic parser, fetched by the backend above
        assert parse_source(TOY_URI) == GenericSource(uri=TOY_URI, scheme="toy", rest="shelf/bert.v1")
        out = io.StringIO()
        options = FetchOptions(s3_endpoint="https://minio.example.com")
        report = fetch(TOY_URI, tmp_path / "model", options, env={}, stream=out)
        assert (tmp_path / "model" / "model.txt").read_text() == "a toy model from shelf/bert.v1\n"
        assert (report.source, report.files) == (TOY_URI, 1)
        assert "--s3-endpoint does not apply to this source; ignored" in out.getvalue()
    finally:
        contract.unregister("toy")
    assert not re.match(_crd_uri_pattern(), TOY_URI)
    assert not api.is_fetched(TOY_URI)
    with pytest.raises(ValueError, match=r"unsupported scheme 'toy'; expected one of s3, https, http, hf"):
        parse_source(TOY_URI)


def test_a_mounted_scheme_is_not_fetched_and_says_how_it_is_mounted(tmp_path: Path) -> None:
    contract.register(_toy_row(name="toyvol", backend="", settings=(), mounted="a toy volume, mounted"))
    try:
        with pytest.raises(FetchError, match="a toy volume, mounted: nothing to fetch"):
            fetch("toyvol://shelf/bert", tmp_path, FetchOptions(), env={}, stream=io.StringIO())
    finally:
        contract.unregister("toyvol")


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            out.append(str(node.module))
    return out


def test_the_contract_imports_only_the_standard_library() -> None:
    modules = sorted((ROOT / "kubeinfer" / "contract").glob("*.py"))
    imported = [m for path in modules for m in _imports(path)]
    # a module of the contract may use another (the format rules name the bundled model's URI)
    outside = [
        m
        for m in imported
        if m.split(".")[0] not in {*sys.stdlib_module_names, "__future__"}
        and not m.startswith("kubeinfer.contract")
    ]
    assert imported and outside == []


@pytest.mark.parametrize("side", ["operator", "runtime", "activator"])
def test_both_sides_import_the_contract(side: str) -> None:
    importers = [
        path.relative_to(ROOT)
        for path in sorted((ROOT / side).rglob("*.py"))
        if any(m.startswith("kubeinfer.contract") for m in _imports(path))
    ]
    assert importers, f"nothing under {side}/ imports kubeinfer.contract"
