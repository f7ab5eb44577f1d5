"""``python -m consumer check``: the effective configuration, the windows in words, and
what an operator would want to be warned about before the daemon runs.

Pure text from the settings and, when the broker was asked, the topics as they are on it;
the command line does the asking.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from consumer.config import LoadedConfig, Settings, WindowSettings, window_kind
from consumer.kafka.topics import TopicState

_SECRET_KEY = re.compile(r"password|secret|jaas|token|\.pem$")
MASK = "**********"
# librdkafka keys whose raw override undoes what exactly-once stands on.
_EXACTLY_ONCE_KEYS: dict[str, dict[str, object]] = {
    "consumer": {"isolation.level": "read_committed", "enable.auto.commit": False,
                 "group.id": None, "enable.auto.offset.store": False},
    "producer": {"transactional.id": None, "enable.idempotence": True, "acks": "all"},
}
_MANY_WINDOWS_PER_ROW = 10


def effective_config(config: LoadedConfig) -> str:
    """The settings as YAML, secrets masked; each key set by the environment carries a
    comment naming its variable, each key left at its default says so."""
    lines = [f"# {config.source}, with the environment's overrides; secrets masked"]
    lines += _render(config.settings, "", config.overrides, 0)
    return "\n".join(lines)


def _render(model: BaseModel, prefix: str, overrides: Mapping[str, str],
            depth: int) -> Iterator[str]:
    indent = "  " * depth
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        note = _note(key, given=name in model.model_fields_set, overrides=overrides)
        if isinstance(value, BaseModel):
            yield f"{indent}{name}:{note}"
            yield from _render(value, f"{key}.", overrides, depth + 1)
        elif isinstance(value, dict) and value:
            yield f"{indent}{name}:{note}"
            for raw_key, raw in value.items():
                shown = MASK if _SECRET_KEY.search(raw_key) else raw
                yield f"{indent}  {raw_key}: {_scalar(shown)}"
        else:
            dumped = model.model_dump(mode="json", include={name})[name]
            yield f"{indent}{name}: {_scalar(dumped)}{note}"


def _note(key: str, *, given: bool, overrides: Mapping[str, str]) -> str:
    for dotted, variable in overrides.items():
        if key == dotted or key.startswith(dotted + "."):
            return f"  # from {variable}"
    return "" if given else "  # default"


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def describe_windows(settings: Settings) -> str:
    """The window settings in words."""
    window, output = settings.window, settings.output
    if window.kind == "count":
        return _count_words(window)
    if window.kind == "session":
        shape, bounds = _session_words(window)
    else:
        assert window.size_ms is not None  # noqa: S101 - checked by the config model
        step = window.step_ms or window.size_ms
        shape = (f"tumbling windows of {_duration(window.size_ms)}"
                 if window.kind == "tumbling"
                 else f"hopping windows of {_duration(window.size_ms)} every "
                      f"{_duration(step)} (each row counts in {-(-window.size_ms // step)} "
                      "windows)")
        bounds = ("aligned to the epoch (a window starts at a multiple of its "
                  f"{'size' if window.kind == 'tumbling' else 'step'})")
    if window.time == "processing" and window.kind == "session":
        return (f"{shape}, by processing time: each message's Kafka timestamp is the time "
                f"of its rows; {bounds}. A session closes when the clock passes its end.")
    if window.time == "processing":
        return (f"{shape}, by processing time, {bounds}: a message's rows fall in the window "
                "of the moment the daemon reads them, and a window closes when the clock "
                "passes its end. No row is ever late.")
    return (f"{shape}, by event time from column {window.timestamp_column!r} (a timestamp, "
            f"or an integer read as epoch milliseconds), {bounds}. A window closes once the "
            "watermark passes its end: the oldest, over the input partitions, of the newest "
            f"event time read, less allowed_lateness_ms ({_duration(window.allowed_lateness_ms)}"
            f"). A partition with no message for idle_timeout_ms "
            f"({_duration(window.idle_timeout_ms)}) and no backlog stops holding it back. "
            f"{_late_words(window, output.late_topic)}")


def _late_words(window: WindowSettings, late_topic: str | None) -> str:
    late = (f"sent to {late_topic}" if late_topic
            else "counted and dropped (no output.late_topic)")
    if window.late == "drop":
        return "Rows for a window already closed are late: counted and dropped (late: drop)."
    if window.late == "topic" or window.revision_lateness_ms is None:
        return f"Rows for a window already closed are late: {late}."
    if window.kind == "session":
        return (f"An emitted session is kept until the watermark is revision_lateness_ms "
                f"({_duration(window.revision_lateness_ms)}) past its end: a late row within "
                "that extends it, or bridges two, and the merged session goes out again as "
                "a revision that names the sessions it replaces (arrowagg.revision-kind: "
                f"update, column replaces). Rows later than that are late: {late}.")
    return (f"A closed window is kept until the watermark is revision_lateness_ms "
            f"({_duration(window.revision_lateness_ms)}) past its end: a late row within that "
            "is merged into it, and at the next commit the groups it changed go out again "
            "as the window's next revision (arrowagg.revision-kind: update). Later rows are "
            f"late: {late}.")


def _session_words(window: WindowSettings) -> tuple[str, str]:
    assert window.gap_ms is not None  # noqa: S101 - checked by the config model
    most = (f", at most {_duration(window.max_session_ms)} long (cut at its multiples since "
            "the epoch)" if window.max_session_ms else "")
    return (f"session windows per keys with a gap of {_duration(window.gap_ms)}{most}",
            ("a session runs from its first row's time to its last row's time plus the gap, "
            "and a row within the gap of two sessions merges them"))


def _count_words(window: WindowSettings) -> str:
    limits = [f"{window.count_batches} messages" if window.count_batches else "",
              f"{window.count_rows} rows" if window.count_rows else ""]
    return ("count windows: a window closes after " + " or ".join(filter(None, limits))
            + " (a message is never split), or after idle_timeout_ms "
            f"({_duration(window.idle_timeout_ms)}) without input. Its window_start and "
            "window_end are processing times: when its first message was read, and when "
            "it closed.")


def warnings(settings: Settings, topics: Mapping[str, TopicState] | None) -> list[str]:
    """What may surprise an operator; ``topics`` (None: the broker was not asked) as
    they are on the broker."""
    return [*_plan_warnings(settings), *_window_warnings(settings, topics),
            *_output_warnings(settings, topics), *_guarantee_warnings(settings)]


def _plan_warnings(settings: Settings) -> Iterator[str]:
    aggregation = settings.aggregation
    if aggregation.schema_from is not None:
        return
    each = (" (and each instance of the scale-out its own, which stage 2 cannot merge "
            "when they differ)") if settings.scale_out is not None else ""
    if aggregation.keys is None:
        yield ("aggregation.schema_from is not set: the plan will be derived from whichever "
               f"message with rows arrives first{each}; its string and timestamp columns "
               "become the keys, and a message without one of them is dead-lettered "
               "(schema-mismatch). Pin it: aggregation.schema_from: FILE (an Arrow or "
               "Parquet file with the input's schema), or list aggregation.keys")
    else:
        yield ("aggregation.schema_from is not set: aggregation.keys fixes the keys, but the "
               "aggregates and their types will come from whichever message with rows "
               f"arrives first{each}; pin them with aggregation.schema_from: FILE")


def _window_warnings(settings: Settings,
                     topics: Mapping[str, TopicState] | None) -> Iterator[str]:
    window = settings.window
    if window.kind != "count" and window.time == "event":
        if window.allowed_lateness_ms == 0 and _input_partitions(settings, topics) != 1:
            yield ("window.allowed_lateness_ms is 0: a window closes as soon as every input "
                   "partition has read a row past its end, and its rows that come after are "
                   "late; producers sharing a partition rarely deliver in event-time order: "
                   "allow for their disorder")
        if window.size_ms is not None and window.idle_timeout_ms < window.size_ms:
            yield (f"window.idle_timeout_ms ({_duration(window.idle_timeout_ms)}) is shorter "
                   f"than a window ({_duration(window.size_ms)}): a producer pausing longer "
                   "than that no longer holds windows open, and its next rows may be late")
        if (window.step_ms and window.size_ms
                and window.size_ms // window.step_ms > _MANY_WINDOWS_PER_ROW):
            yield (f"each row is aggregated in {window.size_ms // window.step_ms} hopping "
                   "windows (size_ms / step_ms): that many times the work and state")
    elif window.timestamp_column is not None and window.timestamp_column not in (
            settings.aggregation.keys or ()):
        yield (f"window.timestamp_column {window.timestamp_column!r} is not used by "
               f"{window_kind(window)} windows: the column is skipped, not a key (list it in "
               "aggregation.keys to group by it)")


def _input_partitions(settings: Settings,
                      topics: Mapping[str, TopicState] | None) -> int | None:
    """How many input partitions there are (None: unknown, or not all created yet)."""
    if topics is None or any(t not in topics for t in settings.input.topics):
        return None
    return sum(topics[t].partitions for t in settings.input.topics)


def _output_warnings(settings: Settings,
                     topics: Mapping[str, TopicState] | None) -> Iterator[str]:
    output, window = settings.output, settings.window
    event_time = window.kind != "count" and window.time == "event"
    if output.late_topic is None and event_time and window.late != "drop":
        beyond = " later than window.revision_lateness_ms" if window.late == "revise" else ""
        yield (f"output.late_topic is not set: late rows{beyond} are counted "
               "(arrowagg_late_rows_total) and dropped")
    if window.late == "revise" and window.revision_lateness_ms is not None:
        yield ("window.late is revise: the committed offsets stay at the input of the windows "
               f"kept for revisions, so consumer lag shows up to "
               f"{_duration(window.revision_lateness_ms)} of event time more and a restart "
               "replays it; subscribers keep the latest revision of each (window, keys)")
    if output.dlq_topic is None:
        yield ("output.dlq_topic is not set: rejected messages are logged and dropped, and "
               "cannot be looked at later (tail --dlq)")
        return
    known = topics or {}
    dlq = known.get(output.dlq_topic)
    inputs = [known[t].max_message_bytes for t in settings.input.topics if t in known]
    largest = max((size for size in inputs if size is not None), default=None)
    if dlq is not None and dlq.max_message_bytes is not None and largest is not None and (
            dlq.max_message_bytes < largest):
        yield (f"the dead-letter topic {output.dlq_topic} takes messages of at most "
               f"{dlq.max_message_bytes} bytes, an input topic up to {largest}: a rejected "
               "message larger than the dead-letter topic takes cannot be dead-lettered")


def _guarantee_warnings(settings: Settings) -> Iterator[str]:
    if settings.processing.guarantee != "exactly_once":
        return
    if settings.processing.instance_id is None:
        yield ("processing.instance_id is not set: the host name "
               f"({socket.gethostname()}) names the instance; keep it stable across "
               "restarts (a container gets a new host name each time), or a restarted "
               "instance cannot fence the transactions of its predecessor")
    for role, keys in _EXACTLY_ONCE_KEYS.items():
        raw = getattr(settings.kafka, role)
        for key, safe in keys.items():
            if key in raw and raw[key] != safe:
                yield (f"kafka.{role}.{key} overrides a setting exactly-once depends on "
                       f"({'arrowagg sets it' if safe is None else f'it must be {safe!r}'})")


def _duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    if ms >= 1_000:
        return f"{ms / 1_000:g} s"
    return f"{ms} ms"
