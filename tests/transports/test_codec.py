"""The codec: typed msgspec decoding per channel, out-of-band Blobs, malformed frames, and
frames that any msgpack implementation can read."""

from __future__ import annotations

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transports as T
from tests.transports.conftest import run
from transports.codec import (
    AsyncTypedReceiver,
    AsyncTypedSender,
    Blob,
    Decoder,
    Encoder,
    TypedReceiver,
    TypedSender,
)


class Tensor(msgspec.Struct, tag="tensor"):
    name: str
    shape: list[int]
    data: Blob


class Note(msgspec.Struct, tag="note"):
    text: str
    tags: list[str] = []


Item = Tensor | Note


def test_typed_channel_round_trip_with_out_of_band_blob(transport: str) -> None:
    raw = bytes(range(256)) * 4096  # 1 MiB
    w = T.open_writer(transport)
    r = T.open_reader(w.address)
    with TypedSender(w) as tx, TypedReceiver(r, Decoder(Item)) as rx:
        tx.send(Tensor("w", [1024, 1024], Blob(raw)))
        tx.send(Note("hi", ["a"]))
        got = rx.recv(timeout=30)
        assert isinstance(got, Tensor) and got.shape == [1024, 1024]
        assert bytes(got.data) == raw
        assert rx.recv(timeout=10) == Note("hi", ["a"])


def test_large_blob_travels_out_of_band_small_one_inline() -> None:
    enc = Encoder(oob_threshold=1000)
    header, buffers = enc.encode(Tensor("t", [3], Blob(bytearray(5000))))
    assert len(buffers) == 1 and len(buffers[0]) == 5000 and len(header) < 100
    header, buffers = enc.encode(Tensor("t", [3], Blob(b"abc")))
    assert buffers == [] and b"abc" in header
    # A blob keeps pointing at the caller's memory: no copy on the way out.
    src = bytearray(4000)
    _, buffers = enc.encode(Tensor("t", [1], Blob(src)))
    src[0] = 7
    assert buffers[0][0] == 7


def test_frames_are_plain_msgpack() -> None:
    header, _ = Encoder().encode(Tensor("x", [2, 2], Blob(bytes(70_000))))
    plain = msgpack.unpackb(header)
    assert plain["type"] == "tensor" and plain["name"] == "x" and plain["shape"] == [2, 2]
    assert isinstance(plain["data"], msgpack.ExtType) and plain["data"].code == 1
    header, _ = Encoder().encode(Note("n", ["t"]))
    assert msgpack.unpackb(header) == {"type": "note", "text": "n", "tags": ["t"]}
    # And the other way round: a frame written by plain msgpack decodes to the typed struct.
    frame = msgpack.packb({"type": "note", "text": "from msgpack"})
    assert Decoder(Item).decode(frame) == Note("from msgpack")


@pytest.mark.parametrize("frame, cause", [
    (b"\xc1", "invalid"),  # a byte msgpack never uses
    (msgpack.packb({"type": "nope"}), "Invalid value 'nope'"),
    (msgpack.packb({"type": "note", "text": 5}), "Expected `str`, got `int`"),
    (msgpack.packb({"type": "note"}), "missing required field `text`"),
    (msgpack.packb({"type": "tensor", "name": "t", "shape": [1],
                    "data": msgpack.ExtType(1, b"\x00\x00\x00\x00")}), "buffer 0 is missing"),
    (msgpack.packb({"type": "tensor", "name": "t", "shape": [1],
                    "data": msgpack.ExtType(9, b"xx")}), "unknown msgpack ext type 9"),
])
def test_malformed_frames_raise_decode_error_naming_the_cause(frame: bytes, cause: str) -> None:
    dec = Decoder(Item)
    with pytest.raises(T.DecodeError, match=cause) as info:
        dec.decode(frame)
    assert isinstance(info.value.__cause__, (msgspec.DecodeError, msgspec.ValidationError,
                                             ValueError))
    assert dec.decode(msgpack.packb({"type": "note", "text": "ok"})) == Note("ok")


def test_malformed_frame_leaves_the_channel_usable(transport: str) -> None:
    async def body() -> None:
        w = await T.open_async_writer(transport)
        r = await T.open_async_reader(w.address)
        tx, rx = AsyncTypedSender(w), AsyncTypedReceiver(r, Decoder(Item))
        try:
            await w.send(b"\x93garbage")  # raw, not a Note
            await tx.send(Note("after"))
            with pytest.raises(T.DecodeError):
                await rx.recv(timeout=10)
            assert await rx.recv(timeout=10) == Note("after")
        finally:
            tx.close()
            rx.close()

    run(body())


def test_unencodable_object_names_its_type() -> None:
    with pytest.raises(TypeError, match="cannot encode a object"):
        Encoder().encode(Note("x", [object()]))  # type: ignore[list-item]


notes = st.builds(Note, st.text(max_size=50), st.lists(st.text(max_size=10), max_size=5))
tensors = st.builds(Tensor, st.text(max_size=20), st.lists(st.integers(0, 2**31), max_size=4),
                    st.binary(max_size=3000).map(Blob))


@settings(max_examples=200, deadline=None)
@given(item=notes | tensors, threshold=st.sampled_from([0, 100, 1 << 20]))
def test_encode_decode_property(item: Item, threshold: int) -> None:
    header, buffers = Encoder(oob_threshold=threshold).encode(item)
    assert Decoder(Item).decode(header, [memoryview(b) for b in buffers]) == item
