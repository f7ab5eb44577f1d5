"""The scale-out in containers: 1, 2 and 3 daemon containers, each capped to a fraction of
a core, drain the same input.

N replicas of docker-compose.yml's daemon service (`up --scale daemon=N`, with
deploy/compose.host-network.yml and bench/compose.scale-out.yml: `cpus:` per container,
the scale_out section) start on an empty input topic of 4 partitions; once every replica
answers /readyz (partitions assigned), the clock starts and this process publishes
bench.scale_out's input (dictionary keys, 10,000 groups, messages built beforehand, a
sentinel per partition closing every window), and the clock stops when every part of
every window has its end-of-window marker on the output topic. Start-up (container,
imports, group join) is reported apart, not in the rate. The cap makes each daemon a fixed
slice of the machine, standing for a machine of its own; the broker runs on the host,
uncapped, and the CPU time of everything over the timed span is measured: the daemons'
(their cgroups' usage), the broker's and the publisher's (their processes' user + system
time), so the reader can see what set the pace.

Needs a Docker engine: scripts/docker-local finds or starts one (and the images); without
one the section is reported as skipped, with the reason.

    python -m bench --sections scale_out_containers
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.broker import _state_dir, create_topic, delete_topics, fill
from bench.e2e import GROUPS, ROWS_PER_MESSAGE
from bench.payloads import WINDOW_MS, build, sentinel
from bench.scale_out import INPUT_PARTITIONS, REPARTITIONS, wait_for_output, window_ends
from bench.sizes import KernelCase

REPO = Path(__file__).resolve().parent.parent
DOCKER_LOCAL = REPO / "scripts" / "docker-local"
FILES = [REPO / "docker-compose.yml", REPO / "deploy" / "compose.host-network.yml",
         Path(__file__).resolve().parent / "compose.scale-out.yml"]
CPUS = 0.5        # of a core, per daemon container: three take 1.5 of the machine's 2
INSTANCES = (1, 2, 3)


def measure(bootstrap: str, broker_pid: int | None, *, target_bytes: int,
            step: Callable[[str], None] = lambda _what: None) -> dict[str, Any]:
    started = subprocess.run([str(DOCKER_LOCAL), "start", "--user", str(os.getpid())],
                             capture_output=True, text=True, check=False, timeout=1800)
    if started.returncode != 0:
        reason = (started.stderr.strip().splitlines() or ["no reason given"])[-1]
        return {"skipped": f"no Docker engine could be had: {reason}"}
    engine: dict[str, Any] = json.loads(started.stdout.strip().splitlines()[-1])
    compose = Compose(engine, bootstrap)
    try:
        step("scale-out in containers: building the daemon image")
        compose.run("build", "daemon")
        data = Input.build(target_bytes)
        runs = []
        for instances in INSTANCES:
            step(f"scale-out in containers: {instances} daemon container(s), "
                 f"{CPUS} of a core each")
            runs.append(run(compose, data, instances, broker_pid))
    finally:
        compose.run("down", "--volumes", "--timeout", "30", check=False)
        compose.docker("rmi", f"arrowagg:{compose.tag}", f"arrowagg-tools:{compose.tag}")
        subprocess.run([str(DOCKER_LOCAL), "stop", "--user", str(os.getpid())],
                       capture_output=True, check=False, timeout=120)
    return {"cpus_per_daemon": CPUS, "input_partitions": INPUT_PARTITIONS,
            "repartition_partitions": REPARTITIONS, "windows": data.windows,
            "rows": data.rows, "input_bytes": data.nbytes,
            "engine": "private dockerd" if engine["private"] else engine["docker_host"],
            "runs": runs}


@dataclass(frozen=True)
class Input:
    """bench.scale_out's input, encoded once: (partition, message) pairs, sentinels last."""

    values: list[tuple[int, bytes]]
    rows: int
    nbytes: int
    windows: int

    @classmethod
    def build(cls, target_bytes: int) -> Input:
        probe = build(KernelCase("probe", 1, ROWS_PER_MESSAGE, GROUPS, 1), "dictionary")
        messages = math.ceil(max(math.ceil(target_bytes / probe.nbytes), 20) / 20) * 20
        payloads = build(KernelCase("containers", messages, ROWS_PER_MESSAGE, GROUPS, 20),
                         "dictionary")
        last = sentinel("dictionary", payloads.windows + 10)
        values = [(i % INPUT_PARTITIONS, v) for i, v in enumerate(payloads.values)]
        values += [(p, last) for p in range(INPUT_PARTITIONS)]
        return cls(values, payloads.rows, sum(len(v) for _, v in values), payloads.windows)


def run(compose: Compose, data: Input, instances: int,
        broker_pid: int | None) -> dict[str, Any]:
    topics = {f"BENCH_{kind.upper()}": create_topic(
        compose.bootstrap, f"containers-{kind}", INPUT_PARTITIONS if kind == "input" else 1)
        for kind in ("input", "output", "late", "dlq")}
    extra = {**topics, "BENCH_GROUP": f"bench-{uuid.uuid4().hex[:10]}",
             "BENCH_REPARTITION": f"bench-rep-{uuid.uuid4().hex[:10]}"}
    launched = time.perf_counter()
    compose.run("up", "--detach", "--no-deps", "--scale", f"daemon={instances}", "daemon",
                extra=extra)
    compose.wait_ready(instances)
    ready_s = time.perf_counter() - launched
    daemons = compose.containers("daemon")
    before = cpu_seconds(compose, daemons, broker_pid)
    clock = time.perf_counter()
    fill(compose.bootstrap, topics["BENCH_INPUT"], data.values)
    published_s = time.perf_counter() - clock
    done = wait_for_output(compose.bootstrap, topics["BENCH_OUTPUT"],
                           data.windows * REPARTITIONS, window_ends(scale_out=True),
                           daemons=[compose.watch("daemon")])
    seconds = done - clock
    after = cpu_seconds(compose, daemons, broker_pid)
    spent = {k: _minus(after[k], before[k]) for k in after}
    compose.run("rm", "--stop", "--force", "daemon", extra=extra)
    delete_topics(compose.bootstrap, [*topics.values(), extra["BENCH_REPARTITION"]])
    return {"instances": instances, "ready_s": ready_s, "publish_s": published_s,
            "seconds": seconds, "rows_per_s": data.rows / seconds,
            **{f"{k}_cpu_s": v for k, v in spent.items()}}


def _minus(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def cpu_seconds(compose: Compose, daemons: list[str],
                broker_pid: int | None) -> dict[str, float | None]:
    """CPU seconds so far of the daemons (together), the broker and this process (the
    publisher); None where it cannot be read from this machine."""
    used = [container_cpu_s(compose, c) for c in daemons]
    return {"daemon": None if None in used else sum(u for u in used if u is not None),
            "broker": process_cpu_s(broker_pid) if broker_pid else None,
            "publisher": time.process_time()}


class Compose:
    """docker compose for the bench's daemon service, on its own project, tag and ports."""

    def __init__(self, engine: dict[str, Any], bootstrap: str) -> None:
        self.engine, self.bootstrap = engine, bootstrap
        self.tag = f"bench-{uuid.uuid4().hex[:8]}"
        self.ports = [free_port() for _ in INSTANCES]
        self.env = {
            **os.environ, "DOCKER_HOST": engine["docker_host"],
            "COMPOSE_PROJECT_NAME": f"arrowagg-{self.tag}", "ARROWAGG_IMAGE_TAG": self.tag,
            "ARROWAGG_BASE_IMAGE": engine["images"]["base"],
            "ARROWAGG_CA_BUNDLE": ca_bundle(), "KAFKA_PORT": bootstrap.rsplit(":", 1)[1],
            "ARROWAGG_HTTP_PORTS": ",".join(map(str, self.ports)),
            "ARROWAGG_DAEMON_CPUS": str(CPUS), "BENCH_WINDOW_MS": str(WINDOW_MS),
        }

    def run(self, *args: str, extra: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [arg for path in FILES for arg in ("-f", str(path))]
        return subprocess.run([*self.engine["compose"], "--project-directory", str(REPO),
                               *files, *args], env={**self.env, **(extra or {})},
                              capture_output=True, text=True, check=check, timeout=1200)

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *args], env=self.env, capture_output=True,
                              text=True, check=False, timeout=120)

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).stdout.split()

    def wait_ready(self, instances: int, timeout_s: float = 180) -> None:
        """Until the first ``instances`` HTTP slots (deploy/arrowagg-slot) answer /readyz."""
        deadline = time.monotonic() + timeout_s
        while not all(ready(port) for port in self.ports[:instances]):
            if time.monotonic() > deadline or self.watch("daemon").poll() is not None:
                raise RuntimeError(f"{instances} daemon container(s) not ready")
            time.sleep(0.5)

    def watch(self, service: str) -> Any:
        """Something whose ``poll()`` is an exit code once a container of ``service`` has
        stopped (a Popen's interface, for bench.scale_out's wait)."""
        compose = self

        class Watch:
            checked = 0.0

            def poll(self) -> int | None:
                if time.monotonic() - self.checked < 5:  # compose costs CPU the daemons need
                    return None
                self.checked = time.monotonic()
                stopped = compose.run("ps", "-q", "--status", "exited", service).stdout
                if not stopped.strip():
                    return None
                sys.stderr.write(compose.run("logs", "--tail", "20", service).stdout)
                return 1

        return Watch()


def broker_pid() -> int | None:
    """The pid of the broker bench.broker started (None for an external one)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return None
    try:
        return int((Path(_state_dir()) / "kafka.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ca_bundle() -> str:
    for path in (os.environ.get("SSL_CERT_FILE", ""), "/etc/ssl/certs/ca-certificates.crt"):
        if path and Path(path).is_file():
            return path
    return "/dev/null"


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process (and its reaped children), from /proc."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def container_cpu_s(compose: Compose, container: str) -> float | None:
    """CPU seconds a running container's cgroup has used (cgroup v2 or v1 cpuacct), read
    on this machine: None when the engine is not local."""
    inspected = compose.docker("inspect", "-f", "{{.State.Pid}}", container)
    try:
        lines = Path(f"/proc/{inspected.stdout.strip()}/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = dict(line.split(":", 2)[1:] for line in lines)
    unified = Path("/sys/fs/cgroup") / paths.get("", "/").lstrip("/") / "cpu.stat"
    if unified.is_file():
        usage = dict(line.split() for line in unified.read_text().splitlines())
        return int(usage["usage_usec"]) / 1e6
    for controllers, path in paths.items():
        if "cpuacct" in controllers.split(","):
            found = Path("/sys/fs/cgroup") / controllers / path.lstrip("/") / "cpuacct.usage"
            return int(found.read_text()) / 1e9 if found.is_file() else None
    return None
