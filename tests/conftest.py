"""Session-wide fixtures: one real Apache Kafka broker and uuid-named topics.

Broker selection, in order:
1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (any external broker);
2. a testcontainers Kafka container when a Docker engine answers;
3. ``scripts/kafka-local`` (Apache Kafka from Maven Central jars, no Docker needed), in a
   state directory of this session's own, on free ports: a demo, a daemon or another
   test run beside it (even from the same checkout) neither lends it its broker nor
   stops it. Every broker the suite starts shares the checkout's jars
   (``KAFKA_LOCAL_JARS``), fetched once.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = REPO / "scripts" / "kafka-local"
JARS = REPO / ".kafka-local" / "lib"


@dataclass(frozen=True)
class Broker:
    bootstrap: str
    source: str
    version: str


_broker_seen: list[Broker] = []
_failures: list[str] = []
_session_state: list[Path] = []  # the session broker's KAFKA_LOCAL_DIR, once made
COMPOSE_TESTS = REPO / "tests" / "deploy" / "compose"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--compose", action="store_true",
                     help="run tests/deploy/compose/: the container stack, built and started "
                          "(make compose-test); without it they are not collected")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The container stack's checks need a Docker engine and minutes of image building:
    `make compose-test` runs them (--compose), `make test` leaves them out."""
    if collection_path == COMPOSE_TESTS and not config.getoption("--compose"):
        return True
    return None


def _docker_answers() -> bool:
    """True when a Docker engine answers /_ping on its socket (the testcontainers path)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://") or not Path(host[7:]).exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(3)
            sock.connect(host[7:])
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(256)
    except OSError:
        return False


def _kafka_local(command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_LOCAL_DIR": str(_session_state[0])}
    return subprocess.run(
        [sys.executable, str(KAFKA_LOCAL), command],
        capture_output=True, text=True, check=False, timeout=180, env=env,
    )


# Property tests: a quick profile for `make test`, a thorough one on demand
# (ARROWAGG_HYPOTHESIS=thorough make unit). Engines and codecs run per example, so the
# deadline is off in both.
settings.register_profile("quick", max_examples=50, deadline=None)
settings.register_profile("thorough", max_examples=1_000, deadline=None)
HYPOTHESIS_PROFILE = os.environ.get("ARROWAGG_HYPOTHESIS", "quick")


def pytest_configure(config: pytest.Config) -> None:
    del config
    settings.load_profile(HYPOTHESIS_PROFILE)
    # Every broker a test starts (and their children) takes the checkout's jars.
    os.environ.setdefault("KAFKA_LOCAL_JARS", str(JARS))


def _local_version() -> str:
    return _kafka_local("version").stdout.strip() or "unknown"


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """A test that runs a command line (``configure_logging``) leaves the root logger's
    level and handlers as it found them: the level it set let INFO records into a later
    test's caplog, which then failed or passed by test order."""
    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    yield
    root.setLevel(level)
    for handler in root.handlers[:]:
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        broker = Broker(bootstrap, "KAFKA_BOOTSTRAP_SERVERS", "external")
        _broker_seen.append(broker)
        yield broker
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
            broker = Broker(container.get_bootstrap_server(), "testcontainers", "4.1.1")
            _broker_seen.append(broker)
            yield broker
        return
    _session_state.append(tmp_path_factory.mktemp("kafka-local"))
    started = _kafka_local("start")
    if started.returncode != 0:
        _kafka_local("stop")
        pytest.exit(f"scripts/kafka-local start failed:\n{started.stderr}", returncode=3)
    broker = Broker(started.stdout.strip().splitlines()[-1], "scripts/kafka-local",
                    _local_version())
    _broker_seen.append(broker)
    try:
        yield broker
    finally:
        _kafka_local("stop")


@pytest.fixture(scope="session")
def bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(admin: AdminClient) -> Iterator[TopicFactory]:
    """Make fresh uuid-named topics; tests never share topics."""
    made: list[str] = []

    def make(prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1,
                      config=config or {})],
            operation_timeout=30,
        )
        futures[name].result(timeout=30)
        made.append(name)
        _wait_until_listed(admin, name, partitions)
        return name

    yield make
    if made:
        with suppress(Exception):
            for future in admin.delete_topics(made, operation_timeout=10).values():
                future.result(timeout=10)


def _wait_until_listed(admin: AdminClient, name: str, partitions: int) -> None:
    """Until the broker's metadata lists ``name`` with a leader for every partition.

    CreateTopics answers once the controller has the topic; the broker that answers a
    client's metadata learns it from the metadata log a moment later, and on a loaded
    machine a producer asking at once was told the topic did not exist."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions \
                and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} was created but is not listed after 30 s")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _failures.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"hypothesis profile: {HYPOTHESIS_PROFILE} "
                                f"({settings().max_examples} examples a property)")
    for broker in _broker_seen:
        terminalreporter.write_line(
            f"kafka broker: Apache Kafka {broker.version} at {broker.bootstrap} "
            f"(from {broker.source})"
        )
    if _failures and any(b.source == "scripts/kafka-local" for b in _broker_seen):
        terminalreporter.section("broker log tail (scripts/kafka-local logs)")
        terminalreporter.write_line(_kafka_local("logs").stdout[-6000:])
