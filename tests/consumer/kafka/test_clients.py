"""kafka.security → librdkafka for every client; secrets from env or file; librdkafka's
log in the daemon's log format; the topic check's one-line errors."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from consumer.config import ConfigError, KafkaSettings, ProcessingSettings, settings_from_dict
from consumer.kafka.clients import (
    KafkaSetupError,
    check_topics,
    consumer_config,
    producer_config,
    security_config,
)
from consumer.service.logs import configure_logging

PASSWORD = "pw-9f3c1e-never-logged"  # noqa: S105 - a test value that must not leak
SASL = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "arrowagg"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


def kafka(security: dict[str, Any]) -> KafkaSettings:
    document = {"input": {"topics": ["in"]}, "output": {"topic": "out"},
                "window": {"size_ms": 1000, "timestamp_column": "ts"},
                "kafka": {"security": security}}
    return settings_from_dict(document, source="config.yaml").kafka


def config_error(security: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        kafka(security)
    return str(info.value)


def test_sasl_settings_reach_consumer_producer_and_admin() -> None:
    settings = kafka({**SASL, "sasl_password": PASSWORD,
                      "ssl_ca_location": "/etc/arrowagg/ca.pem"})
    expected = {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "arrowagg", "sasl.password": PASSWORD,
                "ssl.ca.location": "/etc/arrowagg/ca.pem"}
    assert security_config(settings.security) == expected
    processing = ProcessingSettings(instance_id="i")
    for config in (consumer_config(settings, processing), producer_config(settings, processing)):
        assert expected.items() <= config.items()
    assert PASSWORD not in repr(settings)
    assert PASSWORD not in str(settings.model_dump())


def test_plaintext_by_default_and_ssl_client_certificates() -> None:
    assert security_config(kafka({}).security) == {"security.protocol": "plaintext"}
    ssl = kafka({"security_protocol": "SSL", "ssl_certificate_location": "/c.pem",
                 "ssl_key_location": "/k.pem", "ssl_key_password": PASSWORD})
    assert security_config(ssl.security) == {
        "security.protocol": "ssl", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "ssl.key.password": PASSWORD}


def test_raw_librdkafka_keys_still_win() -> None:
    document = {"input": {"topics": ["in"]}, "output": {"topic": "out"},
                "window": {"size_ms": 1000, "timestamp_column": "ts"},
                "kafka": {"security": {**SASL, "sasl_password": PASSWORD},
                          "consumer": {"sasl.mechanism": "PLAIN"}}}
    settings = settings_from_dict(document)
    config = consumer_config(settings.kafka, settings.processing)
    assert config["sasl.mechanism"] == "PLAIN"


def test_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD", PASSWORD)
    password = kafka(SASL).security.sasl_password
    assert password is not None
    assert password.get_secret_value() == PASSWORD


def test_password_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "sasl-password"
    secret.write_text(PASSWORD + "\n")
    from_yaml = kafka({**SASL, "sasl_password_file": str(secret)}).security.sasl_password
    monkeypatch.setenv("ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD_FILE", str(secret))
    from_env = kafka(SASL).security.sasl_password
    assert from_yaml is not None
    assert from_env is not None
    assert from_yaml.get_secret_value() == from_env.get_secret_value() == PASSWORD


def test_password_file_problems_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert config_error({**SASL, "sasl_password_file": str(missing)}) == (
        f"config.yaml: kafka.security: cannot read sasl_password_file {missing} "
        "(No such file or directory)")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert "is empty" in config_error({**SASL, "sasl_password_file": str(empty)})
    both = config_error({**SASL, "sasl_password": PASSWORD, "sasl_password_file": str(empty)})
    assert "give sasl_password or sasl_password_file, not both" in both
    assert PASSWORD not in both


def test_incomplete_sasl_settings_name_what_is_missing() -> None:
    message = config_error({"security_protocol": "SASL_PLAINTEXT"})
    assert message.startswith("config.yaml: kafka.security: SASL_PLAINTEXT needs "
                              "sasl_mechanism, sasl_username, sasl_password")
    bad = config_error({**SASL, "sasl_mechanism": "GSSAPI", "sasl_password": PASSWORD})
    assert "kafka.security.sasl_mechanism" in bad
    assert PASSWORD not in bad


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.usefixtures("restore_logging")
def test_librdkafka_logs_come_out_as_the_daemons_json_lines(
        capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")  # here: it binds the stderr capsys has in place now
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1")  # nothing listens there
    producer = Producer(producer_config(settings, ProcessingSettings(
        guarantee="at_least_once", instance_id="i")))
    deadline = time.monotonic() + 10
    entries: list[dict[str, str]] = []
    while time.monotonic() < deadline and not entries:
        producer.poll(0.2)  # serves the log queue
        lines = capsys.readouterr().err.splitlines()
        entries = [e for e in map(json.loads, lines) if e["logger"] == "librdkafka"]
    assert entries, "no librdkafka log line within 10 s"
    assert entries[0]["level"] in {"ERROR", "WARNING", "INFO"}
    assert "127.0.0.1:1" in entries[0]["message"]


def test_an_unreachable_broker_is_one_line() -> None:
    with pytest.raises(KafkaSetupError) as info:
        check_topics(KafkaSettings(bootstrap_servers="127.0.0.1:1"), ["in"], timeout_s=1)
    assert str(info.value) == ("cannot reach Kafka at 127.0.0.1:1 (nothing listens there: "
                               "Connection refused); check kafka.bootstrap_servers or "
                               "KAFKA_BOOTSTRAP_SERVERS")
