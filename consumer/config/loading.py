"""Loading: the YAML file, with the environment's overrides, validated into ``Settings``.

Environment overrides use the prefix ``ARROWAGG_`` and ``__`` between levels, e.g.
``ARROWAGG_KAFKA__GROUP_ID``; ``KAFKA_BOOTSTRAP_SERVERS`` overrides the bootstrap servers.
An override's value is read as YAML (``5000`` is a number, ``[a, b]`` a list) unless the
key takes text. Errors name the variable a bad value came from.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    SecretStr,
    ValidationError,
)

from consumer.config.checks import cross_key_problems, one_line
from consumer.config.models import (
    BOOTSTRAP_ENV,
    ENV_PREFIX,
    ConfigError,
    KeyPath,
    Problem,
    Settings,
)
from consumer.config.planning import schema_from_problems


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
        raise ConfigError(f"{path}: not valid YAML ({one_line(err)})") from err
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
    # The pinned plan is derived once the keys it depends on are consistent.
    if problems := cross_key_problems(settings) or list(schema_from_problems(settings)):
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
                          f"({one_line(err)})") from None


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
