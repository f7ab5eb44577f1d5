"""`python -m consumer run` as systemd would run it, against a broker that wants SCRAM:
it authenticates and processes, tells systemd READY / WATCHDOG / STOPPING, reloads on
SIGHUP, and never prints its password, even with librdkafka's ``debug: conf``. Wrong
credentials give one line and exit 1, quickly."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.conftest import REPO
from tests.consumer.service.probes import Receiver, http_get, scrape, total
from tests.integration.conftest import ScramBroker, publish_tables, wait_for
from tests.integration.data import T0, output_frame, sensor_table

pytestmark = pytest.mark.integration


def make_topics(bootstrap: str, *prefixes: str) -> list[str]:
    names = [f"{prefix}-{os.urandom(6).hex()}" for prefix in prefixes]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1)
                                   for n in names], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=30)
    return names


def write_config(path: Path, broker: ScramBroker, source: str, sink: str,
                 **sections: dict[str, Any]) -> Path:
    """A daemon config for the SASL listener; the password is not in it (env or file)."""
    document: dict[str, Any] = {
        "kafka": {"bootstrap_servers": broker.sasl_bootstrap,
                  "group_id": f"g-{os.urandom(5).hex()}",
                  "security": {"security_protocol": "SASL_PLAINTEXT",
                               "sasl_mechanism": "SCRAM-SHA-256",
                               "sasl_username": broker.username}},
        "input": {"topics": [source]},
        "output": {"topic": sink},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 1000, "idle_timeout_ms": 1000},
        "processing": {"instance_id": f"i-{os.urandom(5).hex()}", "poll_timeout_ms": 100,
                       "commit_interval_ms": 300},
        "service": {"http_port": 0, "statistics_interval_ms": 500},
    }
    for name, values in sections.items():
        document[name] = {**document.get(name, {}), **values}
    path.write_text(yaml.safe_dump(document))
    return path


def daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ARROWAGG_", "NOTIFY_SOCKET", "WATCHDOG_"))
           and k != "KAFKA_BOOTSTRAP_SERVERS"}
    return {**env, **extra}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with tempfile.TemporaryDirectory(prefix="sd-") as folder, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        path = str(Path(folder) / "notify")
        sock.bind(path)
        yield Receiver(sock, path)


def wait_for_line(log: Path, pattern: str, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := re.search(pattern, log.read_text(errors="replace")):
            return found
        time.sleep(0.1)
    pytest.fail(f"no {pattern!r} in the daemon's output within {timeout_s}s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")


def test_the_daemon_over_scram_as_a_systemd_service(
        scram_broker: ScramBroker, receiver: Receiver, tmp_path: Path) -> None:
    source, sink = make_topics(scram_broker.bootstrap, "in", "out")
    raw_debug = {"debug": "conf"}  # librdkafka dumps its whole configuration
    config = write_config(tmp_path / "config.yaml", scram_broker, source, sink,
                          kafka={"consumer": raw_debug, "producer": raw_debug},
                          logging={"level": "DEBUG"})
    log = tmp_path / "daemon.log"
    env = daemon_env(ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD=scram_broker.password,
                     NOTIFY_SOCKET=receiver.address, WATCHDOG_USEC="400000")
    with log.open("wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "consumer", "run", "--config",
                                   str(config)], cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        port = int(wait_for_line(log, r"on http://127\.0\.0\.1:(\d+)", 30).group(1))
        wait_for(lambda: any(d.startswith("READY=1") for d in receiver.datagrams(0.2)),
                 timeout_s=40, what="READY=1 from the daemon")
        assert http_get(port, "/readyz")[0] == 200
        healthcheck = subprocess.run([sys.executable, "-m", "consumer.healthcheck",
                                      "--port", str(port)], cwd=REPO, check=False,
                                     timeout=30)
        assert healthcheck.returncode == 0  # the container's HEALTHCHECK command

        rng = random.Random(2)
        tables = [(0, sensor_table(rng, 40, T0 + i * 100, 100)) for i in range(30)]
        publish_tables(scram_broker.bootstrap, source, tables)
        wait_for(lambda: total(scrape(port), "arrowagg_windows_emitted_total") >= 3,
                 timeout_s=30, what="3 windows emitted over SASL")
        pings = [d for d in receiver.datagrams(1.0) if d.startswith("WATCHDOG=1")]
        assert len(pings) >= 3  # every >= 0.2 s while the loop turns
        metrics_body = http_get(port, "/metrics")[2]

        text = config.read_text()
        config.write_text(text.replace("size_ms: 1000", "size_ms: 2000")
                          .replace("level: DEBUG", "level: INFO"))
        daemon.send_signal(signal.SIGHUP)
        wait_for_line(log, r"need a restart: window\.size_ms", 20)
        assert daemon.poll() is None  # SIGHUP did not stop it

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
        assert any(d.startswith("STOPPING=1") for d in receiver.datagrams(1.0))
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)

    output = log.read_text(errors="replace")
    assert "applied logging.level" in output
    assert "sasl.password = [redacted]" in output  # the debug dump did happen ...
    assert scram_broker.password not in output     # ... and the password is nowhere
    assert scram_broker.password not in metrics_body
    frame, _ = output_frame(scram_broker.bootstrap, sink)
    assert int(frame["row_count"].sum()) == 30 * 40  # processed through SASL


def test_wrong_credentials_are_one_line_and_exit_1(
        scram_broker: ScramBroker, tmp_path: Path) -> None:
    source, sink = make_topics(scram_broker.bootstrap, "in", "out")
    config = write_config(tmp_path / "config.yaml", scram_broker, source, sink)
    wrong = f"wrong-{os.urandom(8).hex()}"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "consumer", "run", "--config", str(config)], cwd=REPO,
        env=daemon_env(ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD=wrong),
        capture_output=True, text=True, check=False, timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 1
    assert took < 30, f"took {took:.0f}s to give up"
    errors = [line for line in result.stderr.splitlines() if line.startswith("consumer: ")]
    assert len(errors) == 1, result.stderr
    assert f"Kafka at {scram_broker.sasl_bootstrap} refused to authenticate us" in errors[0]
    assert "invalid credentials" in errors[0]
    assert "kafka.security" in errors[0]
    assert "Traceback" not in result.stderr
    assert wrong not in result.stderr + result.stdout
