"""The container stack, built and run for real (`make compose-test`): docker-compose.yml
with deploy/compose.host-network.yml and this folder's overrides.yml, on the engine that
scripts/docker-local finds or starts.

In order: the alert rules pass promtool; `up --wait` brings every service up and the
daemon healthy, unprivileged; Prometheus scrapes it; while the workers publish, the
daemon crashes (SIGKILL of its process: the restart policy brings it back), is `docker
kill`ed (Docker's operator stop: `docker start` brings it back), is scaled to three and
back to one, and the output still equals DuckDB over what the input topic holds; `stop`
ends it with exit 0 within its grace period.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from polars.testing import assert_frame_equal
from prometheus_client.parser import text_string_to_metric_families

from consumer.kafka.tail import read_output
from producer.generate import sensor_batch
from tests.conftest import REPO
from tests.deploy.compose.stack import Engine, Stack
from tests.integration.conftest import publish_tables
from tests.integration.faults import read_topic, repeated_groups, wait_until, write_figures

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_MS = 5_000       # config.yaml's window.size_ms
LATENESS_MS = 30_000    # overrides.yml's window.allowed_lateness_ms
INPUT_PARTITIONS = 3    # `topics create`'s default for the input topic
KEYS = ["site", "sensor"]
STOP_GRACE_S = 90       # docker-compose.yml's stop_grace_period for the daemon
RULES = REPO / "deploy" / "prometheus"


def test_the_alert_rules_pass_promtool_and_their_unit_tests(engine: Engine) -> None:
    stack = Stack(engine)  # for its docker command; nothing is started
    promtool = ["run", "--rm", "--network", "host", "--entrypoint", "promtool",
                "-v", f"{RULES}:/rules:ro", engine.images["prometheus"]]
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    checked = stack.docker(*promtool, "check", "rules", "/rules/alerts.yml")
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout, checked.stdout
    tested = stack.docker(*promtool, "test", "rules", "/rules/alerts.test.yml")
    assert "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_service_is_up_and_the_daemon_healthy_and_unprivileged(stack: Stack) -> None:
    for service in ("kafka", "daemon", "prometheus"):
        (container,) = stack.containers(service)
        assert stack.health(container) == "healthy", service
    for service in ("worker-1", "worker-2", "subscriber"):
        (container,) = stack.containers(service)
        assert stack.inspect(container)["State"]["Running"], service
    (topics,) = stack.containers("topics", every=True)
    assert stack.inspect(topics)["State"]["ExitCode"] == 0
    (daemon,) = stack.containers("daemon")
    assert stack.inspect(daemon)["Config"]["User"] == "arrowagg"
    uid = stack.docker("exec", daemon, "id", "-u").stdout.strip()
    assert uid == "10001", "the daemon runs as the image's arrowagg user, not root"


def test_prometheus_scrapes_the_daemon_and_loads_every_alert(stack: Stack) -> None:
    first = f"127.0.0.1:{stack.http_ports[0]}"

    def scraped() -> bool:
        return any(r["metric"]["instance"] == first and r["value"][1] == "1"
                   for r in stack.query('up{job="arrowagg"} == 1'))

    wait_until(scraped, timeout_s=60, what=f'up{{job="arrowagg",instance="{first}"}} == 1')
    groups = stack.api("/api/v1/rules?type=alert")["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    written = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    assert loaded == {rule["alert"] for rule in written}


def daemon_metrics(port: int) -> dict[str, float]:
    """The daemon's unlabelled samples and the sums of its labelled ones, from /metrics."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def replica_ports(stack: Stack) -> dict[str, int]:
    """Each running daemon replica and the HTTP port (slot) it took."""
    port_file = "/tmp/arrowagg-http-port"  # noqa: S108 - inside the container (arrowagg-slot)
    return {c: int(stack.docker("exec", c, "cat", port_file).stdout)
            for c in stack.containers("daemon")}


def all_consuming(stack: Stack, replicas: int) -> bool:
    ports = replica_ports(stack)
    if len(ports) != replicas:
        return False
    try:
        metrics = [daemon_metrics(port) for port in ports.values()]
    except OSError:
        return False
    return all(m.get("arrowagg_ready") == 1 for m in metrics)


def test_killed_scaled_to_three_and_back_the_output_stays_exact(stack: Stack) -> None:
    wait_until(lambda: daemon_metrics(stack.http_ports[0]).get(
        "arrowagg_windows_emitted_total", 0) > 0, timeout_s=120,
        what="the workers' rows aggregated into a first window")
    figures = {**crash_and_kill(stack), **scale_to_three_and_back(stack)}
    for worker in ("worker-1", "worker-2"):
        (container,) = stack.containers(worker, every=True)
        code = stack.docker("wait", container, timeout_s=300).stdout.strip()
        assert code == "0", f"{worker} exited {code}:\n{stack.logs(worker)[-3000:]}"
    figures |= check_the_output(stack)
    write_figures("compose_stack", figures)


def crash_and_kill(stack: Stack) -> dict[str, float]:
    """Mid-stream: the daemon's process SIGKILLed (the restart policy brings it back),
    then the container `docker kill`ed (Docker takes that for an operator's stop, moby's
    HasBeenManuallyStopped: no restart policy applies; the operator's `docker start`
    brings it back). Seconds until healthy again, each time."""
    (daemon,) = stack.containers("daemon")
    started = time.monotonic()
    crash(stack, daemon)
    wait_until(lambda: stack.inspect(daemon)["RestartCount"] >= 1
               and stack.health(daemon) == "healthy", timeout_s=120,
               what="the restart policy to bring the crashed daemon back, healthy")
    crashed_s = time.monotonic() - started
    stack.docker("kill", daemon)
    time.sleep(3)
    assert stack.inspect(daemon)["State"]["Status"] == "exited"
    started = time.monotonic()
    stack.docker("start", daemon)
    wait_until(lambda: stack.health(daemon) == "healthy", timeout_s=120,
               what="the killed daemon back after `docker start`, healthy")
    return {"crash_to_healthy_s": round(crashed_s, 1),
            "docker_start_to_healthy_s": round(time.monotonic() - started, 1)}


def scale_to_three_and_back(stack: Stack) -> dict[str, float]:
    started = time.monotonic()
    stack.compose("up", "--detach", "--wait", "--no-deps", "--scale", "daemon=3", "daemon")
    wait_until(lambda: all_consuming(stack, 3), timeout_s=120,
               what="three daemon replicas, each ready")
    three_s = time.monotonic() - started
    assert sorted(replica_ports(stack).values()) == sorted(stack.http_ports), \
        "each replica took a slot of its own"
    time.sleep(10)  # three replicas at work, partial states crossing the repartition topic
    started = time.monotonic()
    stack.compose("up", "--detach", "--wait", "--no-deps", "--scale", "daemon=1", "daemon")
    assert len(stack.containers("daemon")) == 1
    return {"scale_to_3_ready_s": round(three_s, 1),
            "scale_back_to_1_s": round(time.monotonic() - started, 1)}


def crash(stack: Stack, container: str) -> None:
    """SIGKILL the container's main process from the host, as the OOM killer or a fault
    would: an exit the container did not ask for, which its restart policy answers."""
    pid = stack.inspect(container)["State"]["Pid"]
    os.kill(pid, signal.SIGKILL)


def check_the_output(stack: Stack) -> dict[str, int]:
    """Close every window with a sentinel row per partition, then compare the output,
    read from the host, with DuckDB over everything the input topic holds."""
    records = read_topic(stack.bootstrap, stack.topic, INPUT_PARTITIONS, quiet_s=2.0)
    published = pa.concat_tables([pa.ipc.open_stream(r.value).read_all() for r in records])
    last_ms = pc.max(published["ts"]).value
    sentinel_ms = (last_ms // WINDOW_MS + 1) * WINDOW_MS + LATENESS_MS + 2 * WINDOW_MS
    sentinel = sensor_batch(rows=1, groups=1, start_ms=sentinel_ms, span_ms=1, seed=0)
    publish_tables(stack.bootstrap, stack.topic,
                   [(p, sentinel) for p in range(INPUT_PARTITIONS)])

    expected = reference(published)
    starts = set(expected["window_start"].to_list())
    windows: list[pl.DataFrame] = []

    def every_window_whole() -> bool:
        whole = list(read_output(stack.bootstrap, f"{stack.topic}-agg", idle_timeout_s=3.0,
                                 complete=True))
        windows[:] = [w.frame for w in whole if w.start_ms in starts]
        return {w.start_ms for w in whole} >= starts

    wait_until(every_window_whole, timeout_s=180, interval_s=2.0,
               what="every window before the sentinel whole on the output topic")
    got = pl.concat(windows).with_columns(pl.col("window_start").dt.epoch("ms"),
                                          pl.col(KEYS).cast(pl.String))
    window_keys = ["window_start", *KEYS]
    lost = expected.join(got.select(window_keys), on=window_keys, how="anti").height
    assert (lost, repeated_groups(got, KEYS)) == (0, 0), "rows lost or (window, keys) twice"
    assert_frame_equal(got.select(expected.columns).sort(window_keys), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert read_topic(stack.bootstrap, f"{stack.topic}-late", 1, quiet_s=1.0) == []
    assert read_topic(stack.bootstrap, f"{stack.topic}-dlq", 1, quiet_s=1.0) == []
    return {"input_messages": len(records), "input_rows": published.num_rows,
            "windows": len(starts), "output_rows": got.height, "lost": lost,
            "duplicated": repeated_groups(got, KEYS)}


def reference(rows: pa.Table) -> pl.DataFrame:  # noqa: ARG001 - DuckDB scans ``rows``
    """GROUP BY window and keys in DuckDB SQL, independent of the code under test."""
    sql = f"""
        SELECT (epoch_ms(ts) // {WINDOW_MS}) * {WINDOW_MS} AS window_start, site, sensor,
               SUM(reading_sum) AS reading_sum, SUM(reading_count)::BIGINT AS reading_count,
               MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
               SUM(power) AS power, SUM(error_count)::BIGINT AS error_count,
               COUNT(*)::BIGINT AS row_count
        FROM rows GROUP BY ALL
    """  # noqa: S608 - only integers are formatted in
    relation = duckdb.sql(sql)
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort(["window_start", *KEYS])


def test_stop_ends_the_daemon_with_exit_0_within_its_grace_period(stack: Stack) -> None:
    # compose sends SIGTERM and, once stop_grace_period has passed, SIGKILL (exit 137):
    # exit code 0 and the daemon's own last line mean it stopped within the grace period.
    (daemon,) = stack.containers("daemon")
    stack.compose("stop", "daemon", timeout_s=STOP_GRACE_S + 30)
    state = stack.inspect(daemon)["State"]
    assert state["ExitCode"] == 0, stack.logs("daemon")[-3000:]
    assert not state["OOMKilled"]
    assert "stopped cleanly" in stack.logs("daemon")
    down = stack.compose("down", "--volumes", timeout_s=STOP_GRACE_S + 60, check=False)
    assert down.returncode == 0, down.stderr[-3000:]
    assert stack.compose("ps", "--all", "--quiet").stdout.split() == []
