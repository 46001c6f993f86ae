"""``server.http_workers``: the config field, the CLI flag, and the port the front-end processes share."""

from __future__ import annotations

import socket

import pydantic
import pytest
import yaml
from kubeinfer.runtime.cli import build_parser, load_config
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.frontend_pool import reserve_port
from kubeinfer.runtime.rest import listen_socket


def test_flag_overrides_the_file_and_one_worker_keeps_the_file_as_before() -> None:
    args = build_parser().parse_args(["serve", "--http-workers", "3"])
    assert load_config(args).server.http_workers == 3
    assert load_config(build_parser().parse_args(["serve"])).server.http_workers == 1
    assert "http_workers" not in yaml.safe_load(RuntimeConfig().to_yaml())["server"]
    two = RuntimeConfig.model_validate({"server": {"http_workers": 2}})
    assert yaml.safe_load(two.to_yaml())["server"]["http_workers"] == 2
    assert RuntimeConfig.from_yaml(two.to_yaml()) == two


@pytest.mark.parametrize("bad", [0, -1, 65])
def test_out_of_range_is_refused_naming_the_field(bad: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="http_workers"):
        RuntimeConfig.model_validate({"server": {"http_workers": bad}})


def test_reserved_port_takes_no_connections_and_listeners_share_it() -> None:
    reserved = reserve_port("127.0.0.1", 0)
    port = reserved.getsockname()[1]
    try:
        # nobody listens yet: a connection is refused, not queued on the reserving socket
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        a = listen_socket("127.0.0.1", port, reuse_port=True)
        b = listen_socket("127.0.0.1", port, reuse_port=True)
        assert a.getsockname()[1] == b.getsockname()[1] == port
        clients = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(16)]
        accepted = 0
        for listener in (a, b):
            listener.setblocking(True)
            listener.settimeout(0.2)
            while True:
                try:
                    listener.accept()[0].close()
                    accepted += 1
                except TimeoutError:
                    break
        assert accepted == 16
        for c in clients:
            c.close()
        with pytest.raises(OSError):  # a listener without SO_REUSEPORT cannot join the group
            listen_socket("127.0.0.1", port)
        a.close()
        b.close()
    finally:
        reserved.close()
