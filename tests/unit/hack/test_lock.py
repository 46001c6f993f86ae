"""The dependency lock (hack/lock.py, requirements/): pyproject.toml's ranges, lock.txt, the image
files and the Dockerfiles agree; and the check fails when one of them does not."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest

from hack import images, lock

ROOT = Path(__file__).resolve().parents[3]


def _copy_tree(tmp_path: Path) -> Path:
    """The files ``lock.problems`` reads, copied under ``tmp_path`` (to break them there)."""
    for rel in ("pyproject.toml", "requirements", *lock.IMAGES.values()):
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
    return tmp_path


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_lock_pyproject_images_and_dockerfiles_agree() -> None:
    assert lock.problems() == []


def test_lock_pins_every_dependency_with_hashes_for_the_images_python() -> None:
    pins = lock.parse_lock(lock.LOCK.read_text())
    for name in ("torch", "kopf", "pydantic", "pytest", "uv", "setuptools"):
        assert name in pins and pins[name].hashes
    runtime = lock.parse_lock(lock.image_file("runtime").read_text())
    operator = lock.parse_lock(lock.image_file("operator").read_text())
    assert {"torch", "transformers", "tokenizers", "numpy"} <= set(runtime)
    assert "torch" not in operator and "kopf" in operator  # the operator image stays small
    assert "pytest" not in runtime and "pytest" not in operator  # test tools only in the dev lock


def test_venv_has_the_locked_versions() -> None:
    """The tests run against the lock: each locked package this venv has is at the locked version
    (`make setup` installs the lock; a stale venv is refreshed when the lock changes)."""
    checked = []
    for name, pin in lock.parse_lock(lock.LOCK.read_text()).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        assert installed == pin.version, f"the venv has {name} {installed}, the lock {pin.version}"
        checked.append(name)
    if "torch" not in checked:
        pytest.skip("torch is not installed in this environment")
    assert {"torch", "transformers", "tokenizers", "numpy", "kopf"} <= set(checked)


def test_tool_environments_are_pinned_with_hashes_apart_from_the_lock(tmp_path: Path) -> None:
    """requirements/kserve-client.txt (``make setup`` step 8's venv) pins kserve at the version the
    client script asks for, with hashes, and its conflicting pins stay out of the lock."""
    from tests.support import kserve_client

    pins = lock.parse_lock(lock.image_file("kserve-client").read_text())
    assert lock.parse_in(lock.image_file("kserve-client", ".in").read_text()) == ["kserve"]
    assert pins["kserve"].version == kserve_client.KSERVE_VERSION and pins["kserve"].hashes
    assert pins["psutil"].version != lock.parse_lock(lock.LOCK.read_text())["psutil"].version
    root = _copy_tree(tmp_path)
    path = root / "requirements" / "kserve-client.txt"
    _replace(path, f"kserve=={pins['kserve'].version}", "kserve-other==1")
    found = lock.problems(root)
    assert any("kserve-client.txt: kserve (in kserve-client.in) is not pinned" in p for p in found)


def test_overlay_pins_granian_and_the_locks_versions_of_what_it_shares(tmp_path: Path) -> None:
    """requirements/bench-granian.txt (``hack/setup.sh --bench-granian``'s venv, which reads .venv's
    packages after its own) pins granian with hashes and click at the lock's version; another click
    would shadow the lock's in that venv and is refused, as is an unpinned .in name. hack/setup.sh
    installs exactly the overlays lock.OVERLAYS names."""
    assert set(lock.OVERLAYS) == {"bench-granian"}
    pins = lock.parse_lock(lock.image_file("bench-granian").read_text())
    locked = lock.parse_lock(lock.LOCK.read_text())
    assert lock.parse_in(lock.image_file("bench-granian", ".in").read_text()) == ["granian"]
    assert pins["granian"].version == "2.8.7" and pins["granian"].hashes and "granian" not in locked
    assert pins["click"].version == locked["click"].version
    setup = (ROOT / "hack" / "setup.sh").read_text()
    assert "OVERLAY_ENVS=(bench-granian)" in setup
    root = _copy_tree(tmp_path)
    path = root / "requirements" / "bench-granian.txt"
    _replace(path, f"click=={pins['click'].version}", "click==8.0.0")
    assert any(
        f"bench-granian.txt: click==8.0.0 differs from lock.txt's click=={locked['click'].version}" in p
        for p in lock.problems(root)
    )
    _replace(path, "granian==2.8.7", "granian-other==1")
    unpinned = "bench-granian.txt: granian (in bench-granian.in) is not pinned"
    assert any(unpinned in p for p in lock.problems(root))


def test_image_file_with_another_version_or_hash_fails(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    path = root / "requirements" / "operator.txt"
    pin = lock.parse_lock(path.read_text())["kopf"]
    _replace(path, f"kopf=={pin.version}", "kopf==0.0.1")
    assert any("operator.txt: kopf==0.0.1 differs" in p and "(version)" in p for p in lock.problems(root))
    _replace(path, "kopf==0.0.1", f"kopf=={pin.version}")
    _replace(path, sorted(pin.hashes)[0], "0" * 64)
    assert any("operator.txt: kopf" in p and "(hashes)" in p for p in lock.problems(root))


def test_dependency_missing_from_the_lock_or_outside_its_range_fails(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _replace(root / "pyproject.toml", '"kopf>=1.37"', '"kopf>=99"')
    _replace(root / "pyproject.toml", '"msgspec>=0.18",', '"msgspec>=0.18",\n  "left-pad>=1",')
    found = lock.problems(root)
    assert any("kopf==" in p and "outside pyproject.toml's 'kopf>=99'" in p for p in found)
    assert any("left-pad" in p and "is not locked" in p for p in found)
    assert any("left-pad is in no image" in p for p in found)


def test_dockerfile_with_its_own_pin_or_without_the_lock_fails() -> None:
    text = (ROOT / "runtime" / "Dockerfile").read_text()
    assert lock.dockerfile_problems("runtime", text) == []
    pinned = text.replace("-r requirements/runtime.txt", '-r requirements/runtime.txt "torch==2.0.0"')
    assert any("installs something other than" in p for p in lock.dockerfile_problems("runtime", pinned))
    bare = text.replace(
        "--require-hashes --only-binary :all: -r requirements/runtime.txt", '"torch==2.15.0" "numpy==2.4.6"'
    )
    found = lock.dockerfile_problems("runtime", bare)
    assert any("no `pip install --require-hashes -r requirements/runtime.txt`" in p for p in found)
    assert images.pinned_requirements(bare) == ["torch==2.15.0", "numpy==2.4.6"]
    unhashed = text.replace("--require-hashes ", "")
    assert lock.dockerfile_problems("runtime", unhashed) != []
    other = text.replace("-r requirements/runtime.txt", "-r requirements/operator.txt")
    assert lock.dockerfile_problems("runtime", other) != []
    index = text.replace("--no-deps --no-build-isolation .", "--no-deps --no-build-isolation . kopf")
    assert any("installs something other than" in p for p in lock.dockerfile_problems("runtime", index))


def test_parse_lock_refuses_unpinned_or_unhashed_lines() -> None:
    ok = (
        "a-b==1.0 \\\n    --hash=sha256:"
        + "a" * 64
        + "\n    # via x\nC_d[e]==2 --hash=sha256:"
        + "b" * 64
        + "\n"
    )
    assert lock.parse_lock(ok) == {
        "a-b": lock.Pin("1.0", frozenset({"a" * 64})),
        "c-d": lock.Pin("2", frozenset({"b" * 64})),
    }
    with pytest.raises(ValueError, match="not a pinned"):
        lock.parse_lock("torch>=2\n")
    with pytest.raises(ValueError, match="no --hash"):
        lock.parse_lock("torch==2.15.0\n")
    assert lock.parse_in("# c\nPyYAML  # yaml\ntritonclient[grpc]\n\n") == ["pyyaml", "tritonclient"]


def test_runtime_image_command_reads_the_operators_config_path() -> None:
    from kubeinfer.runtime.config import DEFAULT_CONFIG_PATH

    cmd = [args for instruction, args in images.dockerfile_instructions(
        (ROOT / "runtime" / "Dockerfile").read_text()) if instruction == "CMD"]  # fmt: skip
    assert cmd == [f'["serve", "--config", "{DEFAULT_CONFIG_PATH}"]']


#: What runs from the operator image: the operator, the activator (the chart's activator Deployment runs
#: ``kubeinfer-activator`` from it), the contract, and the one runtime module the operator imports.
OPERATOR_IMAGE_SOURCES = ("operator", "activator", "kubeinfer/contract", "runtime/config.py")


def _missing_from_image(pinned: set[str]) -> dict[str, list[str]]:
    """``{module: distributions}`` of each third-party module imported under ``OPERATOR_IMAGE_SOURCES``
    that no distribution of ``pinned`` (normalized names) provides (the venv says which distribution
    provides a module)."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    modules: set[str] = set()
    for source in OPERATOR_IMAGE_SOURCES:
        path = ROOT / source
        for f in [path] if path.is_file() else path.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    providers = packages_distributions()
    third = sorted(m for m in modules if m not in sys.stdlib_module_names and m != "kubeinfer")
    return {
        m: providers.get(m, [])
        for m in third
        if not any(lock.normalize(d) in pinned for d in providers.get(m, []))
    }


def test_operator_image_has_what_the_operator_and_the_activator_import() -> None:
    """requirements/operator.txt provides every package the operator image's code imports: an import
    added to the activator (or the operator) without its name in requirements/operator.in fails here,
    not at the pod's start."""
    pinned = set(lock.parse_lock(lock.image_file("operator").read_text()))
    assert _missing_from_image(pinned) == {}
    # the check sees the activator's serving packages (absent from the operator image before it ran there)
    without = pinned - {"starlette", "grpcio", "tritonclient", "uvicorn"}
    assert {"starlette", "grpc", "tritonclient", "uvicorn"} <= set(_missing_from_image(without))
