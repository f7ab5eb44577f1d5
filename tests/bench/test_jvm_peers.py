"""What the JVM peers need, and the reason given when a machine lacks it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import jvm_peers
from bench.peers import BY_NAME


def _without(monkeypatch: pytest.MonkeyPatch, *programs: str) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda name: None if name in programs else real(name))


def test_without_java_both_are_skipped_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "java")
    for name in ("flink", "kstreams"):
        assert BY_NAME[name].missing() == "no java on PATH: Flink and Kafka Streams need Java 17+"


def test_kafka_streams_unbuilt_says_how_it_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    if jvm_peers.missing_java() is not None:
        pytest.fail("these tests need java on PATH, as the project's broker does")
    monkeypatch.setattr(jvm_peers, "KSTREAMS_JAR", tmp_path / "absent.jar")
    why = BY_NAME["kstreams"].missing()
    assert why is not None
    assert why.startswith("not built: make bench builds bench/kstreams with Maven")
    _without(monkeypatch, "mvn")
    assert BY_NAME["kstreams"].missing() == (
        "not built: make bench builds bench/kstreams with Maven; mvn is not on PATH: "
        "install Maven 3.8+")


def test_kafka_streams_built_is_ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = tmp_path / "target" / "kstreams-peer-1.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"")
    monkeypatch.setattr(jvm_peers, "KSTREAMS_JAR", jar)
    assert BY_NAME["kstreams"].missing() is None
    command = jvm_peers.kstreams_command("b:9092", "in", "out", "app", "10000")
    assert command == ["java", "-cp", f"{jar}:{jar.parent / 'lib' / '*'}",
                       "arrowagg.bench.SensorWindows", "b:9092", "in", "out", "app", "10000"]


def test_flink_needs_its_interpreter_and_the_connector_beside_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    python = tmp_path / "flink" / "bin" / "python"
    monkeypatch.setenv("BENCH_FLINK_PYTHON", str(python))
    peer = BY_NAME["flink"]
    assert peer.missing() == "no interpreter: make bench installs PyFlink in .venv/flink"
    python.parent.mkdir(parents=True)
    python.write_text("")
    why = peer.missing()
    assert why is not None
    assert why.startswith("no Kafka SQL connector jar: make bench fetches it with Maven")
    jars = jvm_peers.flink_jars(python)
    assert jars == tmp_path / "flink" / "jars"
    jars.mkdir()
    (jars / "flink-sql-connector-kafka-5.0.0-2.2.jar").write_bytes(b"")
    assert peer.missing() is None


def test_the_kafka_streams_version_is_the_poms() -> None:
    assert jvm_peers.kstreams_version() == "4.4.0"
