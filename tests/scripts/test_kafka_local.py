"""scripts/kafka-local without a broker: which port the first broker takes, and what a
cluster's nodes are configured with."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import KAFKA_LOCAL, REPO

LoadScript = Callable[[Path | None], ModuleType]


@pytest.fixture
def load_script(monkeypatch: pytest.MonkeyPatch) -> LoadScript:
    """The script as a module, its state directory the default one (None) or another."""

    def load(state_dir: Path | None) -> ModuleType:
        if state_dir is None:
            monkeypatch.delenv("KAFKA_LOCAL_DIR", raising=False)
        else:
            monkeypatch.setenv("KAFKA_LOCAL_DIR", str(state_dir))
        loader = importlib.machinery.SourceFileLoader("kafka_local", str(KAFKA_LOCAL))
        spec = importlib.util.spec_from_loader("kafka_local", loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "kafka_local", module)  # for its dataclasses
        loader.exec_module(module)
        return module

    return load


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def a_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def a_free_port_bind_never_picks() -> int:
    """A free port below the ephemeral range, which ``bind(0)`` draws from."""
    lowest = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in range(lowest - 1, 1024, -1):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def test_the_default_state_directory_takes_the_preferred_port_when_free(
    load_script: LoadScript, monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = load_script(None)
    assert (REPO / ".kafka-local").resolve() == script.STATE
    assert script.PREFERRED_PORT == 9092  # config.yaml's and `consumer tail`'s default
    monkeypatch.setattr(script, "PREFERRED_PORT", a_free_port())
    assert script.first_broker_port() == script.PREFERRED_PORT


def test_a_taken_preferred_port_falls_back_and_says_what_to_export(
    load_script: LoadScript, held_port: int, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = load_script(None)
    monkeypatch.setattr(script, "PREFERRED_PORT", held_port)
    port = script.first_broker_port()
    assert port != held_port
    err = capsys.readouterr().err
    assert f"port {held_port} is taken" in err
    assert f"export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}" in err


def test_another_state_directory_never_takes_the_preferred_port(
    load_script: LoadScript, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = load_script(tmp_path)
    monkeypatch.setattr(script, "PREFERRED_PORT", a_free_port_bind_never_picks())
    assert script.port_is_free(script.PREFERRED_PORT)
    assert script.PREFERRED_PORT not in {script.first_broker_port() for _ in range(5)}


def test_a_cluster_replicates_three_ways_under_one_quorum(
    load_script: LoadScript, tmp_path: Path,
) -> None:
    script = load_script(tmp_path)
    nodes = script.cluster_nodes(3)
    ports = [script.Ports(19000 + i, 19100 + i) for i in range(3)]
    voters = ",".join(f"{n.node_id}@127.0.0.1:{p.controller}"
                      for n, p in zip(nodes, ports, strict=True))
    for node, node_ports in zip(nodes, ports, strict=True):
        script.write_config(node, node_ports, quorum={"controller.quorum.voters": voters},
                            replicas=3)
    configs = [dict(line.split("=", 1) for line in node.config.read_text().splitlines())
               for node in nodes]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert {c["controller.quorum.voters"] for c in configs} == {voters}
    assert [c["log.dirs"] for c in configs] == [str(tmp_path / f"node-{i}" / "data")
                                                for i in (1, 2, 3)]
    for config in configs:
        assert config["default.replication.factor"] == "3"
        assert config["offsets.topic.replication.factor"] == "3"
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["min.insync.replicas"] == "2"
        assert config["transaction.state.log.min.isr"] == "2"


def test_cluster_ids_are_what_kafka_storage_accepts(load_script: LoadScript) -> None:
    script = load_script(None)
    for _ in range(200):
        cluster_id = script.new_cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
