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

from consumer.config.checks import window_kind
from consumer.config.loading import (
    LoadedConfig,
    config_from_dict,
    load_config,
    load_settings,
    settings_from_dict,
)
from consumer.config.models import (
    AggregationSettings,
    ConfigError,
    DlqLimitSettings,
    InputSettings,
    KafkaSettings,
    LibrdkafkaValue,
    LoggingSettings,
    OutputSettings,
    ProcessingSettings,
    ScaleOutSettings,
    SecuritySettings,
    ServiceSettings,
    Settings,
    WindowSettings,
)
from consumer.config.planning import pinned_origin, pinned_schema, plan_for

__all__ = [
    "AggregationSettings", "ConfigError", "DlqLimitSettings", "InputSettings",
    "KafkaSettings", "LibrdkafkaValue", "LoadedConfig", "LoggingSettings", "OutputSettings",
    "ProcessingSettings", "ScaleOutSettings", "SecuritySettings", "ServiceSettings",
    "Settings", "WindowSettings", "config_from_dict", "load_config", "load_settings",
    "pinned_origin", "pinned_schema", "plan_for", "settings_from_dict", "window_kind",
]
