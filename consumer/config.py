"""The daemon's configuration: frozen pydantic models loaded from YAML, overridden by env.

Each component receives its own sub-model (``settings.window``, ``settings.output``, ...),
never the whole ``Settings`` or ``os.environ``. Raw librdkafka keys pass through untouched
in ``kafka.consumer`` and ``kafka.producer``.

Environment overrides use the prefix ``ARROWAGG_`` and ``__`` between levels, e.g.
``ARROWAGG_KAFKA__GROUP_ID``; ``KAFKA_BOOTSTRAP_SERVERS`` overrides the bootstrap servers.
An override's value is read as YAML (``5000`` is a number, ``[a, b]`` a list) unless the
key takes text. Errors name the variable a bad value came from.

Values are strict: a number of milliseconds is a YAML integer, never ``true``, ``1.5`` or
``"1000"``. What validates one key at a time is followed by checks across keys: window
keys that do not apply to the window's kind, topics used twice, and the raw librdkafka
keys, which librdkafka itself is asked about.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

import yaml
from confluent_kafka import Consumer, KafkaException, Producer
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    Strict,
    StringConstraints,
    ValidationError,
    model_validator,
)

from consumer.core.plan import AggFunc
from wire.errors import UsageError

ENV_PREFIX = "ARROWAGG_"
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"

LibrdkafkaValue = str | int | float | bool
KeyPath = tuple[str | int, ...]


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
    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
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
    kind: Literal["tumbling", "hopping", "count"] = "tumbling"
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

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kind == "count":
            if self.count_batches is None and self.count_rows is None:
                raise ValueError("count windows need count_batches or count_rows")
            return self
        if self.size_ms is None:
            raise ValueError(f"{self.kind} windows need size_ms")
        if self.kind == "hopping" and (self.step_ms is None or self.step_ms > self.size_ms):
            raise ValueError("hopping windows need step_ms, at most size_ms")
        if self.time == "event" and not self.timestamp_column:
            raise ValueError("event-time windows need timestamp_column")
        return self


class AggregationSettings(_Section):
    keys: list[str] | None = None
    columns: dict[str, AggFunc] = Field(default_factory=dict)


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


class ServiceSettings(_Section):
    """How the daemon is watched: HTTP /metrics, /healthz, /readyz, librdkafka stats."""

    http_host: str = "127.0.0.1"
    http_port: int | None = Field(default=9464, ge=0, le=65535)  # None: no HTTP server
    statistics_interval_ms: int = Field(default=5_000, ge=0)     # 0: no librdkafka stats
    # /healthz turns 503 when the main loop has not turned for this long. A turn can take
    # a whole flush (a transaction commit) or a rebalance callback: keep it generous.
    liveness_timeout_s: PositiveFloat = 60.0


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


@dataclass(frozen=True)
class LoadedConfig:
    """Settings and where they came from: the file, and the environment variables that
    override some of its keys (dotted key -> variable name)."""

    settings: Settings
    source: str
    overrides: Mapping[str, str] = field(default_factory=dict)


def load_settings(path: Path) -> Settings:
    """Read ``path``, apply environment overrides, validate; raise ConfigError."""
    return load_config(path).settings


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """``load_settings``, keeping which keys the environment set."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_one_line(err)})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return config_from_dict(data, source=str(path), environ=environ)


def settings_from_dict(data: dict[str, Any], *, source: str = "config",
                       environ: Mapping[str, str] | None = None) -> Settings:
    """Validate ``data`` (the YAML document) with the environment's overrides applied."""
    return config_from_dict(data, source=source, environ=environ).settings


def config_from_dict(data: dict[str, Any], *, source: str = "config",
                     environ: Mapping[str, str] | None = None) -> LoadedConfig:
    overrides = _environment_overrides(os.environ if environ is None else environ)
    for path, (variable, raw) in overrides.items():
        data = _with_value(data, path, _env_value(path, raw, variable))
    origins = _Origins(source, {path: variable for path, (variable, _) in overrides.items()})
    try:
        settings = Settings(**data)
    except ValidationError as err:
        raise ConfigError(origins.describe(_problems(err))) from None
    if problems := [*_window_key_problems(settings.window), *_topic_problems(settings),
                    *_scale_out_problems(settings), *_librdkafka_problems(settings.kafka)]:
        raise ConfigError(origins.describe(problems))
    return LoadedConfig(settings, source,
                        {_dotted(path): name for path, name in origins.variables.items()})


# -- environment overrides ---------------------------------------------------------------


def _environment_overrides(environ: Mapping[str, str]) -> dict[KeyPath, tuple[str, str]]:
    """Key path -> (variable, raw value), outer keys before inner ones, so that
    ``ARROWAGG_KAFKA__GROUP_ID`` refines a whole ``ARROWAGG_KAFKA`` document."""
    found: dict[KeyPath, tuple[str, str]] = {}
    if environ.get(BOOTSTRAP_ENV):  # set but empty is taken as unset, as before
        found[("kafka", "bootstrap_servers")] = (BOOTSTRAP_ENV, environ[BOOTSTRAP_ENV])
    prefixed = [(name, value) for name, value in environ.items()
                if name.upper().startswith(ENV_PREFIX)]
    for name, value in sorted(prefixed, key=lambda item: (item[0].count("__"), item[0])):
        # The prefixed name wins over KAFKA_BOOTSTRAP_SERVERS, as the more specific one.
        path = tuple(part.lower() for part in name[len(ENV_PREFIX):].split("__"))
        found.pop(path, None)
        found[path] = (name, value)
    return found


def _env_value(path: KeyPath, raw: str, variable: str) -> Any:
    """Text keys take the variable as it is; the others read it as YAML."""
    if _takes_text(_annotation_at(path)):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"environment variable {variable}: not a valid YAML value "
                          f"({_one_line(err)})") from None


def _annotation_at(path: KeyPath) -> Any:
    """The type annotation of the key at ``path`` (None: no such key, or a raw value)."""
    model: type[BaseModel] = Settings
    for depth, part in enumerate(path):
        found = model.model_fields.get(str(part))
        if found is None:
            return None
        if depth == len(path) - 1:
            return found.annotation
        models = [arg for arg in _union_members(found.annotation)
                  if isinstance(arg, type) and issubclass(arg, BaseModel)]
        if not models:
            return None  # inside a mapping, e.g. a raw librdkafka key
        model = models[0]
    return None


def _union_members(annotation: Any) -> list[Any]:
    if get_origin(annotation) is Annotated:
        return _union_members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [member for arg in get_args(annotation) for member in _union_members(arg)]
    return [annotation]


def _takes_text(annotation: Any) -> bool:
    members = [m for m in _union_members(annotation) if m is not type(None)]
    if not members:
        return False
    for member in members:
        if get_origin(member) is Literal:
            if not all(isinstance(value, str) for value in get_args(member)):
                return False
        elif member not in (str, SecretStr, Path):
            return False
    return True


def _with_value(data: dict[str, Any], path: KeyPath, value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at ``path``; mappings merge into mappings."""
    head, rest = str(path[0]), path[1:]
    current = data.get(head)
    if rest:
        value = _with_value(current if isinstance(current, dict) else {}, rest, value)
    elif isinstance(current, dict) and isinstance(value, dict):
        value = {**current, **value}
    return {**data, head: value}


# -- problems, and where each came from --------------------------------------------------

Problem = tuple[KeyPath, str]


@dataclass(frozen=True)
class _Origins:
    source: str
    variables: dict[KeyPath, str]

    def describe(self, problems: list[Problem]) -> str:
        return "\n".join(f"{self.origin(loc)}: {_dotted(loc) or '(top level)'}: {message}"
                         for loc, message in problems)

    def origin(self, loc: KeyPath) -> str:
        """The variable that set ``loc`` (or a section holding it), else the file; the
        file and the variables that set keys inside a section named as a whole."""
        for path, variable in self.variables.items():
            if loc[:len(path)] == path:
                return f"environment variable {variable}"
        inside = [v for p, v in self.variables.items() if p[:len(loc)] == loc]
        if inside:
            plural = "s" if len(inside) > 1 else ""
            return f"{self.source} with environment variable{plural} {', '.join(inside)}"
        return self.source


def _dotted(loc: KeyPath) -> str:
    return ".".join(str(part) for part in loc)


def _problems(err: ValidationError) -> list[Problem]:
    return [(tuple(problem["loc"]), _message(problem)) for problem in err.errors()]


_PLAIN_MESSAGES = {
    "extra_forbidden": "unknown key (check its spelling and section)",
    "string_type": "must be text (put it in quotes)",
    "string_too_short": "must not be empty",
}


def _message(problem: Any) -> str:
    kind, value = problem["type"], problem.get("input")
    if kind in _PLAIN_MESSAGES:
        return _PLAIN_MESSAGES[kind]
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be a whole number, not {_shown(value)}"
    if kind in {"float_type", "float_parsing"}:
        return f"must be a number, not {_shown(value)}"
    if kind == "string_pattern_mismatch":
        return (f"{value!r} is not a valid Kafka topic name (letters, digits, '.', '_' and "
                "'-', at most 249 of them)")
    return str(problem["msg"]).removeprefix("Value error, ")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"the text {value!r} (write it without quotes)"
    if isinstance(value, float):
        return f"{value!r} (a fraction)"
    return f"{type(value).__name__} {value!r}"


# -- checks across keys ------------------------------------------------------------------

def window_kind(window: WindowSettings) -> str:
    """``count``, or e.g. ``event-time tumbling``."""
    return "count" if window.kind == "count" else f"{window.time}-time {window.kind}"


def _window_key_owners(window: WindowSettings) -> dict[str, tuple[str, bool]]:
    """Window key -> (the windows it belongs to, whether these windows are such)."""
    timed = window.kind != "count"
    event = timed and window.time == "event"
    return {
        "time": ("tumbling and hopping windows", timed),
        "size_ms": ("tumbling and hopping windows", timed),
        "step_ms": ("hopping windows (tumbling ones advance by size_ms)",
                    window.kind == "hopping"),
        "allowed_lateness_ms": ("event-time windows", event),
        "idle_timeout_ms": ("event-time and count windows", event or not timed),
        "count_batches": ("count windows", not timed),
        "count_rows": ("count windows", not timed),
    }


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


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
