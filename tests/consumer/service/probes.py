"""What the service tests read from a running daemon: its HTTP endpoints, its Prometheus
metrics, and what it tells systemd; and free ports for daemons to serve on."""

from __future__ import annotations

import random
import socket
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

import pytest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def http_get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET on the local port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return (int(response.status), response.headers["Content-Type"],
                    response.read().decode())
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def scrape(port: int) -> Samples:
    """Every sample of /metrics, keyed by (sample name, labels)."""
    status, _, body = http_get(port, "/metrics")
    assert status == 200
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(body) for sample in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items()
               if sample == name and wanted <= have)


class Receiver:
    """What systemd's manager would read from NOTIFY_SOCKET."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address  # as NOTIFY_SOCKET spells it

    def datagrams(self, within_s: float = 0.3) -> list[str]:
        """Everything that arrives within ``within_s`` (stops early on nothing new)."""
        got: list[str] = []
        deadline = time.monotonic() + within_s
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                break
        return got


def free_port_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports, all free now (a range several daemons may share)."""
    rng = random.Random()
    for _ in range(50):
        low = rng.randrange(20_000, 60_000)
        with ExitStack() as stack:
            try:
                for port in range(low, low + size):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return low, low + size - 1
    pytest.fail(f"no {size} consecutive free ports found")
