"""The whole job end to end, arrowagg against the tools a user would pick instead.

Each peer is a process of its own (``bench/*_app.py``, arrowagg's in this interpreter,
the others in their own virtualenvs, which ``make bench`` makes), written as a fluent user
of that tool writes it. Each is given a fresh one-partition topic holding its slice
(``bench.peer_data``) and a closing row, and writes its results to a fresh output topic
whose timestamps are the broker's append times. The harness launches it, reads the output
until every expected result is there, stops it, reads what is left and checks it all
against DuckDB. A peer whose output is wrong is reported as wrong, not timed.

Times: ``launched`` (just before the process starts), ``first_input`` (the runner notes its
first input message), ``last_result`` (the broker's append time of the result that
completed the set; for arrowagg the commit that made it readable). Startup is launch ->
first input; the steady rate is rows / (first input -> last result).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from bench import jvm_peers, peer_data
from bench.broker import create_topic, delete_topics, fill
from bench.payloads import WINDOW_MS, Payloads
from bench.sizes import PeerRun
from wire.output import decode_output

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
STOP_GRACE_S = 30


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    venv: str | None  # under .venv/; None: this interpreter
    script: str
    input: Literal["arrow", "json"]
    shape: peer_data.ResultShape
    uneven: str  # what makes the comparison with arrowagg uneven, said plainly
    package: str | None = None  # whose version the results are stamped with
    extra: tuple[str, ...] = ()
    group_from_start: bool = False  # commit offset 0 for the group before launching
    probe_startup: bool = False  # startup from a separate run with --probe
    jvm: Literal["flink", "kstreams"] | None = None  # what bench.jvm_peers sets up

    def missing(self) -> str | None:
        """Why this peer cannot run on this machine, or None."""
        if self.jvm == "kstreams":
            return jvm_peers.kstreams_missing()
        if self.jvm == "flink":
            return jvm_peers.flink_missing(self.python())
        if not self.python().exists():
            return f"no interpreter: make bench installs one in .venv/{self.venv}"
        return None

    def python(self) -> Path:
        if self.venv is None:
            return Path(sys.executable)
        default = REPO / ".venv" / self.venv / "bin" / "python"
        return Path(os.environ.get(f"BENCH_{self.venv.upper()}_PYTHON", str(default)))


PEERS = (
    Peer("arrowagg", "arrowagg daemon", None, "arrowagg_app.py", "arrow", "arrowagg",
         "the reference: Arrow IPC input, 10,000 rows a message, exactly-once (Kafka "
         "transactions), one process"),
    Peer("quix", "Quix Streams", "quix", "quix_app.py", "arrow", "quix",
         "same Arrow input, but decoded by pyarrow into a Python dict a row; group_by "
         "sends every row once more through a repartition topic; window state in RocksDB "
         "with a changelog topic; at-least-once (its default); one process",
         package="quixstreams"),
    Peer("bytewax", "Bytewax, Arrow input", "bytewax", "bytewax_app.py", "arrow", "bytewax",
         "same Arrow input, but decoded by pyarrow into a Python dict a row and folded "
         "in Python; at-least-once (no recovery store: a restart replays the topic from "
         "its start); one worker",
         package="bytewax", extra=("arrow",)),
    Peer("bytewax_json", "Bytewax, JSON input", "bytewax", "bytewax_app.py", "json",
         "bytewax",
         "JSON input, one row a message (10,000 times arrowagg's message count); folded "
         "in Python; at-least-once (as above); one worker",
         extra=("json",)),
    Peer("denormalized", "Denormalized", "denormalized", "denormalized_app.py", "json",
         "denormalized",
         "JSON input, one row a message, each a one-row batch through DataFusion; its "
         "Kafka sink awaits each result row's delivery; no guarantee (it commits no "
         "offsets and starts at the latest one: a restart skips what came meanwhile); "
         "pinned to one core, the only setting where its windows came out right",
         package="denormalized", group_from_start=True, probe_startup=True),
    Peer("flink", "Flink SQL", "flink", "flink_app.py", "json", "flink",
         "JSON input, one row a message (as Flink users publish), read by the Kafka SQL "
         "connector; the planner's window aggregate on the default (heap) state backend; "
         "exactly-once: a checkpoint a second (to files) and the transactional Kafka sink, so "
         "results are readable from the checkpoint after they are written; one JVM (a local "
         "MiniCluster, beside PyFlink's Python gateway), parallelism 2 (the cores), the "
         "source 1 (the one input partition)",
         package="apache-flink", jvm="flink"),
    Peer("kstreams", "Kafka Streams", None, "", "json", "kstreams",
         "JSON input, one row a message; groupBy sends every row once more through a "
         "repartition topic; window state in RocksDB with a changelog topic, and "
         "suppress's buffer with one of its own; exactly-once (exactly_once_v2, a commit a "
         "second); one JVM, "
         "a stream thread per core over the one input partition (one task reads, one "
         "aggregates)",
         jvm="kstreams"),
)
BY_NAME = {peer.name: peer for peer in PEERS}


def run_all(bootstrap: str, runs: dict[str, PeerRun],
            step: Callable[[str], None] = lambda _what: None) -> dict[str, Any]:
    """Every peer in ``runs`` (in ``schedule`` order); skipped ones say why."""
    results: dict[str, Any] = {}
    slices: dict[str, tuple[Payloads, Any]] = {}
    figures: dict[str, list[dict[str, Any]]] = {}
    for name, run in runs.items():
        peer = BY_NAME[name]
        about = {"label": peer.label, "input": peer.input, "uneven": peer.uneven}
        if run.windows == 0:
            results[name] = {**about, "skipped": "not run at these sizes"}
        elif (why := peer.missing()) is not None:
            results[name] = {**about, "skipped": why}
        else:
            payloads = peer_data.slice_payloads(run.windows)
            slices[name] = (payloads, peer_data.reference(payloads))
            figures[name] = []
    for name in schedule({n: r for n, r in runs.items() if n in slices}):
        peer, (payloads, expected) = BY_NAME[name], slices[name]
        step(f"e2e peers: {peer.label}, {payloads.windows} windows of 20,000 rows")
        figures[name].append(measure(bootstrap, peer, payloads, expected))
    return {name: results.get(name) or _median(figures[name]) for name in runs}


def schedule(runs: dict[str, PeerRun]) -> list[str]:
    """The order of the runs: arrowagg's repetitions spread over the section (first,
    between the others, last), since its rate is the numerator of every ratio and the
    machine's load drifts; the others in order."""
    others = [name for name, run in runs.items() if name != "arrowagg"
              for _ in range(run.repetitions)]
    ours = runs["arrowagg"].repetitions if "arrowagg" in runs else 0
    if ours == 0:
        return others
    if ours == 1:
        return ["arrowagg", *others]
    order: list[str] = []
    for i in range(ours):
        order.append("arrowagg")
        if i < ours - 1:
            order += others[len(others) * i // (ours - 1):len(others) * (i + 1) // (ours - 1)]
    return order


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    timed = sorted((r for r in runs if "rows_per_s" in r), key=lambda r: r["rows_per_s"])
    if len(timed) < len(runs):  # any wrong run makes the peer wrong
        return next(r for r in runs if "rows_per_s" not in r)
    chosen = timed[(len(timed) - 1) // 2]
    return {**chosen, "runs_rows_per_s": [r["rows_per_s"] for r in runs]}


def measure(bootstrap: str, peer: Peer, payloads: Payloads, expected: Any,
            on_start: Callable[[int], object] = lambda _pid: None) -> dict[str, Any]:
    """One run of ``peer`` over a fresh topic holding ``payloads``; ``on_start`` is given
    the process id of the timed run (the leader of its process group)."""
    values = [*payloads.values, peer_data.closing_arrow(payloads)]
    if peer.input == "json":
        values = [row for value in values for row in peer_data.json_rows(value)]
    source = create_topic(bootstrap, f"peer-{peer.name}", 1)
    output = create_topic(bootstrap, f"peer-{peer.name}-out", 1,
                          {"message.timestamp.type": "LogAppendTime"})
    groups = [f"bench-{peer.name}-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    load = os.getloadavg()[0]  # other work on the machine: the noise in this run
    try:
        fill(bootstrap, source, [(0, v) for v in values])
        startup = _probe(bootstrap, peer, source, groups[1]) if peer.probe_startup else None
        run = _launch(bootstrap, peer, source, output, group=groups[0],
                      expected=expected.height, on_start=on_start)
    finally:
        delete_topics(bootstrap, [source, output, *_topics_of(bootstrap, groups)])
    base = {"label": peer.label, "input": peer.input, "uneven": peer.uneven, "load": load,
            "launched": run.launched, "windows": payloads.windows, "rows": payloads.rows,
            "messages": len(values), "exit_code": run.exit_code}
    got = None
    try:
        got = peer_data.data_results(
            peer_data.results_frame(peer.shape, run.records), payloads)
        wrong = peer_data.check(got, expected) if run.complete_at else (
            f"{run.rows:,} of {expected.height:,} results before it {run.ended}")
    except Exception as err:  # noqa: BLE001 - an unreadable output is a wrong output
        wrong = f"unreadable output: {err}"
    if wrong is not None:  # its stderr to the console only: it names this machine's paths
        print(f"{peer.label} was wrong; its stderr ends:\n{run.stderr[-1500:]}",
              file=sys.stderr, flush=True)
        return {**base, "wrong": wrong}
    first = run.reported.get("first_input")
    if startup is not None:  # the probe's startup, placed before this run's last result
        first = run.launched + startup
    if first is None:
        return {**base, "wrong": "the runner reported no first input"}
    last = max(run.last_append_s, float(run.reported.get("committed", 0.0)))
    return {**base, "results": got.height if got is not None else 0,
            "startup_from": "a probe run" if startup is not None else "this run",
            **peer_data.timing(payloads.rows, launched=run.launched, first_input=first,
                               last_result=last)}


def _probe(bootstrap: str, peer: Peer, source: str, group: str) -> float:
    """Launch -> first input of a ``--probe`` run, stopped as soon as that is known."""
    _prepare_group(bootstrap, peer, source, group)
    with tempfile.TemporaryFile("w+") as out:
        launched = time.time()
        process = subprocess.Popen([*_command(peer, bootstrap, source, "unused", group),
                                    "--probe"], stdout=out, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and process.poll() is None:
                out.seek(0)
                if "first_input" in (found := peer_data.reported(out.readlines())):
                    return float(found["first_input"]) - launched
                time.sleep(0.05)
        finally:
            _stop(process, signal.SIGKILL)
    raise RuntimeError(f"{peer.label}'s probe run reported no first input")


@dataclass
class Run:
    launched: float
    records: list[peer_data.OutputRecord]
    rows: int
    last_append_s: float
    complete_at: float | None
    ended: str
    exit_code: int | None
    reported: dict[str, Any]
    stderr: str


def _launch(bootstrap: str, peer: Peer, source: str, output: str, *, group: str,
            expected: int, on_start: Callable[[int], object], timeout_s: float = 900) -> Run:
    _prepare_group(bootstrap, peer, source, group)
    reader = OutputReader(bootstrap, output, peer.shape, expected)
    reader.start()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        launched = time.time()
        process = subprocess.Popen(_command(peer, bootstrap, source, output, group),
                                   stdout=out, stderr=err, start_new_session=True)
        on_start(process.pid)
        deadline = time.monotonic() + timeout_s
        ended = "timed out"
        while reader.complete_at is None and time.monotonic() < deadline:
            if process.poll() is not None:
                ended = f"exited ({process.returncode})"
                break
            time.sleep(0.02)
        _stop(process, signal.SIGTERM)  # all results are in: no need to be gentle
        reader.drain()
        out.seek(0)
        err.seek(0)
        return Run(launched, reader.records, reader.rows, reader.complete_append_s,
                   reader.complete_at, ended, process.returncode,
                   peer_data.reported(out.readlines()), err.read())


def _command(peer: Peer, bootstrap: str, source: str, output: str, group: str) -> list[str]:
    if peer.jvm == "kstreams":
        return jvm_peers.kstreams_command(bootstrap, source, output, group, str(WINDOW_MS))
    tail = list(peer.extra) if peer.extra else [group]
    return [str(peer.python()), str(BENCH / peer.script), bootstrap, source, output, *tail,
            str(WINDOW_MS)]


def _prepare_group(bootstrap: str, peer: Peer, source: str, group: str) -> None:
    if peer.group_from_start:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            consumer.commit(offsets=[TopicPartition(source, 0, 0)], asynchronous=False)
        finally:
            consumer.close()


def _topics_of(bootstrap: str, groups: Sequence[str]) -> list[str]:
    """The topics a peer made for itself (Quix's repartition and changelog topics carry
    the consumer group's name)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = admin.list_topics(timeout=30).topics
    return [name for name in names if any(group in name for group in groups)]


def _stop(process: subprocess.Popen[Any], how: signal.Signals) -> None:
    """Stop the peer's process group (PyFlink's JVM is a child of its Python)."""
    if process.poll() is None:
        _signal_group(process, how)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
    _signal_group(process, signal.SIGKILL)  # whatever outlived its parent


def _signal_group(process: subprocess.Popen[Any], how: signal.Signals) -> None:
    try:
        os.killpg(process.pid, how)
    except ProcessLookupError:
        return


class OutputReader(threading.Thread):
    """Reads a peer's output topic (read_committed) from the start, counting result rows;
    notes when ``expected`` rows are there and the broker's append time of the last one."""

    def __init__(self, bootstrap: str, topic: str, shape: peer_data.ResultShape,
                 expected: int) -> None:
        super().__init__(name=f"read-{topic}", daemon=True)
        self.shape = shape
        self.expected = expected
        self.records: list[peer_data.OutputRecord] = []
        self.rows = 0
        self.complete_at: float | None = None
        self.complete_append_s = 0.0
        self._stopping = threading.Event()
        self._deadline = float("inf")
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        })
        self._consumer.assign([TopicPartition(topic, 0, 0)])

    def run(self) -> None:
        at_end = False  # the last event was the end of the partition
        try:
            while not (self._stopping.is_set() and (at_end or self._past_deadline())):
                message = self._consumer.poll(0.05)
                if message is None:
                    continue
                error = message.error()
                if error is None:
                    at_end = False
                    self._take(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end = True
                else:
                    raise KafkaException(error)
        finally:
            self._consumer.close()

    def _past_deadline(self) -> bool:
        return time.monotonic() > self._deadline

    def _take(self, message: Any) -> None:
        record = peer_data.OutputRecord(message.key(), message.value(), message.headers())
        self.records.append(record)
        self.rows += (decode_output(record.value, record.headers).frame.height
                      if self.shape == "arrowagg" else 1)
        kind, stamp = message.timestamp()
        if self.complete_at is None:
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                self.complete_append_s = max(self.complete_append_s, stamp / 1000)
            if self.rows >= self.expected:
                self.complete_at = time.time()

    def drain(self, timeout_s: float = 30) -> None:
        """Read what is left (results written after the set was complete) and stop."""
        time.sleep(0.5)  # results the stopped process flushed last are fetched by then
        self._deadline = time.monotonic() + timeout_s
        self._stopping.set()
        self.join(timeout_s + 5)

