"""A real OCI registry for the tests: go-containerregistry's ``crane registry serve``, built by
``make setup`` into ``.cache/bin/crane`` (hack/storage-tools/go.mod), and ``crane append`` to push a
model image to it.

A model image is what ``docs/model-sources.md`` tells users to build: a ``FROM scratch`` image
whose one layer holds the model directory's files at its root, so that an image volume mounted at
``/mnt/models`` shows them there. :func:`push_model_image` makes that layer (a tar of a local
directory, files mode 0644, owned by root), pushes it on an empty base and sets the node's platform
in the image config (``crane mutate --set-platform``).

The registry listens on 127.0.0.1: the node's containerd pulls from the host's network namespace,
and containerd (like crane) speaks plain HTTP to a loopback registry without further configuration.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from hack.cluster import DEFAULT_BIN_DIR
from hack.devtools.operator_proc import free_port

CRANE_BIN = Path(os.environ.get("KUBEINFER_CRANE_BIN", str(DEFAULT_BIN_DIR / "crane")))
#: Architecture names of OCI platforms, from Python's machine names.
_OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def node_platform() -> str:
    """``linux/<arch>`` of this machine, as OCI names it (``linux/amd64``)."""
    machine = platform.machine().lower()
    return f"linux/{_OCI_ARCH.get(machine, machine)}"


@dataclass
class Registry:
    """``crane registry serve`` on 127.0.0.1 with its blobs on disk under ``root``.

    Use as a context manager; :attr:`host` is ``127.0.0.1:<port>`` once started. Raises
    ``RuntimeError`` when the binary is missing (``make setup`` builds it) or the registry does not
    answer ``GET /v2/`` within 30 s.
    """

    root: Path
    binary: Path = CRANE_BIN
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        if not self.binary.is_file():
            raise RuntimeError(f"{self.binary} is missing: `make setup` builds it (hack/storage-tools)")
        self.port = self.port or free_port()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        log = (self.root / "registry.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "registry",
                "serve",
                "--address",
                self.host,
                "--disk",
                str(self.root / "blobs"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"crane registry serve exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the registry on {self.host} did not answer GET /v2/ in 30 s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        path = self.root / "registry.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def crane(self, *args: str, timeout: float = 120) -> str:
        """Run ``crane <args>``; its stdout. Raises ``RuntimeError`` with stderr on failure."""
        done = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"crane {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def manifest_digest(self, ref: str) -> str:
        """``sha256:<hex>`` of the manifest ``ref`` (``host/repo:tag``) points to."""
        return self.crane("digest", ref).strip()


def model_layer(model_dir: Path) -> bytes:
    """A tar (uncompressed) of the files of ``model_dir`` at its root: regular files mode 0644 and
    directories 0755, owned by 0:0, sorted, mtime 0 (the same directory gives the same layer)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(model_dir.rglob("*")):
            rel = path.relative_to(model_dir).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_dir():
                info.mode = 0o755
                tar.addfile(info)
            elif path.is_file():
                info.mode = 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def push_model_image(registry: Registry, model_dir: Path, ref: str, work: Path) -> str:
    """Push ``model_dir`` as a one-layer ``FROM scratch`` image to ``ref`` (``host/repo:tag``) with
    :func:`node_platform`; returns the pushed manifest's digest (``sha256:...``)."""
    work.mkdir(parents=True, exist_ok=True)
    layer = work / (hashlib.sha256(ref.encode()).hexdigest()[:12] + ".tar")
    layer.write_bytes(model_layer(model_dir))
    registry.crane("append", "--oci-empty-base", "-f", str(layer), "-t", ref)
    # an empty base has no platform in its config; the node's image store wants one to unpack
    registry.crane("mutate", "--set-platform", node_platform(), "-t", ref, ref)
    return registry.manifest_digest(ref)


def image_config(registry: Registry, ref: str) -> dict[str, object]:
    """The pushed image's config (``crane config``), parsed."""
    config: dict[str, object] = json.loads(registry.crane("config", ref))
    return config
