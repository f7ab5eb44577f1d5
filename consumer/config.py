"""The daemon's configuration: frozen pydantic models loaded from YAML, overridden by env.

Each component receives its own sub-model (``settings.window``, ``settings.output``, ...),
never the whole ``Settings`` or ``os.environ``. Raw librdkafka keys pass through untouched
in ``kafka.consumer`` and ``kafka.producer``.

Environment overrides use the prefix ``ARROWAGG_`` and ``__`` between levels, e.g.
``ARROWAGG_KAFKA__GROUP_ID``; ``KAFKA_BOOTSTRAP_SERVERS`` overrides the bootstrap servers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from consumer.plan import AggFunc

LibrdkafkaValue = str | int | float | bool


class ConfigError(Exception):
    """A configuration a user must mend; ``str()`` is one line per problem."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "arrowagg"
    client_id: str = "arrowagg"
    consumer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    producer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)


class InputSettings(_Section):
    topics: list[str] = Field(min_length=1)
    max_message_bytes: PositiveInt = 16 * 1024 * 1024
    max_rows_per_message: PositiveInt = 10_000_000
    max_decoded_bytes_per_message: PositiveInt = 1 << 30
    # Memory budget: distinct (window, keys) groups held across open windows. When it is
    # reached, the open windows are emitted as non-final revisions and start afresh.
    max_groups: PositiveInt = 5_000_000


class DlqLimitSettings(_Section):
    """Stop the daemon when bad input becomes the norm rather than the exception."""

    max_invalid_ratio: float = Field(default=0.5, gt=0, le=1)
    window_messages: PositiveInt = 1_000   # the ratio is over the last N messages
    max_consecutive_invalid: PositiveInt = 1_000


class OutputSettings(_Section):
    topic: str
    format: Literal["arrow", "json"] = "arrow"
    compression: Literal["none", "lz4", "zstd"] = "zstd"
    max_message_bytes: PositiveInt = 1_000_000
    late_topic: str | None = None
    dlq_topic: str | None = None


class WindowSettings(_Section):
    kind: Literal["tumbling", "hopping", "count"] = "tumbling"
    time: Literal["event", "processing"] = "event"
    timestamp_column: str | None = None
    size_ms: PositiveInt | None = None
    step_ms: PositiveInt | None = None
    allowed_lateness_ms: int = Field(default=0, ge=0)
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
    instance_id: str | None = None
    poll_max_messages: PositiveInt = 500
    poll_timeout_ms: PositiveInt = 200
    merge_every_batches: PositiveInt = 8
    commit_interval_ms: PositiveInt = 1_000


class ServiceSettings(_Section):
    """How the daemon is watched: HTTP /metrics, /healthz, /readyz, librdkafka stats."""

    http_host: str = "127.0.0.1"
    http_port: int | None = Field(default=9464, ge=0, le=65535)  # None: no HTTP server
    statistics_interval_ms: int = Field(default=5_000, ge=0)     # 0: no librdkafka stats


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix="ARROWAGG_", env_nested_delimiter="__",
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    input: InputSettings
    output: OutputSettings
    window: WindowSettings
    aggregation: AggregationSettings = Field(default_factory=AggregationSettings)
    processing: ProcessingSettings = Field(default_factory=ProcessingSettings)
    dlq_limit: DlqLimitSettings = Field(default_factory=DlqLimitSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],  # noqa: ARG003
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the YAML file (passed as init values).
        return env_settings, init_settings, file_secret_settings


def load_settings(path: Path) -> Settings:
    """Read ``path``, apply environment overrides, validate; raise ConfigError."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_one_line(err)})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return settings_from_dict(data, source=str(path))


def settings_from_dict(data: dict[str, Any], *, source: str = "config") -> Settings:
    """Validate ``data`` (the YAML document) with the environment's overrides applied."""
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        kafka = dict(data.get("kafka") or {})
        kafka["bootstrap_servers"] = bootstrap
        data = {**data, "kafka": kafka}
    try:
        return Settings(**data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for problem in err.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key (check its spelling and section)"
        lines.append(f"{source}: {key}: {message}")
    return "\n".join(lines)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
