"""Byte-level mutations of valid messages, shared by the fuzz tests of the wire format
(tests/producer/test_wire.py) and of the daemon's input path (tests/consumer/)."""

from __future__ import annotations

from hypothesis import strategies as st


def mutated(seed: bytes, data: st.DataObject) -> bytes:
    """``seed`` with 1 to 6 bytes flipped, runs cut or bytes inserted, as drawn."""
    value = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(value) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            value[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del value[at : at + data.draw(st.integers(1, 64))]
        else:
            value[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        if not value:
            break
    return bytes(value)
