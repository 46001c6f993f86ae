"""Config-file watcher: re-applies the ``batching`` section when ``runtime.yaml`` changes.

Kubernetes updates a mounted ConfigMap by swapping a symlink (``..data``), so neither inotify on the
file nor its mtime is reliable; the watcher polls (about once a second) and compares the file's
*content*. On a change it parses the whole file (``RuntimeConfig``), re-applies the command-line
overrides, and hands the new ``batching`` section to ``apply``. Invalid content (YAML, a field out of
range, a ``max_batch_size`` over the warmed maximum) keeps the old settings, logs an error naming the
field, and calls ``on_error`` (the server counts ``kubeinfer_config_reload_errors_total``). Changes
outside ``batching`` need a restart: they are logged and ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pydantic
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig

log = logging.getLogger(__name__)

PollResult = Literal["unchanged", "applied", "error"]


def describe_validation_error(exc: pydantic.ValidationError) -> str:
    """One line per error: ``field.path: message`` (the field named as in the YAML file)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(file)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


class ConfigWatcher:
    """Polls ``path`` and applies changed ``batching`` sections.

    Args:
        path: the config file (``/etc/kubeinfer/runtime.yaml`` in a pod).
        current: the configuration in force (from the file plus ``overrides`` at start).
        apply: called with the new ``BatchingConfig``; raises ``ValueError`` to reject it.
        overrides: a function that re-applies the command-line flags to a freshly parsed config.
        on_error: called with a message after a rejected change.
        interval: seconds between polls.
    """

    def __init__(
        self,
        path: str | Path,
        current: RuntimeConfig,
        apply: Callable[[BatchingConfig], None],
        *,
        overrides: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c,
        on_error: Callable[[str], None] = lambda msg: None,
        interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.current = current
        self.apply = apply
        self.overrides = overrides
        self.on_error = on_error
        self.interval = interval
        self._last = self._read()
        self._last_error: str | None = None

    def _read(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except OSError:
            return None

    def poll_once(self) -> PollResult:
        """Read the file once; apply its ``batching`` section if the content changed."""
        text = self._read()
        if text is None or text == self._last:
            return "unchanged"  # a missing file (mid symlink swap, or unmounted) keeps the settings
        self._last = text
        try:
            new = self.overrides(RuntimeConfig.from_yaml(text))
        except pydantic.ValidationError as exc:
            return self._reject(f"invalid {self.path}: {describe_validation_error(exc)}")
        except Exception as exc:  # YAML syntax, not a mapping
            return self._reject(f"invalid {self.path}: {type(exc).__name__}: {exc}")
        ignored = self._restart_only_changes(self.current, new)
        if ignored:
            log.warning("config %s: changes to %s need a restart; ignored", self.path, ", ".join(ignored))
        if new.batching == self.current.batching:
            return "unchanged"
        try:
            self.apply(new.batching)
        except ValueError as exc:
            return self._reject(f"invalid {self.path}: {exc}")
        log.info(
            "config %s: batching settings applied: %s",
            self.path,
            ", ".join(
                f"{k}={v}"
                for k, v in new.batching.model_dump().items()
                if getattr(self.current.batching, k) != v
            ),
        )
        self.current = self.current.model_copy(update={"batching": new.batching})
        return "applied"

    def _reject(self, message: str) -> PollResult:
        log.error("%s; keeping the settings in force", message)
        self.on_error(message)
        return "error"

    @staticmethod
    def _restart_only_changes(old: RuntimeConfig, new: RuntimeConfig) -> list[str]:
        a: dict[str, Any] = old.model_dump()
        b: dict[str, Any] = new.model_dump()
        return [k for k in a if k != "batching" and a[k] != b[k]]

    async def run(self) -> None:
        """Poll forever (cancel the task to stop)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.poll_once()
            except Exception:  # never let the watcher die
                log.exception("config watcher failed")
