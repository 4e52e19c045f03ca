"""zmq addresses: ``ipc://PATH`` (or ``ipc://@name``) and ``tcp://HOST:PORT``; ``None`` is a
fresh name in the abstract namespace (``ipc://@aiot-zmq-...``: nothing on disk, ever). TCP binds
loopback unless the URL names another interface."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from transports._paths import abstract_name, check_not_other_file, check_unix_path
from transports.errors import AddressError


@dataclass(frozen=True, slots=True)
class ZmqAddress:
    endpoint: str  # what zmq bind()/connect() gets
    ipc_path: str | None = None  # a filesystem socket path we own once bound

    @property
    def url(self) -> str:
        return f"zmq+{self.endpoint}"


def parse(address: str | None, *, binding: bool) -> ZmqAddress:
    if address is None:
        if not binding:
            raise AddressError("the connecting side needs the binder's address "
                               "(zmq+ipc://PATH or zmq+tcp://HOST:PORT), not the short name 'zmq'")
        return ZmqAddress(f"ipc://{abstract_name('aiot-zmq-')}")
    wire, sep, rest = address.partition("://")
    url = f"zmq+{address}"
    if not sep:
        raise AddressError(f"not a zmq address: {url!r} (expected zmq+ipc://PATH or "
                           "zmq+tcp://HOST:PORT)")
    if wire == "ipc":
        if rest.startswith("@"):
            check_unix_path(rest, url)
            return ZmqAddress(f"ipc://{rest}")
        path = os.path.abspath(rest) if rest else ""
        check_unix_path(path, url)
        if binding:
            check_not_other_file(path, url)  # libzmq would unlink whatever is there
        return ZmqAddress(f"ipc://{path}", path if binding else None)
    if wire == "tcp":
        return ZmqAddress(_tcp(rest, url, binding))
    raise AddressError(f"zmq wire {wire!r} in {url!r} is not supported; use ipc or tcp")


def _tcp(rest: str, url: str, binding: bool) -> str:
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{url!r} needs HOST:PORT, e.g. zmq+tcp://127.0.0.1:0")
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"port {port_text!r} in {url!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"port {port} in {url!r} is out of range 0..65535")
    if port == 0 and not binding:
        raise AddressError(f"cannot connect to port 0 in {url!r}; pass the binder's .address")
    if host == "localhost":
        host = "127.0.0.1"
    if host.startswith("[") and host.endswith("]"):
        _check_ip(host[1:-1], url)
    elif host != "*" and binding:
        _check_ip(host, url)
    return f"tcp://{host}:{port}"


def _check_ip(host: str, url: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"bind host {host!r} in {url!r} must be an IP address "
                           "(127.0.0.1 for loopback, or * for every interface)") from None
