"""SIGHUP's reload: the logging section is applied, other changes are named, not applied."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from consumer.config import Settings, load_settings
from consumer.service.reload import ConfigReloader, changed_keys
from tests.conftest import REPO

SECRET = "hunter2-do-not-log"  # noqa: S105 - a test value that must not be logged


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    return path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_changed_keys_are_dotted_leaves(config: Path) -> None:
    before = load_settings(config)
    edit(config, "size_ms: 5000", "size_ms: 6000")
    edit(config, "consumer: {}", "consumer: {fetch.wait.max.ms: 50}")
    assert changed_keys(before, load_settings(config)) == [
        "kafka.consumer.fetch.wait.max.ms", "window.size_ms"]
    assert changed_keys(before, before) == []


def test_logging_is_applied_the_rest_named(config: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    applied: list[Settings] = []
    reloader = ConfigReloader(config, load_settings(config), apply_logging=applied.append)
    edit(config, "level: INFO", "level: DEBUG")
    edit(config, "size_ms: 5000", "size_ms: 6000")
    edit(config, "consumer: {}", "consumer: {sasl.password: " + SECRET + "}")
    with caplog.at_level(logging.INFO, "consumer.service.reload"):
        pending = reloader.reload()
    assert pending == ["kafka.consumer.sasl.password", "window.size_ms"]
    assert [s.logging.level for s in applied] == ["DEBUG"]
    assert reloader.settings.logging.level == "DEBUG"
    assert reloader.settings.window.size_ms == 5000  # not applied: needs a restart
    text = caplog.text
    assert "applied logging.level" in text
    assert "need a restart: kafka.consumer.sasl.password, window.size_ms" in text
    assert SECRET not in text
    assert reloader.reload() == pending  # still pending, nothing newly applied
    assert len(applied) == 1


def test_a_broken_file_keeps_the_running_configuration(
        config: Path, caplog: pytest.LogCaptureFixture) -> None:
    reloader = ConfigReloader(config, load_settings(config), apply_logging=lambda _s: None)
    edit(config, "size_ms:", "sizee_ms:")
    assert reloader.reload() == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    problem = "window.sizee_ms: unknown key (check its spelling and section)"
    assert errors == [f"reload: {config}: {problem}; keeping the running configuration"]
    assert reloader.settings.window.size_ms == 5000


def test_the_default_applies_the_log_level(config: Path) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        reloader = ConfigReloader(config, load_settings(config))
        edit(config, "level: INFO", "level: WARNING")
        reloader.reload()
        assert root.level == logging.WARNING
    finally:
        root.handlers[:], root.level = handlers, level
