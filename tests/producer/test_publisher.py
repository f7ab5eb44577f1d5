"""The publisher's failure paths, against an address where no broker listens.

The happy path runs against a real broker in tests/integration/test_publisher.py.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from producer.generate import sensor_batch
from producer.publisher import Publisher, PublishError
from wire.input import decode_ipc_stream, schema_fingerprint

NOWHERE = "127.0.0.1:1"  # nothing listens on port 1: connections are refused at once


def test_check_topic_names_the_unreachable_servers_and_the_mend() -> None:
    publisher = Publisher(bootstrap_servers=NOWHERE, topic="t")
    with pytest.raises(PublishError) as caught:
        publisher.check_topic(timeout_s=1.0)
    message = str(caught.value)
    assert message.startswith(f"cannot reach Kafka at {NOWHERE} (")
    assert "Connection refused" in message or "transport" in message.lower()
    assert "\n" not in message
    publisher.close()


def test_undelivered_messages_make_flush_fail_in_one_line() -> None:
    publisher = Publisher(bootstrap_servers=NOWHERE, topic="t",
                          extra_config={"message.timeout.ms": 300})
    sent = publisher.publish(pl.DataFrame({"a": [1, 2, 3]}))
    sent += publisher.publish(pa.record_batch({"a": [4]}))
    assert sent == 2
    assert publisher.sent == 2
    with pytest.raises(PublishError, match=r"^2 of 2 messages to 't' failed \(first: ") as caught:
        publisher.flush(timeout_s=10.0)
    assert "\n" not in str(caught.value)
    assert (publisher.delivered, publisher.failed) == (0, 2)
    with pytest.raises(PublishError):
        publisher.close()
    publisher.close()  # a second close has nothing left to report


def test_an_empty_table_sends_nothing() -> None:
    with Publisher(bootstrap_servers=NOWHERE, topic="t") as publisher:
        assert publisher.publish(pa.table({"a": pa.array([], pa.int64())})) == 0
    assert publisher.sent == 0


def publish_then_fail(publisher: Publisher) -> None:
    with publisher:
        publisher.publish(pa.table({"a": [1]}))
        raise KeyError("the caller's own failure")


def test_the_context_manager_lets_the_original_error_through() -> None:
    publisher = Publisher(bootstrap_servers=NOWHERE, topic="t",
                          extra_config={"message.timeout.ms": 200})
    # The undelivered message must not turn the caller's KeyError into a PublishError.
    with pytest.raises(KeyError, match="own failure"):
        publish_then_fail(publisher)


def test_each_publisher_has_its_own_id_unless_given_one() -> None:
    first, second = (Publisher(bootstrap_servers=NOWHERE, topic="t") for _ in range(2))
    named = Publisher(bootstrap_servers=NOWHERE, topic="t", producer_id="worker-1")
    assert first.producer_id != second.producer_id
    assert len(first.producer_id) == 32
    assert named.producer_id == "worker-1"
    for publisher in (first, second, named):
        publisher.close()


def test_a_message_limit_below_the_framing_room_is_refused() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        Publisher(bootstrap_servers=NOWHERE, topic="t", max_message_bytes=100)


def test_string_columns_go_out_dictionary_encoded_unless_turned_off() -> None:
    table = sensor_batch(rows=2_000, groups=50, start_ms=0, span_ms=1_000, seed=1)
    for dictionary, expected in ((True, pl.Categorical()), (False, pl.String())):
        publisher = Publisher(bootstrap_servers=NOWHERE, topic="t", max_message_bytes=40_000,
                              dictionary_strings=dictionary)
        fingerprint, values = publisher.encode(table)
        publisher.close()
        pieces = [decode_ipc_stream(value) for value in values]
        assert len(pieces) > 1
        assert {schema_fingerprint(p.schema) for p in pieces} == {fingerprint}
        frame = pl.from_arrow(pa.concat_tables(pieces))
        assert isinstance(frame, pl.DataFrame)
        assert frame.schema["site"] == frame.schema["sensor"] == expected
        plain = pl.from_arrow(table)
        assert isinstance(plain, pl.DataFrame)
        assert_frame_equal(frame.with_columns(pl.col("site", "sensor").cast(pl.String)), plain)
