#!/usr/bin/env python3
"""The images the local node runs: built with buildah, exported, loaded into containerd.

No image registry is reachable here, so every image is built on this machine:

- ``base``: ``localhost/kubeinfer/base:bookworm-python3``, a Debian bookworm ``minbase`` made by
  debootstrap from Debian packages (python3, python3-venv, ca-certificates), security updates
  applied. It stands in for the official ``python:3.11-slim-bookworm`` that the Dockerfiles name by
  default (their ``ARG BASE_IMAGE``).
- ``pause``: ``registry.k8s.io/pause:3.10``, containerd's sandbox image, from hack/pause/pause.c
  (a static binary in an image made from scratch; user 65535).
- ``operator``: ``ghcr.io/kubeinfer/operator:VERSION`` from operator/Dockerfile (the chart's
  appVersion).
- ``runtime``: ``ghcr.io/kubeinfer/runtime:VERSION`` from runtime/Dockerfile (the operator's
  DEFAULT_IMAGE).

VERSION is the kubeinfer package's version (pyproject.toml's ``project.version``, read from the
installed metadata). Installs torch with its CUDA libraries from PyPI: several GB.

An image is rebuilt only when the hash of its inputs changes: for a Dockerfile, the Dockerfile,
every file of the build context its COPY/ADD instructions use (after .dockerignore), the build
args and the hash of its base image; for base and pause, their recipe. The hash is the label
``io.kubeinfer.inputs-hash`` of the image in buildah's storage (``buildah images``). buildah's
``--layers`` cache then keeps a source change from reinstalling the dependencies (their layer comes
first). Downloads: the Dockerfiles' pip cache mount (``RUN --mount=type=cache``, kept by buildah
under /var/tmp/buildah-cache/) serves a rebuild where pip's HTTP cache works; this machine's proxy
strips Cache-Control, so pip caches nothing there, and the wheels of the requirement files the
Dockerfiles install (requirements/operator.txt, requirements/runtime.txt: the lock, see hack/lock.py)
are also downloaded once into .cache/images/wheels/ (a wheelhouse: when it holds them all, the build's
pip installs from it alone, with no index). The build's RUN steps
get the host's pip settings (index, CA bundle) by bind mounts, so nothing of the host is in a layer.

CLI::

    python hack/images.py build [NAME...] [--force]    # base, pause, operator, runtime (default: all)
    python hack/images.py list                         # refs, hashes, sizes, whether up to date
    python hack/images.py prune                        # intermediate images of replaced builds
    python hack/images.py export [NAME...]             # docker-archives under .cache/images/
    python hack/images.py load --ctr PATH --address SOCK [-n NAMESPACE] [NAME...]

Python API (hack/cluster.py)::

    from hack import images
    images.build()                                     # -> list[BuildResult]
    images.load(Path(".cache/bin/ctr"), "/run/.../containerd.sock")   # -> list of refs imported

Needs root, buildah (Debian package), debootstrap and gcc with a static libc (libc6-dev).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / ".cache" / "images"
LOG_DIR = ROOT / ".cache" / "logs"
#: Wheels of the Dockerfiles' requirement files (the lock), downloaded once on the host and offered to
#: pip in the build (find-links; the only source when it holds them all). pip's own HTTP cache (the
#: Dockerfiles' cache mount) stores nothing on machines whose proxy strips Cache-Control, as here, so
#: without this a rebuild of the runtime's dependency layer would download torch and its CUDA
#: libraries (~3 GB) again.
WHEELHOUSE = CACHE_DIR / "wheels"

HASH_LABEL = "io.kubeinfer.inputs-hash"
#: containerd's CRI plugin never garbage-collects an image with this label (kubelet image GC).
PINNED_LABEL = "io.cri-containerd.pinned"
#: Bump when what goes into a hash, or a recipe below, changes: every image is then rebuilt.
HASH_SCHEME = "1"

BASE_REF = "localhost/kubeinfer/base:bookworm-python3"
PAUSE_REF = "registry.k8s.io/pause:3.10"
#: The package version (pyproject.toml, through the installed metadata): the tag of our two images.
VERSION = version("kubeinfer")
OPERATOR_REF = f"ghcr.io/kubeinfer/operator:{VERSION}"
RUNTIME_REF = f"ghcr.io/kubeinfer/runtime:{VERSION}"

#: The base image's recipe (part of its hash). The mirror is not: any mirror serves the same suite.
BASE_SUITE = "bookworm"
BASE_VARIANT = "minbase"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_MIRROR = os.environ.get("KUBEINFER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_SECURITY_MIRROR = os.environ.get(
    "KUBEINFER_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security"
)

PAUSE_SOURCE = Path("hack/pause/pause.c")
PAUSE_DESCRIPTION = "pod sandbox process (kubeinfer hack/pause/pause.c)"
PAUSE_CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")

#: What ``load`` imports into a node's containerd by default (base is only a build input).
NODE_IMAGES = ("pause", "operator", "runtime")

__all__ = [
    "BASE_REF",
    "HASH_LABEL",
    "IMAGES",
    "NODE_IMAGES",
    "OPERATOR_REF",
    "PAUSE_REF",
    "RUNTIME_REF",
    "BuildResult",
    "Image",
    "ImageError",
    "build",
    "export",
    "load",
]


class ImageError(RuntimeError):
    """A build, export or load failed (the message names the image and says why)."""


@dataclass(frozen=True)
class Image:
    """An image this module builds.

    Attributes:
        name: short name (``base``, ``pause``, ``operator``, ``runtime``), also the archive's name.
        ref: the full reference it is tagged with in buildah's storage and in containerd.
        kind: ``debootstrap``, ``pause`` or ``dockerfile``.
        dockerfile: for ``dockerfile`` images, its path relative to the repository root (the build
            context is the repository root).
        base: the name of the image passed as ``BASE_IMAGE`` (``dockerfile`` images), else None.
    """

    name: str
    ref: str
    kind: str
    dockerfile: str | None = None
    base: str | None = None


IMAGES: dict[str, Image] = {
    i.name: i
    for i in (
        Image("base", BASE_REF, "debootstrap"),
        Image("pause", PAUSE_REF, "pause"),
        Image("operator", OPERATOR_REF, "dockerfile", "operator/Dockerfile", base="base"),
        Image("runtime", RUNTIME_REF, "dockerfile", "runtime/Dockerfile", base="base"),
    )
}


@dataclass(frozen=True)
class BuildResult:
    """What ``build`` did for one image.

    Attributes:
        name, ref: the image.
        inputs_hash: the hash of its inputs (its ``io.kubeinfer.inputs-hash`` label).
        built: False when an image with that hash was already there (nothing done).
        seconds: wall time spent on it, in seconds (hashing included).
        size_bytes: the image's size in buildah's storage (uncompressed layers), in bytes.
    """

    name: str
    ref: str
    inputs_hash: str
    built: bool
    seconds: float
    size_bytes: int


# ---------------------------------------------------------------------------------------------
# Pure parts: Dockerfile parsing, .dockerignore matching, input hashing, rebuild decision.
# ---------------------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """Split a Dockerfile into ``(INSTRUCTION, arguments)`` pairs.

    Joins ``\\``-continued lines, drops comments and blank lines (also between continued lines,
    as Docker does). The instruction is upper-cased; heredocs are not supported.
    """
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        current += line
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    if current.strip():
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def context_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths a Dockerfile reads: the sources of COPY and ADD without ``--from``.

    Both the shell form (``COPY a b ./dst``) and the JSON form (``COPY ["a", "dst"]``) are read;
    flags (``--chown=...``) are skipped. Paths are returned as written, without a leading ``./``
    or ``/`` (they are relative to the context). Raises ValueError on ``ADD`` of a URL or a
    ``RUN --mount=type=bind`` from the context, which this hash cannot follow.
    """
    sources: list[str] = []
    for instruction, args in dockerfile_instructions(dockerfile_text):
        if instruction == "RUN" and re.search(r"--mount=\S*type=bind", args) and "from=" not in args:
            raise ValueError(f"RUN --mount=type=bind from the build context is not hashed: {args!r}")
        if instruction not in ("COPY", "ADD"):
            continue
        words: list[str]
        if args.lstrip().startswith("["):
            words = json.loads(args)
            flags: list[str] = []
        else:
            parts = shlex.split(args)
            flags = [w for w in parts if w.startswith("--")]
            words = [w for w in parts if not w.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        if len(words) < 2:
            raise ValueError(f"{instruction} needs a source and a destination: {args!r}")
        for src in words[:-1]:
            if re.match(r"^[a-z]+://", src):
                raise ValueError(f"{instruction} of a URL is not hashed: {src!r}")
            src = src.removeprefix("./").lstrip("/") or "."
            sources.append(src)
    return sources


def parse_dockerignore(text: str) -> list[str]:
    """The patterns of a .dockerignore: one a line, ``#`` comments and blank lines dropped."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        body = line[1:].strip() if neg else line
        body = os.path.normpath(body.removeprefix("/")).removeprefix("./")
        patterns.append(("!" if neg else "") + body)
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            # "**/" matches any number of directories (also none), a trailing "**" anything
            if pattern.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
            else:
                out += ".*"
                i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = pattern.find("]", i)
            if j < 0:
                out += re.escape(c)
            else:
                out += "[" + pattern[i + 1 : j].replace("!", "^", 1) + "]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def is_ignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is excluded by .dockerignore ``patterns``.

    As Docker does: the last matching pattern wins, ``!`` re-includes, a pattern matching a
    directory excludes everything under it, ``*`` and ``?`` stay within one path element and
    ``**`` spans any number of them.
    """
    ignored = False
    prefixes = [path]
    parts = path.split("/")
    prefixes += ["/".join(parts[:n]) for n in range(1, len(parts))]
    for pattern in patterns:
        neg = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if neg else pattern)
        if any(regex.match(p) for p in prefixes):
            ignored = not neg
    return ignored


def context_files(context: Path, sources: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The files (relative ``/`` paths, sorted) under ``context`` that ``sources`` name.

    A source may be a file, a directory (taken recursively) or a glob; files excluded by
    ``patterns`` (.dockerignore) are left out, as the build would. Raises FileNotFoundError when a
    source matches nothing (the build would fail the same way).
    """
    found: set[str] = set()
    for src in sources:
        matches = sorted(context.glob(src)) if any(ch in src for ch in "*?[") else [context / src]
        matches = [m for m in matches if m.exists()]
        if not matches:
            raise FileNotFoundError(f"{src}: not in the build context {context}")
        for match in matches:
            candidates = [match] if match.is_file() else [p for p in match.rglob("*") if p.is_file()]
            for path in candidates:
                rel = path.relative_to(context).as_posix()
                if not is_ignored(rel, patterns):
                    found.add(rel)
    return sorted(found)


def hash_inputs(parts: Iterable[tuple[str, bytes]]) -> str:
    """A sha256 hex digest over named parts, independent of their order.

    Each part is ``(name, content)``; names must be unique (ValueError otherwise). The digest
    changes when a name, a content or the set of parts changes, and with HASH_SCHEME.
    """
    h = hashlib.sha256(f"kubeinfer-images/{HASH_SCHEME}\n".encode())
    seen: set[str] = set()
    for name, content in sorted(parts):
        if name in seen:
            raise ValueError(f"duplicate input {name!r}")
        seen.add(name)
        h.update(f"{len(name)}:{name}:{len(content)}:".encode())
        h.update(content)
    return h.hexdigest()


def dockerfile_inputs(
    context: Path, dockerfile: str, build_args: Mapping[str, str]
) -> list[tuple[str, bytes]]:
    """The hash inputs of a Dockerfile build with ``context`` as build context.

    The Dockerfile's text, the build args, the .dockerignore, and every context file the
    Dockerfile's COPY/ADD use (its content and whether it is executable). Raises
    FileNotFoundError (a missing source) or ValueError (an instruction that cannot be hashed).
    """
    text = (context / dockerfile).read_text()
    ignore_path = context / ".dockerignore"
    ignore_text = ignore_path.read_text() if ignore_path.exists() else ""
    patterns = parse_dockerignore(ignore_text)
    parts: list[tuple[str, bytes]] = [
        ("dockerfile", text.encode()),
        ("dockerignore", ignore_text.encode()),
    ]
    parts += [(f"arg:{k}", v.encode()) for k, v in build_args.items()]
    for rel in context_files(context, context_sources(text), patterns):
        path = context / rel
        mode = b"x" if os.access(path, os.X_OK) else b"-"
        parts.append((f"file:{rel}", mode + path.read_bytes()))
    return parts


def pinned_requirements(dockerfile_text: str) -> list[str]:
    """The quoted ``"name==version"`` requirements of a Dockerfile's ``pip install`` commands, in order.

    Our Dockerfiles have none (they install the lock's requirement files, ``requirement_files``); a
    unit test uses this to make sure no version is written in a Dockerfile.
    """
    reqs: list[str] = []
    for instruction, args in dockerfile_instructions(dockerfile_text):
        if instruction == "RUN" and "pip install" in args:
            for req in re.findall(r"[\"']([A-Za-z0-9][A-Za-z0-9._\-\[\],]*==[A-Za-z0-9.+!\-]+)[\"']", args):
                if req not in reqs:
                    reqs.append(req)
    return reqs


def requirement_files(dockerfile_text: str) -> list[str]:
    """The files a Dockerfile's ``pip install`` commands read with ``-r``/``--requirement``, in order.

    Paths as written; our Dockerfiles COPY each to the same relative path under their WORKDIR, so it
    is also the file's path in the build context (``prefetch_wheels`` reads it there).
    """
    files: list[str] = []
    for instruction, args in dockerfile_instructions(dockerfile_text):
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|\|\||;", args):
            if "pip install" not in command:
                continue
            for path in re.findall(r"(?:^|\s)(?:-r|--requirement)(?:\s+|=)(\S+)", command):
                if path not in files:
                    files.append(path)
    return files


def needs_build(wanted_hash: str, existing_hash: str | None, *, force: bool = False) -> bool:
    """Whether an image must be (re)built: forced, missing (None) or built from other inputs."""
    return force or existing_hash != wanted_hash


def parse_ctr_images(output: str) -> dict[str, dict[str, str]]:
    """Parse ``ctr images ls`` into ``{ref: {"digest": ..., label: value, ...}}``.

    The columns are REF TYPE DIGEST SIZE PLATFORMS LABELS; SIZE has a unit word ("1.2 GiB") and
    LABELS is ``-`` or ``k=v,k=v``.
    """
    images: dict[str, dict[str, str]] = {}
    for line in output.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 6:
            continue
        ref, digest, labels = fields[0], fields[2], fields[-1]
        info = {"digest": digest}
        if labels != "-":
            for item in labels.split(","):
                key, _, value = item.partition("=")
                info[key] = value
        images[ref] = info
    return images


#: pip settings of the host that a build inherits (where packages come from, never what they are).
PIP_PASSTHROUGH = ("index-url", "extra-index-url", "trusted-host", "cert", "client-cert", "proxy",
                   "timeout", "default-timeout", "retries")  # fmt: skip


def build_pip_conf(
    config_list: str, find_links: str | None = None, *, no_index: bool = False
) -> tuple[str, list[str]]:
    """A pip.conf for the build's RUN steps from the host's ``pip config list`` output.

    Keeps the PIP_PASSTHROUGH keys (config files and ``PIP_*`` environment, the environment
    winning as in pip), so pip in the build reaches the index the way the host's does (e.g.
    through a proxy whose CA only the host's bundle has). ``find_links`` adds a wheelhouse and
    ``no_index`` makes it the only source (pip takes the index's copy of a version both have, so
    a wheelhouse alone does not save a download). Returns the file's text and the host
    files it names (``cert``, ``client-cert``), to be mounted at the same paths.
    """
    values: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in config_list.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        scope, _, name = key.rpartition(".")
        value = raw.strip().strip("'\"")
        if name not in PIP_PASSTHROUGH or scope not in ("global", "install", ":env:"):
            continue
        (env if scope == ":env:" else values)[name] = value
    values.update(env)
    if find_links:
        values["find-links"] = find_links
    if no_index:
        values["no-index"] = "true"
    text = "[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(values.items()))
    files = [values[k] for k in ("cert", "client-cert") if k in values]
    return text, files


# ---------------------------------------------------------------------------------------------
# buildah
# ---------------------------------------------------------------------------------------------


def _run(cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), text=True, capture_output=True)
    if check and res.returncode != 0:
        raise ImageError(f"{shlex.join(cmd)} failed ({res.returncode}): {(res.stderr or res.stdout)[-2000:]}")
    return res


def _need_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise ImageError(
            f"{', '.join(missing)} not found: `make setup` installs them (Debian: "
            "apt-get install buildah debootstrap gcc libc6-dev)"
        )
    if os.geteuid() != 0:
        raise ImageError("building images needs root (buildah's storage, debootstrap)")


def _inspect(ref: str) -> dict[str, Any] | None:
    """buildah's view of the image ``ref`` (``buildah inspect --type image``), None if absent."""
    res = _run(["buildah", "inspect", "--type", "image", ref], check=False)
    if res.returncode != 0:
        return None
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def image_hash(ref: str) -> str | None:
    """The ``io.kubeinfer.inputs-hash`` label of ``ref`` in buildah's storage (None if absent)."""
    data = _inspect(ref)
    if data is None:
        return None
    config = data.get("OCIv1") or {}
    labels = (config.get("config") or {}).get("Labels") or {}
    value = labels.get(HASH_LABEL)
    return str(value) if value else None


def image_size(ref: str) -> int:
    """The size of ``ref`` in buildah's storage (its layers, uncompressed), in bytes; 0 if absent."""
    res = _run(["buildah", "images", "--json", ref], check=False)
    if res.returncode != 0:
        return 0
    for entry in json.loads(res.stdout or "[]"):
        size = entry.get("size")
        if isinstance(size, int | float):
            return int(size)
        if isinstance(size, str):
            return _parse_size(size)
    return 0


def _parse_size(text: str) -> int:
    """``"1.23 GB"`` (buildah's decimal units) -> bytes."""
    m = re.match(r"^\s*([\d.]+)\s*([kKMGT]?B)\s*$", text)
    if not m:
        return 0
    scale = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[m.group(2)]
    return int(float(m.group(1)) * scale)


def human(n: float) -> str:
    """Bytes as a short decimal string (``"1.2 GB"``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _stream(cmd: Sequence[str], log_path: Path, say: Callable[[str], None], prefix: str) -> None:
    """Run ``cmd``, write all its output to ``log_path`` and show its STEP lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            ["nice", "-n", "10", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            log.write(line)
            tail = [*tail[-39:], line]
            if line.startswith("STEP ") or (line.startswith("[") and "STEP" in line):
                say(f"{prefix}{line.rstrip()[:150]}")
        rc = proc.wait()
    if rc != 0:
        raise ImageError(f"{shlex.join(cmd)} failed ({rc}); log: {log_path}\n" + "".join(tail[-25:]).rstrip())


def inputs(image: Image, context: Path = ROOT) -> list[tuple[str, bytes]]:
    """The hash inputs of ``image`` (see dockerfile_inputs; base and pause: their recipe).

    A Dockerfile image's inputs include its base image's hash, so a new base rebuilds it.
    """
    if image.kind == "debootstrap":
        return [
            ("suite", BASE_SUITE.encode()),
            ("variant", BASE_VARIANT.encode()),
            ("packages", " ".join(sorted(BASE_PACKAGES)).encode()),
        ]
    if image.kind == "pause":
        gcc = _run(["gcc", "-dumpfullversion"], check=False).stdout.strip() if shutil.which("gcc") else ""
        return [
            ("source", (context / PAUSE_SOURCE).read_bytes()),
            ("cflags", " ".join(PAUSE_CFLAGS).encode()),
            ("gcc", gcc.encode()),
        ]
    assert image.dockerfile is not None and image.base is not None
    base = IMAGES[image.base]
    parts = dockerfile_inputs(context, image.dockerfile, {"BASE_IMAGE": base.ref})
    parts.append(("base-inputs-hash", hash_inputs(inputs(base, context)).encode()))
    return parts


def _build_base(image: Image, digest: str, say: Callable[[str], None]) -> None:
    _need_tools("debootstrap")
    log = LOG_DIR / f"image-{image.name}.log"
    packages = ", ".join(BASE_PACKAGES)
    say(f"  debootstrap {BASE_SUITE} ({BASE_VARIANT}; {packages}) from {BASE_MIRROR} (log: {log})")
    ctr = _run(["buildah", "from", "--pull-never", "scratch"]).stdout.strip()
    try:
        mnt = Path(_run(["buildah", "mount", ctr]).stdout.strip())
        cmd = [
            "debootstrap",
            f"--variant={BASE_VARIANT}",
            f"--include={','.join(BASE_PACKAGES)}",
            BASE_SUITE,
            str(mnt),
            BASE_MIRROR,
        ]
        _stream(cmd, log, say, "    ")
        # the security and point-release updates, as the official images have them
        (mnt / "etc/apt/sources.list").write_text(
            f"deb {BASE_MIRROR} {BASE_SUITE} main\n"
            f"deb {BASE_MIRROR} {BASE_SUITE}-updates main\n"
            f"deb {BASE_SECURITY_MIRROR} {BASE_SUITE}-security main\n"
        )
        say("  apt-get upgrade (bookworm-updates, bookworm-security)")
        upgrade = (
            "export DEBIAN_FRONTEND=noninteractive; apt-get -q update && apt-get -q -y upgrade "
            "&& apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log "
            "/var/cache/debconf/*-old /var/lib/dpkg/*-old"
        )
        with log.open("a") as f:
            res = subprocess.run(["chroot", str(mnt), "sh", "-c", upgrade], stdout=f, stderr=f)
        if res.returncode != 0:
            raise ImageError(f"apt-get upgrade in the base image failed; log: {log}")
        # /dev, /proc etc. are the container runtime's; debootstrap leaves device nodes in /dev
        for sub in ("dev", "proc", "sys", "run", "tmp"):
            target = mnt / sub
            for child in target.iterdir() if target.is_dir() else ():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        (mnt / "tmp").chmod(0o1777)
        _run(["buildah", "umount", ctr])
        _run(
            [
                "buildah", "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8",
                "--cmd", "python3",
                "--label", f"{HASH_LABEL}={digest}",
                "--label", f"org.opencontainers.image.description=Debian {BASE_SUITE} {BASE_VARIANT} "
                f"with {' '.join(BASE_PACKAGES)} (kubeinfer hack/images.py)",
                ctr,
            ]
        )  # fmt: skip
        _run(["buildah", "commit", "--rm", "--quiet", ctr, image.ref])
    except BaseException:
        _run(["buildah", "rm", ctr], check=False)
        raise


def _build_pause(image: Image, digest: str, say: Callable[[str], None], context: Path) -> None:
    _need_tools("gcc")
    with tempfile.TemporaryDirectory(prefix="kubeinfer-pause-") as tmp:
        binary = Path(tmp) / "pause"
        say(f"  gcc {' '.join(PAUSE_CFLAGS)} {PAUSE_SOURCE}")
        _run(["gcc", *PAUSE_CFLAGS, "-o", str(binary), str(context / PAUSE_SOURCE)])
        ctr = _run(["buildah", "from", "--pull-never", "scratch"]).stdout.strip()
        try:
            _run(["buildah", "copy", "--chmod", "0755", ctr, str(binary), "/pause"])
            _run(
                [
                    "buildah", "config",
                    "--entrypoint", '["/pause"]',
                    "--cmd", "",
                    "--user", "65535:65535",
                    "--label", f"{HASH_LABEL}={digest}",
                    "--label", f"org.opencontainers.image.description={PAUSE_DESCRIPTION}",
                    ctr,
                ]
            )  # fmt: skip
            _run(["buildah", "commit", "--rm", "--quiet", ctr, image.ref])
        except BaseException:
            _run(["buildah", "rm", ctr], check=False)
            raise


def _host_pip_volumes(offline: bool) -> list[str]:
    """``-v`` options giving the build's RUN steps the host's pip settings (see build_pip_conf).

    Bind mounts, so nothing of the host ends up in a layer. ``offline``: pip installs from the
    wheelhouse only (it holds every requirement: prefetch_wheels succeeded).
    """
    res = _run([_host_python(), "-m", "pip", "config", "list"], check=False)
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    config = res.stdout if res.returncode == 0 else ""
    text, files = build_pip_conf(config, "/kubeinfer-wheelhouse", no_index=offline)
    conf = CACHE_DIR / "pip.conf"
    conf.touch(mode=0o600)
    conf.chmod(0o600)  # the host's proxy setting may carry credentials
    conf.write_text(text)
    volumes = ["-v", f"{conf}:/etc/pip.conf:ro", "-v", f"{WHEELHOUSE}:/kubeinfer-wheelhouse:ro"]
    for f in files:
        if Path(f).is_file():
            volumes += ["-v", f"{f}:{f}:ro"]
    return volumes


def _host_python() -> str:
    venv_python = ROOT / ".venv" / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def prefetch_wheels(image: Image, say: Callable[[str], None], context: Path = ROOT) -> bool:
    """Download the wheels of ``image``'s requirement files (the lock's, with their hashes) into WHEELHOUSE.

    Uses the host's pip (the .venv's), whose Python (3.11, glibc 2.36) picks the same wheels as the
    Debian base, in hash-checking mode (a file in the wheelhouse that is not the locked one fails).
    Files already there are not downloaded again; a stamp (the hash of the requirement files) skips
    even the index look-ups. Returns whether the wheelhouse holds all of them; a failure is only
    reported (the build then downloads from the index by itself).
    """
    assert image.dockerfile is not None
    files = [context / f for f in requirement_files((context / image.dockerfile).read_text())]
    if not files:
        return False
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    stamp = WHEELHOUSE / f".{image.name}.requirements"
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return True
    before = sum(p.stat().st_size for p in WHEELHOUSE.iterdir())
    t0 = time.monotonic()
    names = ", ".join(str(f.relative_to(context)) for f in files)
    say(f"  pip download {names} -> {WHEELHOUSE.relative_to(ROOT)}")
    cmd = [_host_python(), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--require-hashes", "--only-binary", ":all:", "-d", str(WHEELHOUSE),
           *(a for f in files for a in ("-r", str(f)))]  # fmt: skip
    res = subprocess.run(["nice", "-n", "10", *cmd], text=True, capture_output=True)
    if res.returncode != 0:
        say(f"  warning: pip download failed, the build downloads instead: {res.stderr.strip()[-500:]}")
        return False
    stamp.write_text(digest)
    after = sum(p.stat().st_size for p in WHEELHOUSE.iterdir())
    say(f"  wheelhouse: +{human(after - before)} in {time.monotonic() - t0:.0f} s ({human(after)} in all)")
    return True


def _build_dockerfile(
    image: Image, digest: str, say: Callable[[str], None], context: Path, no_cache: bool = False
) -> None:
    assert image.dockerfile is not None and image.base is not None
    offline = prefetch_wheels(image, say, context)
    cmd = [
        "buildah", "build",
        "--layers",
        *(["--no-cache"] if no_cache else []),
        "--pull-never",  # the base is local; nothing can be pulled here
        # RUN steps in a chroot, not an OCI runtime: crun refuses these machines' hybrid cgroups
        # (v1 + v2) and a build step needs no cgroup of its own
        "--isolation", "chroot",
        "--network", "host",  # pip reaches PyPI as the host does; no CNI bridge or iptables rules
        *_host_pip_volumes(offline),
        "--build-arg", f"BASE_IMAGE={IMAGES[image.base].ref}",
        "--label", f"{HASH_LABEL}={digest}",
        "-f", str(context / image.dockerfile),
        "-t", image.ref,
        str(context),
    ]  # fmt: skip
    _stream(cmd, LOG_DIR / f"image-{image.name}.log", say, "  ")


_lock_depth = 0


@contextlib.contextmanager
def _store_lock(say: Callable[[str], None]) -> Iterator[None]:
    """Serialise builds, prunes and exports of this repository (a prune must not remove the
    intermediate images of a build running in another process). Reentrant within a process."""
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("images: waiting for another build/export of these images to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0


def _resolve(names: Sequence[str] | None, default: Sequence[str]) -> list[Image]:
    chosen = list(names) if names else list(default)
    unknown = [n for n in chosen if n not in IMAGES]
    if unknown:
        raise ImageError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    # build order: a base before the images built on it
    order = list(IMAGES)
    return [IMAGES[n] for n in sorted(set(chosen), key=order.index)]


def _build_unlocked(
    names: Sequence[str] | None = None,
    *,
    force: bool = False,
    no_cache: bool = False,
    context: Path = ROOT,
    log: Callable[[str], None] | None = None,
) -> list[BuildResult]:
    """``build`` without the lock (the caller holds it)."""
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    _need_tools("buildah")
    wanted = _resolve(names, list(IMAGES))
    todo = list(wanted)
    for image in wanted:
        if image.base and IMAGES[image.base] not in todo:
            todo.insert(0, IMAGES[image.base])
    todo = _resolve([i.name for i in todo], [])
    results: list[BuildResult] = []
    for n, image in enumerate(todo, 1):
        t0 = time.monotonic()
        digest = hash_inputs(inputs(image, context))
        existing = image_hash(image.ref)
        forced = force and image in wanted
        if not needs_build(digest, existing, force=forced):
            size = image_size(image.ref)
            say(f"images: [{n}/{len(todo)}] {image.ref}: up to date ({human(size)}, inputs {digest[:12]})")
            results.append(BuildResult(image.name, image.ref, digest, False, time.monotonic() - t0, size))
            continue
        why = "forced" if forced else ("not built yet" if existing is None else "inputs changed")
        say(f"images: [{n}/{len(todo)}] {image.ref}: building ({why}; inputs {digest[:12]})")
        if image.kind == "debootstrap":
            _build_base(image, digest, say)
        elif image.kind == "pause":
            _build_pause(image, digest, say, context)
        else:
            _build_dockerfile(image, digest, say, context, no_cache=no_cache)
        if image_hash(image.ref) != digest:
            raise ImageError(f"{image.ref}: built, but its {HASH_LABEL} label is not {digest}")
        seconds = time.monotonic() - t0
        size = image_size(image.ref)
        say(f"images: [{n}/{len(todo)}] {image.ref}: built in {seconds:.0f} s, {human(size)}")
        results.append(BuildResult(image.name, image.ref, digest, True, seconds, size))
    if any(r.built for r in results):
        prune(say)
    return results


def stale_intermediates(images: Sequence[tuple[str, bool, Sequence[str]]]) -> list[str]:
    """The untagged images that no tagged image is built on: what a rebuild left behind.

    ``images`` holds ``(id, tagged, layer diff_ids)`` for every image in the store. An untagged
    image is kept when its layers are a prefix of a tagged image's layers: it is an intermediate
    step of that image and ``--layers`` reuses it (the dependency layers). Single-stage Dockerfiles
    only: a build stage's intermediates would count as stale.
    """
    chains = [tuple(layers) for _, tagged, layers in images if tagged]
    stale = []
    for image_id, tagged, layers in images:
        if tagged:
            continue
        key = tuple(layers)
        if not any(chain[: len(key)] == key for chain in chains):
            stale.append(image_id)
    return stale


def _prune_unlocked(log: Callable[[str], None] | None = None) -> int:
    """``prune`` without the lock (the caller holds it)."""
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    listing = json.loads(_run(["buildah", "images", "--all", "--json"]).stdout or "[]")
    entries = []
    for entry in listing:
        data = _inspect(entry["id"])
        if data is None:
            continue
        layers = (data.get("OCIv1") or {}).get("rootfs", {}).get("diff_ids") or []
        entries.append((str(entry["id"]), bool(entry.get("names")), list(layers)))
    stale = stale_intermediates(entries)
    # newest first: a child before its parent
    for image_id in reversed(stale):
        _run(["buildah", "rmi", image_id], check=False)
    if stale:
        say(f"images: removed {len(stale)} intermediate images no tagged image is built on")
    return len(stale)


def build(
    names: Sequence[str] | None = None,
    *,
    force: bool = False,
    no_cache: bool = False,
    context: Path = ROOT,
    log: Callable[[str], None] | None = None,
) -> list[BuildResult]:
    """Build the images ``names`` (default: all) into buildah's storage, when their inputs changed.

    A Dockerfile image needs its base: asking for ``operator`` builds ``base`` first when it is
    missing or stale. ``force`` rebuilds the images named (buildah's layer cache still applies;
    ``no_cache`` also bypasses it: a cold build, apart from downloads already in the wheelhouse).
    ``log`` takes progress lines (default: print to stderr). Returns one BuildResult per image,
    in build order, with seconds of wall time and sizes in bytes.

    Raises ImageError when a tool is missing, not root, or a build fails (with its log's tail;
    full logs in .cache/logs/image-NAME.log).

    Holds a file lock (.cache/images/.lock) while it works: builds, prunes and exports of
    this repository run one at a time.
    """
    with _store_lock(log or (lambda s: print(s, file=sys.stderr, flush=True))):
        return _build_unlocked(names, force=force, no_cache=no_cache, context=context, log=log)


def prune(log: Callable[[str], None] | None = None) -> int:
    """Remove the images ``stale_intermediates`` names from buildah's storage.

    Unlike ``buildah rmi --prune``, it keeps the intermediate images the next build reuses (so a
    source change does not reinstall torch). Returns the number of images removed.

    Holds a file lock (.cache/images/.lock) while it works: builds, prunes and exports of
    this repository run one at a time.
    """
    with _store_lock(log or (lambda s: print(s, file=sys.stderr, flush=True))):
        return _prune_unlocked(log)


# ---------------------------------------------------------------------------------------------
# archives and containerd
# ---------------------------------------------------------------------------------------------


def archive_path(name: str) -> Path:
    """Where ``export`` writes the image ``name``: .cache/images/NAME.tar (a docker-archive)."""
    return CACHE_DIR / f"{name}.tar"


def _export_unlocked(name: str, *, log: Callable[[str], None] | None = None) -> Path:
    """``export`` without the lock (the caller holds it)."""
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    image = _resolve([name], [])[0]
    digest = image_hash(image.ref)
    if digest is None:
        raise ImageError(f"{image.ref} is not built: run `make images` (python hack/images.py build)")
    path = archive_path(name)
    stamp = path.with_suffix(".inputs-hash")
    if path.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tar.tmp")
    tmp.unlink(missing_ok=True)
    t0 = time.monotonic()
    _run(["buildah", "push", "--quiet", image.ref, f"docker-archive:{tmp}:{image.ref}"])
    tmp.replace(path)
    stamp.write_text(digest + "\n")
    say(f"images: exported {image.ref} -> {path.relative_to(ROOT)} ({human(path.stat().st_size)}, "
        f"{time.monotonic() - t0:.0f} s)")  # fmt: skip
    return path


def export(name: str, *, log: Callable[[str], None] | None = None) -> Path:
    """Write the image ``name`` from buildah's storage to its docker-archive, unless it is current.

    The archive is current when its ``.inputs-hash`` sidecar equals the image's label. Returns the
    archive's path. Raises ImageError when the image is not built or the export fails.

    Holds a file lock (.cache/images/.lock) while it works: builds, prunes and exports of
    this repository run one at a time.
    """
    with _store_lock(log or (lambda s: print(s, file=sys.stderr, flush=True))):
        return _export_unlocked(name, log=log)


def _ctr(ctr: Path, address: str, namespace: str, *args: str) -> list[str]:
    return [str(ctr), "--address", address, "--namespace", namespace, *args]


def containerd_images(ctr: Path, address: str, namespace: str = "k8s.io") -> dict[str, dict[str, str]]:
    """The images in containerd's ``namespace``: ``{ref: {"digest": ..., label: value}}``.

    Raises ImageError when ctr cannot reach containerd at ``address`` (a unix socket path).
    """
    return parse_ctr_images(_run(_ctr(ctr, address, namespace, "images", "ls")).stdout)


def load(
    ctr: Path,
    address: str,
    namespace: str = "k8s.io",
    names: Sequence[str] = NODE_IMAGES,
    *,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Import the built images ``names`` into a running containerd, so the kubelet never pulls them.

    ``ctr`` is the ctr binary, ``address`` containerd's socket path, ``namespace`` the containerd
    namespace (``k8s.io`` is the CRI plugin's, i.e. the kubelet's). An image whose ref is already
    there with the same ``io.kubeinfer.inputs-hash`` label is skipped; otherwise it is exported
    (``export``, only when its archive is stale; the runtime's 6 GB archive is deleted once
    imported), imported (``ctr images import``, unpacked for the
    default snapshotter) and labelled with the hash and ``io.cri-containerd.pinned=pinned``, so the
    kubelet's image garbage collection keeps it (pod specs use imagePullPolicy IfNotPresent, so a
    present image is never pulled). ``log`` takes progress lines (default: stderr).

    Returns the refs imported (empty when all were current). Raises ImageError when an image is not
    built (run ``make images``), containerd is unreachable, or an import fails.
    """
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    present = containerd_images(ctr, address, namespace)
    imported: list[str] = []
    for image in _resolve(names, []):
        digest = image_hash(image.ref)
        if digest is None:
            raise ImageError(f"{image.ref} is not built: run `make images` (python hack/images.py build)")
        there = present.get(image.ref)
        if there is not None and there.get(HASH_LABEL) == digest:
            say(f"images: {image.ref} already in containerd ({namespace})")
            continue
        path = export(image.name, log=say)
        t0 = time.monotonic()
        _run(_ctr(ctr, address, namespace, "images", "import", str(path)))
        _run(_ctr(ctr, address, namespace, "images", "label", image.ref, f"{HASH_LABEL}={digest}",
                  f"{PINNED_LABEL}=pinned"))  # fmt: skip
        say(f"images: loaded {image.ref} into containerd ({namespace}) in {time.monotonic() - t0:.0f} s")
        imported.append(image.ref)
        if image.name == "runtime":  # 6 GB on a shared disk; containerd keeps it, by hash
            path.unlink(missing_ok=True)
            path.with_suffix(".inputs-hash").unlink(missing_ok=True)
    if imported:
        for ref in stale_image_ids(containerd_images(ctr, address, namespace)):
            _run(_ctr(ctr, address, namespace, "images", "rm", ref), check=False)
            say(f"images: removed {ref[:19]}..., a replaced image (its layers are garbage-collected)")
    return imported


def stale_image_ids(images: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The ID-named images (``sha256:...`` refs, which containerd's CRI plugin adds beside each
    tag) whose manifest no named ref points at any more: what a re-import left behind. They hold
    the replaced image's layers (6 GB for the runtime) in the image store until removed, since the
    kubelet's image garbage collection is off on the local node."""
    named = {info["digest"] for ref, info in images.items() if not ref.startswith("sha256:")}
    return sorted(
        ref for ref, info in images.items() if ref.startswith("sha256:") and info["digest"] not in named
    )


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _list(context: Path = ROOT) -> Iterator[str]:
    yield f"{'NAME':9} {'REF':44} {'SIZE':>9}  {'STATE':11} INPUTS  ARCHIVE"
    for image in IMAGES.values():
        wanted = hash_inputs(inputs(image, context))
        have = image_hash(image.ref)
        state = "missing" if have is None else ("up to date" if have == wanted else "stale")
        size = human(image_size(image.ref)) if have else "-"
        path = archive_path(image.name)
        stamp = path.with_suffix(".inputs-hash")
        archive = "-"
        if path.exists():
            fresh = stamp.exists() and stamp.read_text().strip() == have
            archive = f"{path.relative_to(ROOT)} ({human(path.stat().st_size)}{'' if fresh else ', stale'})"
        yield f"{image.name:9} {image.ref:44} {size:>9}  {state:11} {wanted[:12]}  {archive}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/images.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build images whose inputs changed")
    p_build.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(IMAGES)}")
    p_build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p_build.add_argument("--no-cache", action="store_true", help="with --force: no layer cache")
    sub.add_parser("list", help="refs, sizes, whether each is up to date")
    sub.add_parser("prune", help="remove intermediate images no tagged image is built on")
    p_export = sub.add_parser("export", help="write docker-archives under .cache/images/")
    p_export.add_argument("names", nargs="*", metavar="NAME")
    p_load = sub.add_parser("load", help="import into a running containerd")
    p_load.add_argument("names", nargs="*", metavar="NAME")
    p_load.add_argument("--ctr", type=Path, default=ROOT / ".cache" / "bin" / "ctr")
    p_load.add_argument("--address", required=True, help="containerd's socket path")
    p_load.add_argument("-n", "--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            t0 = time.monotonic()
            results = build(args.names or None, force=args.force, no_cache=args.no_cache)
            built = [r for r in results if r.built]
            print(f"images: {len(built)} built, {len(results) - len(built)} up to date, "
                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr)  # fmt: skip
            for r in results:
                print(f"{r.ref}\t{r.size_bytes}\t{'built' if r.built else 'cached'}\t{r.seconds:.1f}s")
        elif args.cmd == "prune":
            prune()
        elif args.cmd == "list":
            for line in _list():
                print(line)
        elif args.cmd == "export":
            for name in args.names or list(NODE_IMAGES):
                print(export(name))
        else:
            load(args.ctr, args.address, args.namespace, args.names or NODE_IMAGES)
    except ImageError as e:
        print(f"images: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
