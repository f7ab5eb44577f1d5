"""SIGHUP: re-read the config file and apply what can change without a restart.

Only the logging section is applied in place. Every other changed key is named in the
log as needing a restart (its value is never logged: it may be a secret); the running
configuration stays as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from consumer.config import ConfigError, Settings, load_settings
from consumer.service.logs import configure_logging

log = logging.getLogger(__name__)

RELOADABLE = frozenset({"logging.level", "logging.format"})


def changed_keys(old: Settings, new: Settings) -> list[str]:
    """Dotted names of the leaves that differ, e.g. ``window.size_ms``."""
    before, after = dict(_leaves(old.model_dump())), dict(_leaves(new.model_dump()))
    return sorted(key for key in before.keys() | after.keys()
                  if before.get(key) != after.get(key))


def _leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):  # an empty one has no leaves
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


class ConfigReloader:
    def __init__(self, path: Path, settings: Settings, *,
                 apply_logging: Callable[[Settings], None] | None = None) -> None:
        self._path = path
        self._applied = settings
        self._apply_logging = apply_logging or _configure_logging

    @property
    def settings(self) -> Settings:
        """The running configuration plus what the reloads applied."""
        return self._applied

    def reload(self) -> list[str]:
        """Apply the reloadable changes; return the changed keys that need a restart."""
        try:
            new = load_settings(self._path)
        except ConfigError as err:
            problem = str(err)
        else:
            return self._apply(new)
        for line in problem.splitlines():  # one line each, no traceback
            log.error("reload: %s; keeping the running configuration", line)
        return []

    def _apply(self, new: Settings) -> list[str]:
        changed = changed_keys(self._applied, new)
        applied = [key for key in changed if key in RELOADABLE]
        pending = [key for key in changed if key not in RELOADABLE]
        if applied:
            self._applied = self._applied.model_copy(update={"logging": new.logging})
            self._apply_logging(self._applied)
        log.info("reload of %s: applied %s", self._path, ", ".join(applied) or "nothing")
        if pending:
            log.warning("reload: not applied, these changed keys need a restart: %s",
                        ", ".join(pending))
        return pending


def _configure_logging(settings: Settings) -> None:
    configure_logging(settings.logging.level, settings.logging.format)
