#!/usr/bin/env python3
"""The Python dependency lock: ``make lock`` writes it, ``make setup``, CI and both images install from it.

pyproject.toml keeps the ranges (what kubeinfer works with); ``requirements/`` holds what is
installed, compiled by ``uv pip compile`` with a sha256 hash for every file:

- ``requirements/lock.txt``: ``dependencies`` plus the ``test`` extra, every transitive package
  pinned. ``make setup`` (hack/setup.sh) installs it with ``pip install --require-hashes``, then
  kubeinfer itself with ``--no-deps``; CI runs ``make test``, which runs ``make setup``.
- ``requirements/operator.txt``, ``requirements/runtime.txt``: what each image installs
  (``operator/Dockerfile``, ``runtime/Dockerfile``: ``pip install --require-hashes -r``), compiled
  from the names in ``requirements/IMAGE.in`` with lock.txt as constraints, so every version is
  the lock's. tests/unit/hack/test_lock.py fails when an image file, a Dockerfile or the venv
  disagrees with the lock.
- ``requirements/kserve-client.txt``: a test client that cannot share the lock (``TOOLS``), compiled on
  its own from ``requirements/kserve-client.in``; ``make setup`` installs it with ``--require-hashes``
  into its own venv, ``.cache/kserve-client``.
- ``requirements/peer-mlserver.txt``, ``requirements/peer-infinity.txt``: the peer servers that ``make
  bench-peers`` (bench/peers_bench.py) measures kubeinfer against (``PEERS``), compiled each on its own
  like a tool; ``make bench-peers`` (``hack/setup.sh --peers``), not ``make setup``, installs each into
  ``.cache/NAME``: they are benchmark baselines, not something the tests need.
- ``requirements/bench-granian.txt``: a benchmark overlay (``OVERLAYS``): what a benchmark adds to
  ``.venv`` (granian), compiled from ``requirements/bench-granian.in`` with lock.txt as constraints (a
  package both have is the lock's version), installed by ``hack/setup.sh --bench-granian`` into
  ``.cache/bench-granian``, a venv that reads the running .venv's packages after its own.

The target is the images' platform: CPython 3.11 on x86_64 Linux (glibc >= 2.28), the Debian bookworm
base and the development machines. torch is PyPI's wheel (``torch-X-cp311-cp311-manylinux_2_28_x86_64``,
built with CUDA 13, its CUDA libraries in the ``nvidia-*``/``cuda-*`` wheels it requires), as pip
picks it without an extra index. ``make lock`` keeps every pin that still satisfies pyproject.toml (uv
prefers the versions already in the output files); ``make lock UPGRADE=1`` moves everything to the
newest versions the ranges allow, ``make lock UPGRADE=torch`` one package.

CLI::

    python hack/lock.py                  # compile what changed (pins kept)
    python hack/lock.py --upgrade        # newest allowed versions of everything
    python hack/lock.py --upgrade-package torch
    python hack/lock.py --check          # exit 1 and say why when the files disagree (no network)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
LOCK = REQUIREMENTS / "lock.txt"
#: The images and the requirement files they install (requirements/IMAGE.txt from IMAGE.in).
IMAGES: Mapping[str, str] = {"operator": "operator/Dockerfile", "runtime": "runtime/Dockerfile"}
#: Test clients whose pins conflict with the lock, each with its own venv ``.cache/NAME`` that ``make setup``
#: installs from ``requirements/NAME.txt`` (compiled on its own from ``requirements/NAME.in``), and why.
TOOLS: Mapping[str, str] = {
    "kserve-client": "the KServe Python SDK (tests/support/kserve_client.py): kserve 0.21 pins psutil<6 and "
    "python-dateutil<3, the lock has psutil 7 and kubernetes 37 (python-dateutil>=3)",
}
#: Peer servers of the benchmarks, each in its own venv ``.cache/NAME`` that ``make bench-peers`` installs
#: from ``requirements/NAME.txt`` (compiled on its own from ``requirements/NAME.in``, as a tool), and why
#: they cannot share the lock.
PEERS: Mapping[str, str] = {
    "peer-mlserver": "MLServer 1.7.1 (Seldon) with adaptive batching: it pins fastapi<0.116 and protobuf<7",
    "peer-litserve": "LitServe 0.2.19 (Lightning AI) over onnxruntime, no torch: a baseline, not a dependency"
    " (it would add fastapi to the lock)",
    "peer-infinity": "infinity-emb 0.0.78: it pins numpy<2 and sentence-transformers<4 (transformers<5)",
}
#: Benchmark overlays, each a venv ``.cache/NAME`` with only what ``requirements/NAME.txt`` adds to .venv
#: (which it reads after its own packages: ``hack/setup.sh`` OVERLAY_PTH), compiled from
#: ``requirements/NAME.in`` with lock.txt as constraints; not in the lock, as no test or image needs them.
OVERLAYS: Mapping[str, str] = {
    "bench-granian": "granian 2.8.7, the HTTP server bench/frontend_bench.py measures beside uvicorn: a "
    "lever under measurement, not a dependency",
}
#: The platform every file is compiled for (the images' Python; Debian bookworm has glibc 2.36).
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
EXTRAS = ("test",)

__all__ = [
    "IMAGES",
    "LOCK",
    "OVERLAYS",
    "PEERS",
    "TOOLS",
    "Pin",
    "compile_all",
    "image_file",
    "normalize",
    "parse_in",
    "parse_lock",
    "problems",
]


@dataclass(frozen=True)
class Pin:
    """One package of a compiled requirements file: its version and the sha256 hashes of its files."""

    version: str
    hashes: frozenset[str]


def normalize(name: str) -> str:
    """A package name as PEP 503 compares them: ``PyYAML`` is ``pyyaml``, ``zope.event`` ``zope-event``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_file(image: str, suffix: str = ".txt") -> Path:
    """``requirements/IMAGE.txt`` (compiled) or ``requirements/IMAGE.in`` (the names)."""
    return REQUIREMENTS / f"{image}{suffix}"


def parse_lock(text: str) -> dict[str, Pin]:
    """``{normalized name: Pin}`` of a compiled requirements file (``name==version \\`` lines with
    ``--hash=sha256:...`` continuation lines; comments dropped). Raises ValueError on a requirement
    that is not pinned with ``==`` or has no hash."""
    pins: dict[str, Pin] = {}
    joined = re.sub(r"\\\n", " ", text)
    for raw in joined.splitlines():
        line = raw.split("#", 1)[0].strip()  # a hash is "--hash=sha256:...": no "#" in it
        if not line:
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)(\[[^\]]*\])?==(\S+)(.*)$", line)
        if not m:
            raise ValueError(f"not a pinned requirement: {line[:120]!r}")
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(4)))
        if not hashes:
            raise ValueError(f"{m.group(1)}=={m.group(3)} has no --hash")
        pins[normalize(m.group(1))] = Pin(m.group(3), hashes)
    return pins


def parse_in(text: str) -> list[str]:
    """The normalized package names of an ``.in`` file (one requirement a line, extras and ``#``
    comments dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [_requirement_name(line) for line in lines if line]


def _requirement_name(req: str) -> str:
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._\-]*)", req)
    if not m:
        raise ValueError(f"unreadable requirement {req!r}")
    return normalize(m.group(1))


def declared(pyproject_text: str) -> tuple[dict[str, str], dict[str, str]]:
    """From pyproject.toml: ``{name: requirement}`` of ``dependencies`` and the locked extras, and
    the same of ``build-system.requires``."""
    data = tomllib.loads(pyproject_text)
    reqs = list(data["project"]["dependencies"])
    for extra in EXTRAS:
        reqs += data["project"]["optional-dependencies"][extra]
    build = {_requirement_name(r): r for r in data["build-system"]["requires"]}
    return {_requirement_name(r): r for r in reqs}, build


def _satisfied(requirement: str, version: str) -> bool:
    """Whether ``version`` satisfies ``requirement``'s specifier (markers are not evaluated)."""
    from packaging.requirements import Requirement

    return Requirement(requirement).specifier.contains(version, prereleases=True)


def problems(root: Path = ROOT) -> list[str]:
    """Every way the lock, the image files, the ``.in`` files and pyproject.toml disagree (empty: none).

    - each dependency, ``test`` extra and build requirement of pyproject.toml is in lock.txt at a
      version its range allows;
    - each ``IMAGE.in`` name is a dependency or a build requirement of pyproject.toml, and every
      ``dependencies`` entry is in some image;
    - each ``IMAGE.txt`` pin is lock.txt's pin: same version, same hashes; and it pins every
      ``IMAGE.in`` name;
    - each Dockerfile installs only ``requirements/IMAGE.txt`` and kubeinfer itself (``dockerfile_problems``);
    - each ``TOOLS`` and ``PEERS`` file ``NAME.txt`` pins every ``NAME.in`` name (with hashes:
      ``parse_lock``);
    - each ``OVERLAYS`` file ``NAME.txt`` pins every ``NAME.in`` name, and each package lock.txt also
      pins at the lock's version (``_overlay_problems``).
    """
    deps, build = declared((root / "pyproject.toml").read_text())
    locked = parse_lock((root / LOCK.relative_to(ROOT)).read_text())
    out = _lock_problems({**deps, **build}, locked)
    in_images: set[str] = set()
    for image, dockerfile in IMAGES.items():
        names = parse_in((root / image_file(image, ".in").relative_to(ROOT)).read_text())
        in_images |= set(names)
        out += [
            f"{image}.in: {name} is neither a dependency nor a build requirement in pyproject.toml"
            for name in names
            if name not in deps and name not in build
        ]
        compiled = parse_lock((root / image_file(image).relative_to(ROOT)).read_text())
        out += _image_problems(image, names, compiled, locked)
        out += dockerfile_problems(image, (root / dockerfile).read_text())
    for tool in (*TOOLS, *PEERS):
        names = parse_in((root / image_file(tool, ".in").relative_to(ROOT)).read_text())
        compiled = parse_lock((root / image_file(tool).relative_to(ROOT)).read_text())
        out += [
            f"{tool}.txt: {name} (in {tool}.in) is not pinned: run `make lock`"
            for name in names
            if name not in compiled
        ]
    for overlay in OVERLAYS:
        names = parse_in((root / image_file(overlay, ".in").relative_to(ROOT)).read_text())
        compiled = parse_lock((root / image_file(overlay).relative_to(ROOT)).read_text())
        out += _overlay_problems(overlay, names, compiled, locked)
    runtime_deps = _runtime_dependencies((root / "pyproject.toml").read_text())
    out += [
        f"pyproject.toml dependency {name} is in no image's requirements/IMAGE.in"
        for name in sorted(set(runtime_deps) - in_images)
    ]
    return out


def _lock_problems(declared_reqs: Mapping[str, str], locked: Mapping[str, Pin]) -> list[str]:
    """Requirements of pyproject.toml (``{name: requirement}``) that lock.txt misses or pins outside
    their range."""
    out: list[str] = []
    for name, req in sorted(declared_reqs.items()):
        pin = locked.get(name)
        if pin is None:
            out.append(f"{LOCK.name}: {name} (pyproject.toml: {req!r}) is not locked: run `make lock`")
        elif not _satisfied(req, pin.version):
            out.append(
                f"{LOCK.name}: {name}=={pin.version} is outside pyproject.toml's {req!r}: run `make lock`"
            )
    return out


def _overlay_problems(
    overlay: str, names: Sequence[str], compiled: Mapping[str, Pin], locked: Mapping[str, Pin]
) -> list[str]:
    """How requirements/OVERLAY.txt (``compiled``) departs from its ``.in`` ``names`` and, for the packages
    lock.txt pins too, from lock.txt's versions (the overlay's venv reads .venv's packages after its own:
    another version would shadow the lock's)."""
    out = [
        f"{overlay}.txt: {name} (in {overlay}.in) is not pinned: run `make lock`"
        for name in names
        if name not in compiled
    ]
    for name, pin in sorted(compiled.items()):
        want = locked.get(name)
        if want is not None and want.version != pin.version:
            out.append(
                f"{overlay}.txt: {name}=={pin.version} differs from {LOCK.name}'s {name}=={want.version}: "
                "run `make lock`"
            )
    return out


def _image_problems(
    image: str, names: Sequence[str], compiled: Mapping[str, Pin], locked: Mapping[str, Pin]
) -> list[str]:
    """How requirements/IMAGE.txt (``compiled``) departs from its ``.in`` ``names`` and from lock.txt."""
    out = [
        f"{image}.txt: {name} (in {image}.in) is not pinned: run `make lock`"
        for name in names
        if name not in compiled
    ]
    for name, pin in sorted(compiled.items()):
        want = locked.get(name)
        if want is None:
            out.append(f"{image}.txt: {name}=={pin.version} is not in {LOCK.name}: run `make lock`")
        elif want != pin:
            what = "version" if want.version != pin.version else "hashes"
            out.append(
                f"{image}.txt: {name}=={pin.version} differs from {LOCK.name}'s {name}=={want.version} "
                f"({what}): run `make lock`"
            )
    return out


def dockerfile_problems(image: str, text: str) -> list[str]:
    """How the Dockerfile ``text`` of ``image`` departs from installing only the lock (empty: it does not).

    Each ``pip install`` in a RUN must be either ``--require-hashes ... -r requirements/IMAGE.txt``
    (that file COPYed from the build context) or kubeinfer itself, ``--no-deps --no-build-isolation .``
    (built with the locked setuptools): a version, a name or another file installed there would not
    be the lock's.
    """
    from hack import images  # hack/images.py parses Dockerfiles (and does not import this module)

    want = f"requirements/{image}.txt"
    out: list[str] = []
    installs_lock = False
    for instruction, args in images.dockerfile_instructions(text):
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", args):
            if "pip install" not in command:
                continue
            words = command.split()
            files = images.requirement_files(f"RUN {command}")
            rest = _positional(words[words.index("install") + 1 :])
            if files == [want] and "--require-hashes" in words and not rest:
                installs_lock = True
            elif {"--no-deps", "--no-build-isolation"} <= set(words) and rest == ["."] and not files:
                pass
            else:
                out.append(f"{image} Dockerfile: `{command.strip()}` installs something other than {want}")
    if not installs_lock:
        out.append(f"{image} Dockerfile: no `pip install --require-hashes -r {want}`")
    if want not in images.context_sources(text):
        out.append(f"{image} Dockerfile: {want} is not COPYed from the build context")
    return out


#: pip options whose value is the next word.
_VALUED = frozenset({"-r", "--requirement", "-c", "--constraint", "--only-binary", "--no-binary", "-e"})


def _positional(words: Sequence[str]) -> list[str]:
    """The requirements named on a ``pip install`` command line (not options or their values)."""
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in _VALUED:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def _runtime_dependencies(pyproject_text: str) -> list[str]:
    return [_requirement_name(r) for r in tomllib.loads(pyproject_text)["project"]["dependencies"]]


def _uv() -> str:
    for candidate in (ROOT / ".venv" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("uv not found: `make setup` installs it into .venv (pyproject.toml's test extra)")


def _compile(args: Sequence[str], output: Path, upgrade: Iterable[str], stdin: str = "") -> None:
    cmd = [
        _uv(), "pip", "compile", "--quiet", *args,
        "--generate-hashes",
        "--python-version", PYTHON_VERSION,
        "--python-platform", PYTHON_PLATFORM,
        "--custom-compile-command", "make lock",
        *upgrade,
        "-o", str(output.relative_to(ROOT)),
    ]  # fmt: skip
    print(f"lock: {output.relative_to(ROOT)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, input=stdin, text=True)


def compile_all(*, upgrade: bool = False, upgrade_packages: Sequence[str] = ()) -> None:
    """Write lock.txt from pyproject.toml, then each IMAGE.txt from IMAGE.in constrained by lock.txt,
    then each ``TOOLS`` and ``PEERS`` file NAME.txt from NAME.in alone, then each ``OVERLAYS`` file
    NAME.txt from NAME.in constrained by lock.txt.

    Pins already in the files are kept unless ``upgrade`` (all) or ``upgrade_packages`` (those)
    says otherwise. Needs the package index (uv reads the versions and hashes there). Raises
    ``subprocess.CalledProcessError`` when uv fails (its message is on stderr: e.g. no version
    satisfies the ranges).
    """
    flags = ["--upgrade"] if upgrade else [a for p in upgrade_packages for a in ("--upgrade-package", p)]
    # build-system.requires on stdin ("-"): the images build the kubeinfer wheel with the locked
    # setuptools (`pip install --no-build-isolation .`)
    build = "".join(
        f"{r}\n" for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    )
    _compile(["pyproject.toml", "-", *(a for e in EXTRAS for a in ("--extra", e))], LOCK, flags, stdin=build)
    for image in IMAGES:
        in_file = image_file(image, ".in").relative_to(ROOT)
        # upgrades come from the lock: the image files only follow it
        _compile([str(in_file), "-c", str(LOCK.relative_to(ROOT))], image_file(image), ["--upgrade"])
    for tool in (*TOOLS, *PEERS):
        # on its own: these pins conflict with the lock's (TOOLS and PEERS say why)
        _compile([str(image_file(tool, ".in").relative_to(ROOT))], image_file(tool), flags)
    for overlay in OVERLAYS:
        in_file = image_file(overlay, ".in").relative_to(ROOT)
        _compile([str(in_file), "-c", str(LOCK.relative_to(ROOT))], image_file(overlay), flags)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/lock.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="newest versions pyproject.toml allows")
    parser.add_argument("--upgrade-package", action="append", default=[], metavar="NAME")
    parser.add_argument("--check", action="store_true", help="only check the files agree (no network)")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # run as a script: `from hack import images` (appended: operator/
        sys.path.append(str(ROOT))  # must not shadow the standard library's operator module)
    if not args.check:
        compile_all(upgrade=args.upgrade, upgrade_packages=args.upgrade_package)
    found = problems()
    for p in found:
        print(f"lock: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
