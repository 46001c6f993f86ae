"""The operator's log configuration: its own lines at the level asked, the libraries' chatter not."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from kubeinfer.operator import main
from kubeinfer.operator.settings import Settings

_LOGGERS = ("", "httpx", "kopf.objects", "aiohttp.access")


@pytest.fixture
def restored_logging() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    yield
    for lg, level, handlers in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers


def test_probe_access_lines_are_not_logged_at_info(restored_logging: None) -> None:
    """kopf's health endpoint logs an aiohttp access line per kubelet probe: dropped at INFO."""
    main._configure_logging(Settings(log_level="INFO"))
    assert not logging.getLogger("aiohttp.access").isEnabledFor(logging.INFO)
    assert logging.getLogger("kubeinfer.operator.autoscale").isEnabledFor(logging.INFO)


def test_debug_keeps_every_line(restored_logging: None) -> None:
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET)
    main._configure_logging(Settings(log_level="DEBUG"))
    assert logging.getLogger("aiohttp.access").isEnabledFor(logging.DEBUG)
