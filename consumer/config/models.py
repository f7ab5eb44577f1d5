"""The settings: frozen, strict pydantic models, one section each.

Each component receives its own sub-model (``settings.window``, ``settings.output``, ...),
never the whole ``Settings`` or ``os.environ``. Raw librdkafka keys pass through untouched
in ``kafka.consumer`` and ``kafka.producer``. Values are strict: a number of milliseconds
is a YAML integer, never ``true``, ``1.5`` or ``"1000"``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    Strict,
    StringConstraints,
    model_validator,
)

from consumer.core.expressions import ExpressionError, parse_expression
from consumer.core.plan import AggFunc
from wire.broker import DEFAULT_BOOTSTRAP
from wire.errors import UsageError

ENV_PREFIX = "ARROWAGG_"
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"

LibrdkafkaValue = str | int | float | bool
KeyPath = tuple[str | int, ...]
# A key that is wrong, and what is wrong with it.
Problem = tuple[KeyPath, str]


def _not_dots(name: str) -> str:
    if name in {".", ".."}:
        raise ValueError(f"{name!r} is not a valid Kafka topic name")
    return name


# Kafka's own rule for topic names.
TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$"),
                      AfterValidator(_not_dots)]
# Strict models take paths as YAML strings.
FilePath = Annotated[Path, Strict(strict=False)]


class ConfigError(UsageError):
    """A configuration a user must mend; ``str()`` is one line per problem."""

    headline: ClassVar[str] = "bad configuration: "


class _Section(BaseModel):
    # strict: no bool for an int, no float or numeric string for an int, no number for text.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class SecuritySettings(_Section):
    """How every client (consumer, producer, admin) authenticates and encrypts.

    Secrets are ``SecretStr`` (never printed); the SASL password can come from the
    environment (``ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD``) or a file
    (``sasl_password_file``, e.g. a systemd credential), read when the config is loaded.
    """

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: FilePath | None = None
    ssl_ca_location: FilePath | None = None
    ssl_certificate_location: FilePath | None = None
    ssl_key_location: FilePath | None = None
    ssl_key_password: SecretStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_password_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("sasl_password_file"):
            return data
        if data.get("sasl_password"):
            raise ValueError("give sasl_password or sasl_password_file, not both")
        path = Path(data["sasl_password_file"])
        try:
            password = path.read_text().rstrip("\r\n")
        except OSError as err:
            raise ValueError(f"cannot read sasl_password_file {path} ({err.strerror})") from None
        if not password:
            raise ValueError(f"sasl_password_file {path} is empty")
        return {**data, "sasl_password": password}

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if not self.security_protocol.startswith("SASL_"):
            return self
        missing = [name for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                   if getattr(self, name) is None]
        if missing:
            raise ValueError(f"{self.security_protocol} needs {', '.join(missing)} "
                             "(the password may come from sasl_password_file or "
                             "ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD)")
        return self


class KafkaSettings(_Section):
    bootstrap_servers: str = Field(default=DEFAULT_BOOTSTRAP, min_length=1)
    group_id: str = Field(default="arrowagg", min_length=1)
    client_id: str = "arrowagg"
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    consumer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    producer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)


class InputSettings(_Section):
    topics: list[TopicName] = Field(min_length=1)
    max_message_bytes: PositiveInt = 16 * 1024 * 1024
    max_rows_per_message: PositiveInt = 10_000_000
    max_decoded_bytes_per_message: PositiveInt = 1 << 30
    # Memory budget: distinct (window, keys) groups held across open windows. When it is
    # reached, the open windows are emitted as non-final revisions and start afresh;
    # "pause" first pauses the partitions ahead of the watermark at 80% of it
    # (consumer/core/budget.py).
    max_groups: PositiveInt = 5_000_000
    over_budget: Literal["pause", "emit_early"] = "pause"
    # The same budget for the values held by aggregates that do not decompose (median,
    # quantile, n_unique, expressions): rows times the columns they read, about 8 bytes
    # each plus the group keys of each row (consumer/core/holistic.py).
    max_buffered_values: PositiveInt = 50_000_000


class DlqLimitSettings(_Section):
    """Stop the daemon when bad input becomes the norm rather than the exception."""

    max_invalid_ratio: float = Field(default=0.5, gt=0, le=1)
    window_messages: PositiveInt = 1_000   # the ratio is over the last N messages
    max_consecutive_invalid: PositiveInt = 1_000


class OutputSettings(_Section):
    topic: TopicName
    format: Literal["arrow", "json"] = "arrow"
    compression: Literal["none", "lz4", "zstd"] = "zstd"
    max_message_bytes: PositiveInt = 1_000_000
    late_topic: TopicName | None = None
    dlq_topic: TopicName | None = None


class WindowSettings(_Section):
    kind: Literal["tumbling", "hopping", "count", "session"] = "tumbling"
    time: Literal["event", "processing"] = "event"
    timestamp_column: str | None = None
    size_ms: PositiveInt | None = None
    step_ms: PositiveInt | None = None
    allowed_lateness_ms: int = Field(default=0, ge=0)
    # Rows whose event time is after the wall clock plus this are dead-lettered
    # (future-event-time) rather than let one bad clock move the watermark for good;
    # null: no bound. One hour, like the broker's log.message.timestamp.after.max.ms.
    max_future_ms: int | None = Field(default=3_600_000, ge=0)
    idle_timeout_ms: PositiveInt = 10_000
    count_batches: PositiveInt | None = None
    count_rows: PositiveInt | None = None
    # Session windows: a session ends after gap_ms without a row of its keys; with
    # max_session_ms, sessions are cut at its multiples since the epoch.
    gap_ms: PositiveInt | None = None
    max_session_ms: PositiveInt | None = None
    # A row for a window already emitted (event time): "topic" writes it to
    # output.late_topic (or counts it when none is set); "revise" merges it into the
    # window, kept until the watermark passes its end + revision_lateness_ms, and emits the
    # changed groups as the window's next revision (rows later than that: as "topic");
    # "drop" counts it. docs/wire-format.md, "Late-data revisions".
    late: Literal["topic", "revise", "drop"] = "topic"
    revision_lateness_ms: PositiveInt | None = None
    # Early results: every this many milliseconds (processing time), each open window
    # whose groups changed sends those groups' current results as a provisional revision
    # (final: false, kind: update); null: windows say nothing before they close.
    emit_every_ms: PositiveInt | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.late == "revise" and self.revision_lateness_ms is None:
            raise ValueError("late: revise needs revision_lateness_ms: how long past its "
                             "end an emitted window is kept for late rows to revise it")
        if self.late != "revise" and self.revision_lateness_ms is not None:
            raise ValueError(f"revision_lateness_ms applies to late: revise only, and late "
                             f"is {self.late}; remove it or set late: revise")
        if self.kind == "count":
            if self.count_batches is None and self.count_rows is None:
                raise ValueError("count windows need count_batches or count_rows")
            return self
        if self.kind == "session":
            return self._consistent_session()
        if self.size_ms is None:
            raise ValueError(f"{self.kind} windows need size_ms")
        if self.kind == "hopping" and (self.step_ms is None or self.step_ms > self.size_ms):
            raise ValueError("hopping windows need step_ms, at most size_ms")
        if self.time == "event" and not self.timestamp_column:
            raise ValueError("event-time windows need timestamp_column")
        return self

    def _consistent_session(self) -> Self:
        if self.gap_ms is None:
            raise ValueError("session windows need gap_ms")
        if self.size_ms is not None or self.step_ms is not None:
            raise ValueError("session windows take gap_ms (and max_session_ms), not "
                             "size_ms or step_ms")
        if self.time == "event" and not self.timestamp_column:
            raise ValueError("event-time windows need timestamp_column")
        return self


class QuantileSetting(_Section):
    """``{quantile: q}``: the q-quantile, interpolated linearly (SQL's quantile_cont)."""

    quantile: float = Field(ge=0, le=1)


class AggregationSettings(_Section):
    # An Arrow IPC or Parquet file whose schema fixes the plan at start (keys, aggregates
    # and their types), instead of the first message with rows, whichever comes first.
    schema_from: FilePath | None = None
    keys: list[str] | None = None
    columns: dict[str, AggFunc | QuantileSetting] = Field(default_factory=dict)
    # Output column -> an aggregate written as a Polars expression over each (window, keys)
    # group's rows, e.g. "pl.col('latency').quantile(0.99)"; parsed, never run as Python
    # (consumer/core/expressions.py).
    expressions: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _parsed(self) -> Self:
        for name, func in self.columns.items():
            if func == "quantile":
                raise ValueError(f"columns.{name}: a quantile needs its q, e.g. "
                                 f"{{{name}: {{quantile: 0.99}}}}")
        for name, text in self.expressions.items():
            try:
                parse_expression(text)
            except ExpressionError as err:
                raise ValueError(f"expressions.{name}: {err}") from None
        return self


class ProcessingSettings(_Section):
    guarantee: Literal["exactly_once", "at_least_once"] = "exactly_once"
    # Stable per instance (default: the host name). It names the static group member
    # (group.instance.id: a restarted instance takes its partitions back at once, without
    # waiting for the session timeout) and the transactional.id "<group_id>-<instance_id>"
    # (a restarted instance fences its predecessor and aborts what it left open).
    instance_id: str | None = Field(default=None, min_length=1)
    poll_max_messages: PositiveInt = 500
    poll_timeout_ms: PositiveInt = 200
    merge_every_batches: PositiveInt = 8
    commit_interval_ms: PositiveInt = 1_000


_PORT_RANGE = re.compile(r"(\d{1,5})-(\d{1,5})")
_HIGHEST_PORT = 65535


def _http_port(value: object) -> int | str | None:
    """A port (0: any free one), a range ``low-high`` whose first free port is taken
    (Flink's Prometheus reporter takes ranges for the same reason: several instances on
    one host), or None."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)
                         and 0 <= value <= _HIGHEST_PORT):
        return value
    matched = _PORT_RANGE.fullmatch(value) if isinstance(value, str) else None
    if matched and 1 <= int(matched[1]) <= int(matched[2]) <= _HIGHEST_PORT:
        return f"{int(matched[1])}-{int(matched[2])}"
    shown = str(value).lower() if isinstance(value, bool) else repr(value)
    raise ValueError(f"must be a port (0: any free one), a range of ports like 9464-9474, "
                     f"or null for no HTTP server; not {shown}")


HttpPort = Annotated[int | str | None, PlainValidator(_http_port)]


class ServiceSettings(_Section):
    """How the daemon is watched: HTTP /metrics, /healthz, /readyz, librdkafka stats."""

    http_host: str = "127.0.0.1"
    # A port, 0 for any free one, a range whose first free port is taken (several
    # instances on one host each take their own), or None for no HTTP server. The port
    # taken is logged and written where `python -m consumer.healthcheck` finds it.
    http_port: HttpPort = "9464-9474"
    statistics_interval_ms: int = Field(default=5_000, ge=0)     # 0: no librdkafka stats
    # /healthz turns 503 when the main loop has not turned for this long. A turn can take
    # a whole flush (a transaction commit) or a rebalance callback: keep it generous.
    liveness_timeout_s: PositiveFloat = 60.0

    def http_ports(self) -> tuple[int, ...]:
        """The ports to try, in order (empty: no HTTP server)."""
        if self.http_port is None:
            return ()
        if isinstance(self.http_port, int):
            return (self.http_port,)
        low, high = (int(part) for part in self.http_port.split("-"))
        return tuple(range(low, high + 1))


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class ScaleOutSettings(_Section):
    """Two-stage scale-out (docs/design.md, "Scale-out"): every instance pre-aggregates its
    input partitions into partial states, sent by a hash of the group keys to the
    repartition topic; every instance merges the repartition partitions it owns and
    emits a window when every input partition is past it. Start more identical
    instances to scale; the output has one row per (window, keys)."""

    repartition_topic: str = Field(min_length=1)
    # Created with this many partitions when missing: stage 2's parallelism (at most one
    # busy instance per partition). Keep it at least the number of instances.
    partitions: PositiveInt = 12
    replication_factor: PositiveInt | None = None  # None: the broker's default
    # How stage 1 compresses the partial states it sends. They live on the repartition
    # topic only until stage 2 has read them, and every window's pass through it pays for
    # the codec twice (stage 1 encodes, stage 2 decodes): the default trades bytes for
    # speed, where output.compression (what subscribers keep) favours bytes.
    compression: Literal["none", "lz4", "zstd"] = "lz4"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    input: InputSettings
    output: OutputSettings
    window: WindowSettings
    aggregation: AggregationSettings = Field(default_factory=AggregationSettings)
    processing: ProcessingSettings = Field(default_factory=ProcessingSettings)
    dlq_limit: DlqLimitSettings = Field(default_factory=DlqLimitSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    scale_out: ScaleOutSettings | None = None  # None: each instance emits its own windows
