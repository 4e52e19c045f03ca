"""Exceptions shared by every transport."""


class TransportError(Exception):
    """Base class of every transport failure."""


class PeerClosedError(TransportError):
    """The other side closed the channel or died (SIGKILL included)."""


class ChannelClosedError(TransportError):
    """This endpoint was closed locally; waiting operations are woken with this."""


class DecodeError(TransportError):
    """A frame could not be decoded into the channel's message type; the endpoint stays usable."""


class AddressError(TransportError, ValueError):
    """A transport URL or address is malformed or unusable (e.g. an ipc path too long)."""
