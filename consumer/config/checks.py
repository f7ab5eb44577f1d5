"""Checks across keys, after each key is valid on its own: window keys that do not apply
to the window's kind, topics used twice, the scale-out's needs, and the raw librdkafka
keys, which librdkafka itself is asked about."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer

from consumer.config.models import (
    KafkaSettings,
    LibrdkafkaValue,
    Problem,
    Settings,
    WindowSettings,
)


def window_kind(window: WindowSettings) -> str:
    """``count``, or e.g. ``event-time tumbling``."""
    return "count" if window.kind == "count" else f"{window.time}-time {window.kind}"


def _window_key_owners(window: WindowSettings) -> dict[str, tuple[str, bool]]:
    """Window key -> (the windows it belongs to, whether these windows are such)."""
    timed = window.kind != "count"
    event = timed and window.time == "event"
    return {
        "time": ("tumbling, hopping and session windows", timed),
        "size_ms": ("tumbling and hopping windows", window.kind in {"tumbling", "hopping"}),
        "step_ms": ("hopping windows (tumbling ones advance by size_ms)",
                    window.kind == "hopping"),
        "allowed_lateness_ms": ("event-time windows", event),
        "idle_timeout_ms": ("event-time, session and count windows",
                            event or not timed or window.kind == "session"),
        "count_batches": ("count windows", not timed),
        "count_rows": ("count windows", not timed),
        "gap_ms": ("session windows", window.kind == "session"),
        "max_session_ms": ("session windows", window.kind == "session"),
        "late": ("event-time windows (no other has late rows)", event),
        "revision_lateness_ms": ("event-time windows", event),
    }


# The commit metadata carries the revision number of each window kept for revisions
# (consumer/core/offsets.py, Retention), and Kafka keeps at most 4096 bytes of it
# (offset.metadata.max.bytes): ~20 bytes a window.
MAX_RETAINED_WINDOWS = 150


def _revision_problems(window: WindowSettings) -> Iterator[Problem]:
    if window.revision_lateness_ms is None or window.size_ms is None:
        return
    kept = window.revision_lateness_ms // (window.step_ms or window.size_ms) + 1
    if kept > MAX_RETAINED_WINDOWS:
        yield (("window", "revision_lateness_ms"),
               (f"keeps up to {kept} emitted windows for revisions (revision_lateness_ms / "
                f"step); at most {MAX_RETAINED_WINDOWS} fit the commit metadata that numbers "
                "their revisions: shorten it or lengthen the windows"))


def _window_key_problems(window: WindowSettings) -> Iterator[Problem]:
    """A key set for another kind of window is rejected, never silently ignored (unless
    it is set to its default, which is as good as absent)."""
    owners = _window_key_owners(window)
    for key, spec in WindowSettings.model_fields.items():
        if key not in owners or owners[key][1] or key not in window.model_fields_set:
            continue
        if getattr(window, key) != spec.default:
            yield (("window", key),
                   (f"belongs to {owners[key][0]}, and these are {window_kind(window)} "
                    "windows; remove it (or change window.kind / window.time)"))


def _topic_problems(settings: Settings) -> Iterator[Problem]:
    inputs, output = settings.input.topics, settings.output
    for twice in sorted({t for t in inputs if inputs.count(t) > 1}):
        yield ("input", "topics"), f"lists {twice!r} more than once"
    if output.topic in inputs:
        yield (("output", "topic"), (f"{output.topic!r} is also an input topic: the daemon "
               "would read its own output back; give the output a topic of its own"))
    routes = {"late_topic": "late rows", "dlq_topic": "dead letters"}
    for key, what in routes.items():
        topic = getattr(output, key)
        if topic is None:
            continue
        if topic in inputs:
            yield (("output", key), (f"{topic!r} is also an input topic: the daemon would "
                   f"read its own {what} back as input; give them a topic of their own"))
        elif topic == output.topic:
            yield (("output", key), (f"{topic!r} is the output topic: subscribers would read "
                   f"{what} as windows; give them a topic of their own"))
    if output.late_topic is not None and settings.window.late == "drop":
        yield (("output", "late_topic"), ("window.late is drop: late rows are counted and "
               "dropped, never written; remove output.late_topic (or set window.late: "
               "topic)"))
    if output.late_topic is not None and output.late_topic == output.dlq_topic:
        yield (("output", "dlq_topic"), (f"{output.dlq_topic!r} is also output.late_topic; "
               "late rows and dead letters need a topic each"))


def _scale_out_problems(settings: Settings) -> Iterator[Problem]:
    scale_out = settings.scale_out
    if scale_out is None:
        return
    if settings.window.kind == "count":
        yield (("scale_out",), ("needs time windows: count windows count each instance's "
               "messages, which no two instances share"))
    output = settings.output
    if scale_out.repartition_topic in {*settings.input.topics, output.topic,
                                       output.late_topic, output.dlq_topic}:
        yield (("scale_out", "repartition_topic"), (f"{scale_out.repartition_topic!r} is "
               "already an input or output topic; give the repartition a topic of its own"))


def _librdkafka_problems(kafka: KafkaSettings) -> Iterator[Problem]:
    """Ask librdkafka about the raw keys: it builds a client from them (connecting to
    nothing) and says which it refuses, and which belong to the other kind of client."""
    for role in ("consumer", "producer"):
        raw: dict[str, LibrdkafkaValue] = getattr(kafka, role)
        if role == "consumer" and raw.get("group.id") == "":
            # An empty group.id aborts the process inside librdkafka.
            yield ("kafka", "consumer", "group.id"), "must not be empty"
            raw = {k: v for k, v in raw.items() if k != "group.id"}
        if not raw or _librdkafka_complaint(role, raw) is None:
            continue
        for key, value in raw.items():  # one at a time, to name the key
            if (complaint := _librdkafka_complaint(role, {key: value})) is not None:
                yield ("kafka", role, key), complaint


def _librdkafka_complaint(role: str, raw: Mapping[str, LibrdkafkaValue]) -> str | None:
    warnings = _Collected()
    config: dict[str, Any] = {**raw, "logger": warnings.logger}
    other = "producer" if role == "consumer" else "consumer"
    try:
        if role == "consumer":
            client: Consumer | Producer = Consumer({"group.id": "arrowagg-check", **config})
        else:
            client = Producer(config)
    except (KafkaException, TypeError, ValueError) as err:
        error = err.args[0] if err.args else err
        text = error.str() if hasattr(error, "str") else str(error)
        if text.startswith("No such configuration property"):
            return "librdkafka has no such property (check its spelling)"
        return f"librdkafka refuses it: {text}"
    client.poll(0)  # serves the log queue that carries librdkafka's warnings
    if isinstance(client, Consumer):
        client.close()
    if any(f"is a {other} property" in line for line in warnings.lines):
        return (f"a {other} property, which a {role} ignores; move it to kafka.{other}")
    return None


class _Collected(logging.Handler):
    """librdkafka's log lines while it looks at a configuration."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.logger = logging.Logger("librdkafka-check")
        self.logger.addHandler(self)
        self.logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())



def cross_key_problems(settings: Settings) -> list[Problem]:
    """What the one-key-at-a-time validation cannot see."""
    return [*_window_key_problems(settings.window), *_revision_problems(settings.window),
            *_topic_problems(settings),
            *_scale_out_problems(settings),
            *_librdkafka_problems(settings.kafka)]


def one_line(err: Exception) -> str:
    return " ".join(str(err).split())
