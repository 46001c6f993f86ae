"""The registry of model source schemes: one row (:class:`SourceScheme`) per scheme of ``spec.model.uri``
and ``kubeinfer-runtime fetch --source``, from which both sides derive everything they know of a scheme.

The operator derives the CRD's ``pattern`` of ``spec.model.uri`` (:func:`model_uri_pattern`) and of
``spec.quantization.calibration.uri`` (:func:`data_uri_pattern`), the CEL and pydantic rules saying
which setting (``sha256``, ``s3``, ...) a scheme takes (:func:`schemes_taking`, :func:`cel_scheme_test`),
whether a fetch init container runs (:attr:`SourceScheme.fetched`) and its credential variables
(:attr:`SourceScheme.credentials`), which schemes a ModelPool's pods mount for their models
(:attr:`SourceScheme.pooled`, :func:`pooled_schemes`). The runtime derives its list of schemes, the
parse of a URI (:attr:`SourceScheme.parser`) and the fetch dispatch (:attr:`SourceScheme.backend`, or
why a mounted source is not fetched: :attr:`SourceScheme.mounted`).

Pure: standard library only, nothing of the operator or the runtime. The parser and the backend are
import paths (``"module:function"``) that the runtime imports when it uses them.

Adding a scheme is one :func:`register` call (a row here for a scheme of the project, in a test for a
toy one); the grammars must read the same in Python's ``re`` and in RE2 (the API server's CEL and the
CRD's ``pattern``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: The model URI of the bundled model (not a scheme: nothing to fetch or mount).
BUNDLED = "default"
#: The grammar of a path in the runtime image, a model URI or data reference without a scheme.
PATH_PATTERN = "/.*"
#: The settings of a source object (spec.model, spec.quantization.calibration) that only some schemes
#: take, by their names in the API.
SETTINGS = ("sha256", "s3", "hf", "credentials", "fetch", "caBundle")
#: The runtime's parser of a scheme that names none of its own: the URI kept whole, with its scheme and
#: the rest after ``://``.
GENERIC_PARSER = "kubeinfer.runtime.fetch.source:parse_generic"
#: The fetch init container's variable holding an https/http source's bearer token.
FETCH_BEARER_TOKEN_ENV = "KUBEINFER_FETCH_BEARER_TOKEN"

#: A scheme name: lowercase letters and digits (so it needs no escaping in a regex or a CEL string).
_NAME = re.compile(r"^[a-z][a-z0-9]*$")
#: An import path, ``package.module:attribute``.
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Credential:
    """A credential variable of the fetch init container: ``env`` (its name in the container) comes
    from the key ``key`` of the source's Secret (``credentials.secretName``); ``optional``: the pod
    starts without that key."""

    env: str
    key: str
    optional: bool = False


@dataclass(frozen=True)
class SourceScheme:
    """One scheme of a model source: what the operator and the runtime know of it.

    - ``name``: the scheme, e.g. ``s3`` (lowercase letters and digits).
    - ``uri_pattern``: the grammar of a model URI of the scheme after ``name://`` (unanchored).
    - ``data_pattern``: the same for a data (calibration file) reference; ``None``: the scheme serves
      no data reference.
    - ``mounted``: how a source that is not fetched reaches the runtime, in the words of the fetch's
      refusal (``"a PersistentVolumeClaim, mounted by the operator"``); ``""`` for a fetched scheme.
    - ``settings``: the settings of :data:`SETTINGS` the scheme takes (``fetch``: exactly the fetched).
    - ``credentials``: the fetch init container's credential variables (none: the scheme's Secret, if
      it takes one, is used otherwise, e.g. an oci:// image's pull secret).
    - ``parser``: the runtime's parse of a URI of the scheme, an import path of a function
      ``(uri, scheme, rest) -> Source`` raising ``ValueError``; default :data:`GENERIC_PARSER`.
    - ``backend``: the runtime's fetch of a parsed source, an import path of a function
      ``(source, Context) -> Fetched``; ``""`` for a mounted scheme.
    - ``pooled``: a ModelPool's pods mount a source of the scheme for the models on the pool (a mounted
      scheme whose volume the pool's models share, e.g. a claim mounted once for all the models on it),
      so a pooled InferenceService may name it; only a mounted scheme.

    Raises:
        ValueError: a field out of its form (a bad name, a grammar Python cannot compile, an unknown
            setting, a row both or neither fetched and mounted, ``fetch`` not exactly on the fetched,
            an import path that is not ``module:attribute``, a fetched row pooled).
    """

    name: str
    uri_pattern: str
    data_pattern: str | None = None
    mounted: str = ""
    settings: tuple[str, ...] = ()
    credentials: tuple[Credential, ...] = ()
    parser: str = GENERIC_PARSER
    backend: str = ""
    pooled: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"scheme {self.name!r}: a name is lowercase letters and digits")
        for grammar in (self.uri_pattern, self.data_pattern):
            try:
                re.compile(grammar or "")
            except re.error as exc:
                raise ValueError(f"scheme {self.name!r}: grammar {grammar!r}: {exc}") from exc
        unknown = sorted(set(self.settings) - set(SETTINGS))
        if unknown:
            raise ValueError(f"scheme {self.name!r}: unknown settings {unknown}; known: {SETTINGS}")
        if bool(self.backend) == bool(self.mounted):
            raise ValueError(f"scheme {self.name!r}: either a backend (fetched) or how it is mounted")
        if ("fetch" in self.settings) != self.fetched:
            raise ValueError(f"scheme {self.name!r}: takes the fetch setting exactly when fetched")
        if self.pooled and self.fetched:
            raise ValueError(f"scheme {self.name!r}: only a mounted scheme is pooled (a pool fetches none)")
        for path in (self.parser, self.backend):
            if path and not _IMPORT_PATH.match(path):
                raise ValueError(f"scheme {self.name!r}: {path!r} is not an import path module:attribute")

    @property
    def fetched(self) -> bool:
        """Whether the fetch init container downloads a source of the scheme (it has a backend)."""
        return bool(self.backend)


_REGISTRY: dict[str, SourceScheme] = {}


def register(row: SourceScheme) -> SourceScheme:
    """Add ``row`` to the registry, after the rows there (the order of the alternations and lists
    derived from it); returns it.

    Raises:
        ValueError: a row of that name is registered already.
    """
    if row.name in _REGISTRY:
        raise ValueError(f"scheme {row.name!r} is registered already")
    _REGISTRY[row.name] = row
    return row


def unregister(name: str) -> SourceScheme:
    """Remove the row of the scheme ``name`` (a test's toy scheme) and return it.

    Raises:
        KeyError: no row of that name.
    """
    return _REGISTRY.pop(name)


def schemes() -> tuple[SourceScheme, ...]:
    """Every row, in the registry's order."""
    return tuple(_REGISTRY.values())


def scheme_named(name: str) -> SourceScheme | None:
    """The row of the scheme ``name`` (as written in a URI, any case); ``None`` when there is none."""
    return _REGISTRY.get(name.lower())


def scheme(name: str) -> SourceScheme:
    """The row of the scheme ``name``.

    Raises:
        KeyError: no row of that name.
    """
    row = scheme_named(name)
    if row is None:
        raise KeyError(name)
    return row


def scheme_of(uri: str) -> SourceScheme | None:
    """The row of ``uri``'s scheme (``s3://b/k`` -> the s3 row); ``None`` for ``default``, a path or a
    scheme without a row. Looks at the scheme only: the URI is not checked against its grammar."""
    name, sep, _ = uri.partition("://")
    return scheme_named(name) if sep else None


def fetched_schemes() -> tuple[str, ...]:
    """The names of the schemes the fetch init container downloads, in the registry's order."""
    return tuple(r.name for r in _REGISTRY.values() if r.fetched)


def mounted_schemes() -> tuple[str, ...]:
    """The names of the schemes mounted into the pod (not fetched), in the registry's order."""
    return tuple(r.name for r in _REGISTRY.values() if not r.fetched)


def pooled_schemes() -> tuple[str, ...]:
    """The names of the schemes a ModelPool's pods mount for their models (:attr:`SourceScheme.pooled`),
    in the registry's order."""
    return tuple(r.name for r in _REGISTRY.values() if r.pooled)


def schemes_taking(setting: str, *, data: bool = False) -> tuple[str, ...]:
    """The names of the schemes that take ``setting`` (one of :data:`SETTINGS`), in the registry's
    order; ``data``: only those that serve a data reference.

    Raises:
        ValueError: ``setting`` is not one of :data:`SETTINGS`.
    """
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; known: {SETTINGS}")
    return tuple(
        r.name
        for r in _REGISTRY.values()
        if setting in r.settings and (not data or r.data_pattern is not None)
    )


def credential_env_names() -> tuple[str, ...]:
    """The names of every scheme's credential variables, each once, in the registry's order."""
    return tuple(dict.fromkeys(c.env for r in _REGISTRY.values() for c in r.credentials))


def scheme_regex(names: Iterable[str]) -> str:
    """A regex matching exactly the scheme names ``names`` (in their order): a name and the same with a
    trailing ``s`` next to each other become one (``https``, ``http`` -> ``https?``); several
    alternatives are grouped (``(s3|https?|hf)``)."""
    alternatives = _alternatives(list(names))
    return alternatives[0] if len(alternatives) == 1 else f"({'|'.join(alternatives)})"


def cel_scheme_test(names: Iterable[str], value: str = "self.uri") -> str:
    """CEL true when the string ``value`` is a URI of one of the schemes ``names``:
    ``self.uri.startsWith('s3://')`` for one, ``self.uri.matches('^(s3|https?)://')`` for several."""
    listed = list(names)
    if len(listed) == 1:
        return f"{value}.startsWith('{listed[0]}://')"
    return f"{value}.matches('^{scheme_regex(listed)}://')"


def model_uri_pattern() -> str:
    """The anchored grammar of a model URI: ``default``, a path, or a URI of a registered scheme (the
    schemes of neighbouring rows with the same grammar share one alternative, ``https?://...``)."""
    parts = _grouped((r.name, r.uri_pattern) for r in _REGISTRY.values())
    return f"^({'|'.join((BUNDLED, PATH_PATTERN, *parts))})$"


def data_uri_pattern() -> str:
    """The anchored grammar of a data reference: a path, or a URI of a scheme that serves one."""
    parts = _grouped((r.name, r.data_pattern) for r in _REGISTRY.values() if r.data_pattern is not None)
    return f"^({'|'.join((PATH_PATTERN, *parts))})$"


def _alternatives(names: list[str]) -> list[str]:
    """``names`` with each neighbouring pair ``x``, ``xs`` (either order) made one ``xs?``."""
    out: list[str] = []
    i = 0
    while i < len(names):
        a, b = names[i], names[i + 1] if i + 1 < len(names) else ""
        if b and (a == f"{b}s" or b == f"{a}s"):
            out.append(f"{min(a, b, key=len)}s?")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def _grouped(rows: Iterable[tuple[str, str]]) -> list[str]:
    """``scheme://grammar`` alternatives of ``(name, grammar)`` rows, neighbours with the same grammar
    sharing one (``https``, ``http`` -> ``https?://grammar``)."""
    groups: list[tuple[list[str], str]] = []
    for name, grammar in rows:
        if groups and groups[-1][1] == grammar:
            groups[-1][0].append(name)
        else:
            groups.append(([name], grammar))
    return [f"{scheme_regex(names)}://{grammar}" for names, grammar in groups]


# --- the schemes ---------------------------------------------------------------------------------
# The order is the order of the CRD's alternations and CEL lists (pvc first, as they always were);
# the runtime lists the fetched schemes first. ``$`` is allowed in paths: the fetch init container's
# arguments escape it (``$$``), so that the kubelet expands no ``$(VAR)`` of its environment into them.

#: An http(s) URL of a file without userinfo (no ``user:password@``: a credential would be in the spec
#: and in the pod's arguments; the bearer token comes from the credentials): its path ends in a file
#: name that is not hidden (the fetch names the file after it), no ``@`` before the query.
_HTTP = r"[^/?#@\s]+/([^?#@\s]*/)?[^/?#@\s.][^/?#@\s]*([?#][^\s]*)?"
#: A data file over http(s): the path ends in a file name.
_HTTP_DATA = r"[^/?#@\s]+/([^?#\s]*/)?[^/?#\s]+([?#][^\s]*)?"
_HTTP_CREDENTIALS = (Credential(FETCH_BEARER_TOKEN_ENV, "BEARER_TOKEN"),)

register(
    SourceScheme(
        name="pvc",
        # a claim (a DNS-1123 label), then a path in it
        uri_pattern=r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+",
        data_pattern=r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+",
        mounted="a PersistentVolumeClaim, mounted by the operator",
        parser="kubeinfer.runtime.fetch.source:parse_pvc",
        # a pool's pods mount each claim its models name, read-only, where an InferenceService's own do
        pooled=True,
    )
)
register(
    SourceScheme(
        name="s3",
        # a bucket name (3-63 of lowercase letters, digits, dots, hyphens), then an optional key or prefix
        uri_pattern=r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?",
        # a data file: a key ending in a name
        data_pattern=r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/(.*/)?[^/]+",
        settings=("sha256", "s3", "credentials", "fetch", "caBundle"),
        credentials=(
            Credential("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            Credential("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            Credential("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN", optional=True),
        ),
        parser="kubeinfer.runtime.fetch.source:parse_s3",
        backend="kubeinfer.runtime.fetch.s3:fetch_s3",
    )
)
register(
    SourceScheme(
        name="https",
        uri_pattern=_HTTP,
        data_pattern=_HTTP_DATA,
        settings=("sha256", "credentials", "fetch", "caBundle"),
        credentials=_HTTP_CREDENTIALS,
        parser="kubeinfer.runtime.fetch.source:parse_http",
        backend="kubeinfer.runtime.fetch.http:fetch_http",
    )
)
register(
    SourceScheme(
        name="http",
        uri_pattern=_HTTP,
        data_pattern=_HTTP_DATA,
        # no caBundle: plain http has no TLS
        settings=("sha256", "credentials", "fetch"),
        credentials=_HTTP_CREDENTIALS,
        parser="kubeinfer.runtime.fetch.source:parse_http",
        backend="kubeinfer.runtime.fetch.http:fetch_http",
    )
)
register(
    SourceScheme(
        name="hf",
        # org/repo with an optional @revision (a branch, tag or commit)
        uri_pattern=r"[A-Za-z0-9][-A-Za-z0-9_.]{0,95}/[A-Za-z0-9][-A-Za-z0-9_.]{0,95}"
        r"(@[A-Za-z0-9][-A-Za-z0-9_./]{0,254})?",
        # no sha256: a repository is pinned by its revision
        settings=("hf", "credentials", "fetch", "caBundle"),
        credentials=(Credential("HF_TOKEN", "HF_TOKEN"),),
        parser="kubeinfer.runtime.fetch.source:parse_hf",
        backend="kubeinfer.runtime.fetch.hf:fetch_hf",
    )
)
register(
    SourceScheme(
        name="oci",
        # registry/repo:tag or registry/repo@sha256:<64 hex>: a registry host (with a dot or a port, or
        # localhost: a bare first component would be read as a Docker Hub namespace) and a tag or a
        # digest (no implicit latest)
        uri_pattern=r"((localhost|[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)+)(:[0-9]{1,5})?|[a-zA-Z0-9-]+:[0-9]{1,5})"
        r"(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})",
        mounted="an image, mounted as an image volume",
        # credentials: the pod's imagePullSecrets, no variable
        settings=("credentials",),
        parser="kubeinfer.runtime.fetch.source:parse_oci",
    )
)
