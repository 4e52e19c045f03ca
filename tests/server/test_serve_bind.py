"""``bind_listeners``: the sockets ``python -m aioengine.serve`` binds before the engine starts,
and the address it then logs. Real sockets, no engine."""

from __future__ import annotations

import socket

import pytest

from aioengine.server.__main__ import BindError, bind_listeners, listen_urls


def _close(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_empty_host_is_every_interface_on_one_port():
    """``--host ''`` served on all interfaces before the early bind (asyncio's create_server
    reads '' as 'all'); with ``--port 0`` every socket gets the same free port."""
    socks = bind_listeners("", 0)
    try:
        addrs = [s.getsockname() for s in socks]
        assert {a[0] for a in addrs} <= {"0.0.0.0", "::"} and "0.0.0.0" in {a[0] for a in addrs}
        assert len({a[1] for a in addrs}) == 1, addrs
        port = addrs[0][1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        _close(socks)


def test_listen_urls_are_urls_for_ipv4_and_ipv6():
    assert listen_urls([("127.0.0.1", 8000)]) == ["http://127.0.0.1:8000"]
    assert listen_urls([("::1", 8000, 0, 0)]) == ["http://[::1]:8000"]
    assert listen_urls([("0.0.0.0", 80), ("::", 80, 0, 0)]) == [
        "http://0.0.0.0:80", "http://[::]:80"]


def test_a_taken_port_closes_what_it_bound_and_names_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=rf"cannot serve on 127\.0\.0\.1:{port}: .*in use"):
            bind_listeners("127.0.0.1", port)
