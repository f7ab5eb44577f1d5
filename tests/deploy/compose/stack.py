"""The compose stack of one test run: a Docker engine from scripts/docker-local, a
project name, ports and topics of its own, and the docker / compose commands against it.

Every service runs on the host's network (deploy/compose.host-network.yml), so every
port is a free one picked here and passed through the variables that file reads; a demo,
a daemon on the default ports or a second run can share the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO

DOCKER_LOCAL = REPO / "scripts" / "docker-local"
HERE = Path(__file__).resolve().parent
FILES = [REPO / "docker-compose.yml", REPO / "deploy" / "compose.host-network.yml",
         HERE / "overrides.yml"]
HTTP_REPLICAS = 3  # the most daemon replicas the test scales to
# Each worker: 4 batches of 2,000 rows a second for 75 s, long enough to outlast the kill,
# the scale to three and back, short enough for CI (about 1.2 million rows in all).
WORKERS = {"ARROWAGG_WORKER_DURATION_S": "75", "ARROWAGG_WORKER_RATE": "4",
           "ARROWAGG_WORKER_ROWS": "2000"}
CA_BUNDLES = [os.environ.get("SSL_CERT_FILE", ""), "/etc/ssl/certs/ca-certificates.crt"]


@dataclass(frozen=True)
class Engine:
    """What scripts/docker-local start found or made."""

    docker_host: str
    compose: list[str]
    images: dict[str, str]
    private: bool
    seconds: float

    @classmethod
    def start(cls) -> Engine:
        started = time.monotonic()
        result = subprocess.run([str(DOCKER_LOCAL), "start", "--user", str(os.getpid())],
                                capture_output=True, text=True, check=False, timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"scripts/docker-local start failed:\n{result.stderr[-6000:]}")
        found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return cls(found["docker_host"], list(found["compose"]), dict(found["images"]),
                   bool(found["private"]), time.monotonic() - started)

    def stop(self) -> None:
        subprocess.run([str(DOCKER_LOCAL), "stop", "--user", str(os.getpid())],
                       capture_output=True, check=False, timeout=120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    engine: Engine
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    kafka_port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    http_ports: list[int] = field(
        default_factory=lambda: [free_port() for _ in range(HTTP_REPLICAS)])

    @property
    def project(self) -> str:
        return f"arrowagg-test-{self.run_id}"

    @property
    def topic(self) -> str:
        return f"sensors-{self.run_id}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def env(self) -> dict[str, str]:
        bundle = next((b for b in CA_BUNDLES if b and Path(b).is_file()), "/dev/null")
        return {
            **os.environ, "DOCKER_HOST": self.engine.docker_host,
            "COMPOSE_PROJECT_NAME": self.project,
            "ARROWAGG_BASE_IMAGE": self.engine.images["base"],
            "KAFKA_IMAGE": self.engine.images["kafka"],
            "PROMETHEUS_IMAGE": self.engine.images["prometheus"],
            "ARROWAGG_CA_BUNDLE": bundle,
            "ARROWAGG_TOPIC": self.topic,
            "KAFKA_PORT": str(self.kafka_port),
            "KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "ARROWAGG_HTTP_PORTS": ",".join(map(str, self.http_ports)),
            "ARROWAGG_SCRAPE_TARGETS": ", ".join(f"127.0.0.1:{p}" for p in self.http_ports),
            "PROMETHEUS_PORT": str(self.prometheus_port),
            "ARROWAGG_IMAGE_TAG": self.run_id, **WORKERS,
        }

    def compose(self, *args: str, timeout_s: float = 600,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [arg for path in FILES for arg in ("-f", str(path))]
        return self._run([*self.engine.compose, "--project-directory", str(REPO), *files,
                          "-p", self.project, *args], timeout_s, check=check)

    def docker(self, *args: str, timeout_s: float = 120,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(["docker", *args], timeout_s, check=check)

    def _run(self, cmd: list[str], timeout_s: float, *,
             check: bool) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(cmd, env=self.env(), capture_output=True, text=True,
                                check=False, timeout=timeout_s, cwd=REPO)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[-4:])}: exit {result.returncode}\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
        return result

    def remove_images(self) -> None:
        """Untag this run's two images; their layers stay in the build cache for the next."""
        self.docker("rmi", f"arrowagg:{self.run_id}", f"arrowagg-tools:{self.run_id}",
                    check=False)

    def containers(self, service: str, *, every: bool = False) -> list[str]:
        """The ids of the service's containers (running ones unless ``every``)."""
        args = ["ps", "-q", *(["-a"] if every else []), service]
        return self.compose(*args).stdout.split()

    def inspect(self, container: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self.docker("inspect", container).stdout)
        return found[0]

    def health(self, container: str) -> str | None:
        state = self.inspect(container)["State"]
        return state.get("Health", {}).get("Status") if state.get("Health") else None

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", service, check=False).stdout

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result vector of an instant PromQL query through Prometheus' HTTP API."""
        url = f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
            answer: dict[str, Any] = json.load(response)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def api(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.prometheus}{path}",  # noqa: S310 - loopback
                                    timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
        return answer
