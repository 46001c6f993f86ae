"""Pure parts of hack/images.py: Dockerfile parsing, .dockerignore matching, the hash of an image's
inputs and what triggers a rebuild. No buildah, no containerd."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hack import images

ROOT = Path(__file__).resolve().parents[3]


def test_instructions_join_continuations_and_drop_comments() -> None:
    text = "ARG X=1\n# comment\nRUN a \\\n    # inner comment\n    && b\ncopy src dst\n"
    assert images.dockerfile_instructions(text) == [("ARG", "X=1"), ("RUN", "a && b"), ("COPY", "src dst")]


def test_context_sources_skip_from_stages_and_flags() -> None:
    text = (
        "FROM x AS build\n"
        "COPY pyproject.toml README.md ./\n"
        "COPY --chown=1:1 ./kubeinfer ./kubeinfer\n"
        'ADD ["operator", "/src/operator"]\n'
        "COPY --from=build /opt/kubeinfer /opt/kubeinfer\n"
    )
    assert images.context_sources(text) == ["pyproject.toml", "README.md", "kubeinfer", "operator"]


@pytest.mark.parametrize(
    "text",
    ["ADD https://example.com/x.tar /x\n", "RUN --mount=type=bind,target=/src make\n"],
)
def test_context_sources_refuse_what_the_hash_cannot_follow(text: str) -> None:
    with pytest.raises(ValueError):
        images.context_sources(text)


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        (".git/config", True),
        ("runtime/__pycache__/x.pyc", True),  # **/__pycache__ excludes the directory's contents
        ("runtime/models/x.pyc", True),
        ("runtime/models/base.py", False),
        ("kubeinfer.egg-info/PKG-INFO", True),
        ("tests/unit/x.py", True),
        ("tests/keep.txt", False),  # re-included by "!"
        ("README.md", False),
    ],
)
def test_dockerignore_matching(path: str, ignored: bool) -> None:
    patterns = images.parse_dockerignore(
        "# comment\n.git\n**/__pycache__\n**/*.pyc\n*.egg-info\n/tests\n!tests/keep.txt\n"
    )
    assert images.is_ignored(path, patterns) is ignored


def test_repository_dockerfiles_hash_only_what_they_copy() -> None:
    """The real Dockerfiles: their inputs are the files they COPY, without caches or tests."""
    for dockerfile in ("operator/Dockerfile", "runtime/Dockerfile"):
        names = [n for n, _ in images.dockerfile_inputs(ROOT, dockerfile, {"BASE_IMAGE": "b"})]
        files = [n.removeprefix("file:") for n in names if n.startswith("file:")]
        assert "pyproject.toml" in files and "runtime/config.py" in files and "operator/main.py" in files
        assert not [f for f in files if "__pycache__" in f or f.startswith(("tests/", ".venv/", "hack/"))]


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "pkg").mkdir(parents=True)
    (ctx / "pkg" / "a.py").write_text("a = 1\n")
    (ctx / "pkg" / "__pycache__").mkdir()
    (ctx / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (ctx / "notes.txt").write_text("not copied\n")
    (ctx / ".dockerignore").write_text("**/__pycache__\n")
    (ctx / "Dockerfile").write_text("ARG BASE_IMAGE=x\nFROM ${BASE_IMAGE}\nCOPY pkg /pkg\n")
    return ctx


def _hash(ctx: Path, base: str = "b") -> str:
    return images.hash_inputs(images.dockerfile_inputs(ctx, "Dockerfile", {"BASE_IMAGE": base}))


def test_hash_changes_with_what_the_build_uses(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    first = _hash(ctx)
    assert _hash(ctx) == first  # deterministic

    # not a trigger: files the build does not copy, ignored files, timestamps
    (ctx / "notes.txt").write_text("changed\n")
    (ctx / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\1")
    (ctx / "pkg" / "a.py").touch()
    assert _hash(ctx) == first

    # triggers: a copied file's content, a new copied file, its executable bit, a build arg,
    # the Dockerfile, the .dockerignore
    changes = []
    (ctx / "pkg" / "a.py").write_text("a = 2\n")
    changes.append(_hash(ctx))
    (ctx / "pkg" / "b.py").write_text("")
    changes.append(_hash(ctx))
    (ctx / "pkg" / "b.py").chmod(0o755)
    changes.append(_hash(ctx))
    changes.append(_hash(ctx, base="other"))
    (ctx / "Dockerfile").write_text((ctx / "Dockerfile").read_text() + "USER 65532\n")
    changes.append(_hash(ctx))
    (ctx / ".dockerignore").write_text("**/__pycache__\nnotes.txt\n")
    changes.append(_hash(ctx))
    assert len({first, *changes}) == len(changes) + 1


def test_hash_does_not_depend_on_where_the_context_is(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    moved = shutil.copytree(ctx, tmp_path / "elsewhere")
    assert _hash(ctx) == _hash(moved)


def test_hash_inputs_is_order_independent_and_unambiguous() -> None:
    assert images.hash_inputs([("a", b"1"), ("b", b"2")]) == images.hash_inputs([("b", b"2"), ("a", b"1")])
    # moving bytes between a name and a content changes the hash
    assert images.hash_inputs([("ab", b"c")]) != images.hash_inputs([("a", b"bc")])
    with pytest.raises(ValueError):
        images.hash_inputs([("a", b"1"), ("a", b"2")])


def test_a_new_base_rebuilds_the_images_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = images.IMAGES["operator"]
    before = images.hash_inputs(images.inputs(operator, ROOT))
    monkeypatch.setattr(images, "BASE_PACKAGES", (*images.BASE_PACKAGES, "curl"))
    assert images.hash_inputs(images.inputs(operator, ROOT)) != before


@pytest.mark.parametrize(
    ("existing", "force", "expected"),
    [(None, False, True), ("old", False, True), ("h", False, False), ("h", True, True)],
)
def test_needs_build(existing: str | None, force: bool, expected: bool) -> None:
    assert images.needs_build("h", existing, force=force) is expected


def test_missing_copy_source_is_an_error(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    (ctx / "Dockerfile").write_text("FROM x\nCOPY missing /m\n")
    with pytest.raises(FileNotFoundError):
        images.dockerfile_inputs(ctx, "Dockerfile", {})


def test_parse_ctr_images() -> None:
    out = (
        "REF                               TYPE                                       DIGEST"
        "                                                                  SIZE      PLATFORMS   LABELS\n"
        "ghcr.io/kubeinfer/runtime:0.1.0   application/vnd.docker.distribution.manifest.v2+json "
        "sha256:abc 5.1 GiB linux/amd64 io.cri-containerd.pinned=pinned,io.kubeinfer.inputs-hash=h1\n"
        "registry.k8s.io/pause:3.10        application/vnd.oci.image.manifest.v1+json "
        "sha256:def 310.2 KiB linux/amd64 -\n"
    )
    assert images.parse_ctr_images(out) == {
        "ghcr.io/kubeinfer/runtime:0.1.0": {
            "digest": "sha256:abc",
            "io.cri-containerd.pinned": "pinned",
            images.HASH_LABEL: "h1",
        },
        "registry.k8s.io/pause:3.10": {"digest": "sha256:def"},
    }


def test_parse_size() -> None:
    assert images._parse_size("1.23 GB") == 1_230_000_000
    assert images._parse_size("310 kB") == 310_000
    assert images._parse_size("?") == 0


def test_pinned_requirements() -> None:
    text = (
        "FROM x\nRUN pip install a\n"
        'RUN --mount=type=cache,target=/root/.cache/pip \\\n  /v/bin/pip install "torch==2.15.0" \\\n'
        '  \'PyYAML==6.0.4\' "kopf>=1" "torch==2.15.0"\n'
        'RUN echo "not==1.0"\n'
    )
    assert images.pinned_requirements(text) == ["torch==2.15.0", "PyYAML==6.0.4"]


def test_requirement_files() -> None:
    text = (
        "FROM x\nCOPY requirements/runtime.txt ./requirements/\n"
        "RUN --mount=type=cache,target=/root/.cache/pip \\\n  /v/bin/pip install --require-hashes \\\n"
        "  -r requirements/runtime.txt --requirement=extra.txt && echo -r not-pip.txt\n"
        "RUN /v/bin/pip install --no-deps .\n"
    )
    assert images.requirement_files(text) == ["requirements/runtime.txt", "extra.txt"]
    assert images.requirement_files((ROOT / "operator" / "Dockerfile").read_text()) == [
        "requirements/operator.txt"
    ]


def test_build_pip_conf_passes_where_from_not_what() -> None:
    listing = (
        ":env:.cert='/etc/ssl/certs/ca-certificates.crt'\n"
        ":env:.find-links='/opt/wheels'\n"  # a host path: not passed
        ":env:.no-cache-dir='1'\n"
        "global.index-url='https://mirror.example/simple'\n"
        ":env:.index-url='https://env.example/simple'\n"  # the environment wins, as in pip
    )
    text, files = images.build_pip_conf(listing, "/kubeinfer-wheelhouse", no_index=True)
    assert text == (
        "[global]\n"
        "cert = /etc/ssl/certs/ca-certificates.crt\n"
        "find-links = /kubeinfer-wheelhouse\n"
        "index-url = https://env.example/simple\n"
        "no-index = true\n"
    )
    assert files == ["/etc/ssl/certs/ca-certificates.crt"]


def test_stale_intermediates_keep_the_layer_cache_of_tagged_images() -> None:
    store = [
        ("base", True, ["b"]),
        ("env", False, ["b"]),  # metadata step on the base: a prefix, kept
        ("deps", False, ["b", "torch"]),  # the dependency layer of the tagged image: kept
        ("src", False, ["b", "torch", "src2"]),
        ("runtime", True, ["b", "torch", "src2", "label"]),
        ("old-src", False, ["b", "torch", "src1"]),  # the previous source layer: stale
        ("old-deps", False, ["b", "torch-old"]),  # a replaced dependency layer: stale
        ("old-final", False, ["b", "torch-old", "src0"]),
    ]
    assert images.stale_intermediates(store) == ["old-src", "old-deps", "old-final"]


def test_stale_image_ids_are_the_id_refs_no_tag_points_at() -> None:
    listed = {
        "ghcr.io/kubeinfer/runtime:0.1.0": {"digest": "sha256:new"},
        "sha256:1111": {"digest": "sha256:new"},  # the current image's ID ref: kept
        "sha256:2222": {"digest": "sha256:old"},  # left by a re-import: holds the old layers
        "registry.k8s.io/pause:3.10": {"digest": "sha256:p"},
        "sha256:3333": {"digest": "sha256:p"},
    }
    assert images.stale_image_ids(listed) == ["sha256:2222"]
    assert images.stale_image_ids({}) == []
