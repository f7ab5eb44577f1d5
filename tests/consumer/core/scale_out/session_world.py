"""A world of session windows through both stages of the scale-out, with no broker:
stage-1 instances owning input partitions, a stage 2 over repartition partitions, each
able to crash and restart from what it committed (shared by the scale-out session
tests)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from consumer.core.emit import OutputSpec
from consumer.core.offsets import CommitMetadata
from consumer.core.plan import AggregationPlan
from consumer.core.poll import Counters
from consumer.core.scale_out.session_runs import SessionRunsEngine
from consumer.core.scale_out.stage_one import PartialEmitter
from consumer.core.scale_out.stage_two import StageTwo
from consumer.core.types import InputMessage, OutputRecord, PartitionKey
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.windows.helpers import EVENT_PLAN, UTC_MS, Row, frame, ref
from tests.consumer.core.windows.session.harness import SORT
from wire.complete import WindowAssembler
from wire.output import decode_message

GAP_MS = 100
LATENESS_MS = 50
IDLE_MS = 1_000
INPUTS = [("in", p) for p in range(4)]
OWNERS = {"a": INPUTS[:2], "b": INPUTS[2:3], "c": INPUTS[3:]}  # three instances
REPARTITIONS = 2
Committed = dict[PartitionKey, tuple[int | None, CommitMetadata | None]]


def generated(rng: random.Random, messages: int, *, pauses: bool = False,
              ) -> dict[PartitionKey, list[list[Row]]]:
    """Per input partition, messages of rows nearly in time order (every key in every
    partition), and now and then a row far behind (late) or just behind (not late).
    ``pauses``: every sixth message comes after a pause longer than the gap, so sessions
    close while rows of them may still come (late: revise)."""
    out: dict[PartitionKey, list[list[Row]]] = {}
    for partition in INPUTS:
        log = []
        for m in range(messages):
            base = m * 45 + (m // 6 * 250 if pauses else 0) + rng.randrange(0, 30)
            rows: list[Row] = [(rng.choice("vwxyz"), base + rng.randrange(0, 60),
                                rng.randrange(-8, 9) / 4, rng.randrange(0, 5),
                                rng.randrange(0, 64) / 8) for _ in range(rng.randrange(1, 6))]
            if rng.random() < 0.15:
                back = rng.choice([40, 120, 400])
                rows.append((rng.choice("vwxyz"), max(0, base - back), 1.0, 1, 0.5))
            if pauses and m % 6 in (1, 2) and rng.random() < 0.5:  # into the sessions
                back = rng.choice([260, 290, 320])  # the pause may have closed
                rows.append((rng.choice("vwxyz"), max(0, base - back), 2.0, 2, 1.5))
            log.append(rows)
        out[partition] = log
    return out


def late_by_rule(inputs: dict[PartitionKey, list[list[Row]]],
                 revise_within_ms: int | None = None) -> list[Row]:
    """A row is late when its own session (row + gap) ends at or before its partition's
    largest earlier time less the allowed lateness (the watermark), and, with
    ``revise_within_ms`` (late: revise), it is more than that before the watermark."""
    late = []
    for log in inputs.values():
        seen: int | None = None
        for rows in log:
            if seen is not None:
                watermark = seen - LATENESS_MS
                late += [r for r in rows if r[1] + GAP_MS <= watermark and (
                    revise_within_ms is None or r[1] < watermark - revise_within_ms)]
            top = max(r[1] for r in rows)
            seen = top if seen is None else max(seen, top)
    return late


@dataclass
class Instance:
    """One stage-1 instance: its engine, what it consumed and what it committed."""

    partitions: list[PartitionKey]
    emitter: PartialEmitter
    engine: SessionRunsEngine = field(init=False)
    committed: Committed = field(default_factory=dict)
    next: dict[PartitionKey, int] = field(default_factory=dict)
    plan: AggregationPlan = EVENT_PLAN
    revise_within_ms: int | None = None  # late: revise

    def start(self, now_ms: int) -> None:
        self.engine = SessionRunsEngine(self.plan, SessionSpec(GAP_MS), event_time=True,
                                        time_dtype=UTC_MS, allowed_lateness_ms=LATENESS_MS,
                                        idle_timeout_ms=IDLE_MS, send_every_ms=0,
                                        revise_within_ms=self.revise_within_ms)
        for partition in self.partitions:
            offset, metadata = self.committed.get(partition, (None, None))
            self.engine.assign(partition, offset, metadata, now_ms)
            self.next[partition] = offset or 0


@dataclass
class World:
    inputs: dict[PartitionKey, list[list[Row]]]
    repartition: dict[int, list[OutputRecord]] = field(
        default_factory=lambda: {k: [] for k in range(REPARTITIONS)})
    late: list[pl.DataFrame] = field(default_factory=list)
    output: list[OutputRecord] = field(default_factory=list)
    stage_two: StageTwo = field(init=False)
    two_committed: Committed = field(default_factory=dict)
    two_next: dict[int, int] = field(default_factory=dict)
    emit_every_ms: int | None = None  # stage 2's early results
    plan: AggregationPlan = EVENT_PLAN
    revise_within_ms: int | None = None  # late: revise, in both stages
    budget: tuple[int, int] | None = None  # stage 2's (max groups, max buffered values)

    def start_two(self) -> None:
        revise = self.revise_within_ms is not None
        self.stage_two = StageTwo(OutputSpec("out", "g", late_topic="late",
                                             revision_column=revise),
                                  partitions=REPARTITIONS, inputs=set(INPUTS), merge_every=4,
                                  counters=Counters(), emit_every_ms=self.emit_every_ms,
                                  revise_within_ms=self.revise_within_ms,
                                  sessions=SessionSpec(GAP_MS), budget=self.budget)
        for k in range(REPARTITIONS):
            offset, metadata = self.two_committed.get(("rep", k), (None, None))
            self.stage_two.assign(("rep", k), offset, metadata)
            self.two_next[k] = offset or 0

    def step_one(self, instance: Instance, now_ms: int, *, crash: bool) -> None:
        """Feed the instance one message of each partition, flush; commit unless it
        crashes (then it restarts from its last commit)."""
        records: list[OutputRecord] = []
        late: list[pl.DataFrame] = []
        for partition in instance.partitions:
            offset = instance.next[partition]
            if offset >= len(self.inputs[partition]):
                continue
            rows = self.inputs[partition][offset]
            found = instance.engine.add(frame(rows), [ref(partition, offset, rows)], now_ms)
            if found is not None:
                late.append(found)
            instance.next[partition] = offset + 1
        closed = instance.engine.close_due(now_ms)
        for window in closed:
            records += instance.emitter.window_records(window, self.plan)
        records += instance.emitter.progress_records(instance.engine.frontiers(now_ms), closed)
        points = instance.engine.commit_points()
        if crash:
            instance.start(now_ms)
            return
        for record in records:
            assert record.partition is not None
            self.repartition[record.partition].append(record)
        self.late += late
        instance.committed.update({p: (c.offset, c.metadata) for p, c in points.items()})

    def step_two(self, now_ms: int, *, crash: bool) -> None:
        messages = []
        for k, log in self.repartition.items():
            for offset in range(self.two_next[k], len(log)):
                record = log[offset]
                messages.append(InputMessage(("rep", k), offset, record.value,
                                             headers=list(record.headers)))
            self.two_next[k] = len(log)
        self.stage_two.process(messages)
        records, points, _ = self.stage_two.flush(now_ms)
        if crash:
            self.start_two()
            return
        self.output += records
        self.stage_two.committed(len(records))
        self.two_committed.update({p: (c.offset, c.metadata) for p, c in points.items()})


class OneStageOne:
    """One stage-1 engine owning every input partition and sending at every turn, into
    repartition partition 0 of a world whose stage 2 steps after each turn, never
    crashing (the hand-written scale-out session tests; ``emitter`` and ``engine`` for
    records written by hand)."""

    def __init__(self, *, plan: AggregationPlan = EVENT_PLAN,
                 revise_within_ms: int | None = None,
                 budget: tuple[int, int] | None = None) -> None:
        self.plan = plan
        self.engine = SessionRunsEngine(plan, SessionSpec(GAP_MS), event_time=True,
                                        time_dtype=UTC_MS, allowed_lateness_ms=0,
                                        idle_timeout_ms=IDLE_MS, send_every_ms=0,
                                        revise_within_ms=revise_within_ms)
        self.emitter = PartialEmitter("rep", 1, writer="w", compression="zstd",
                                      max_message_bytes=1_000_000)
        for partition in INPUTS:
            self.engine.assign(partition, None, None, 0)
        self.world = World({p: [] for p in INPUTS}, plan=plan,
                           revise_within_ms=revise_within_ms, budget=budget)
        self.world.start_two()
        self.world.repartition = {0: [], 1: []}
        self.world.two_next = {0: 0, 1: 0}

    def turn(self, now_ms: int, rows: list[Row] | None = None, *,
             partition: PartitionKey = INPUTS[0], offset: int = 0) -> None:
        """``rows`` (one message at ``offset`` of ``partition``) in, if any; then a send
        and a step of stage 2."""
        if rows is not None:
            self.engine.add(frame(rows), [ref(partition, offset, rows)], now_ms)
        closed = self.engine.close_due(now_ms)
        sent = [r for w in closed for r in self.emitter.window_records(w, self.plan)]
        sent += self.emitter.progress_records(self.engine.frontiers(now_ms), closed)
        self.world.repartition[0] += sent
        self.world.step_two(now_ms, crash=False)


COLUMNS = ("window_start", "window_end", "k", "v_sum", "n_count", "v_max", "row_count")


def subscribed(records: Sequence[OutputRecord], columns: Sequence[str] = COLUMNS,
               ) -> pl.DataFrame:
    """Every session a subscriber assembles (read_output(complete=True)'s rule)."""
    assembler = WindowAssembler()
    wholes = [assembler.add(decode_message(r.value, r.headers)) for r in records]
    frames = [whole.frame for whole in wholes if whole is not None]
    return pl.concat(frames).select(columns).sort(SORT)


def run(seed: int, *, crashes: bool, emit_every_ms: int | None = None,
        plan: AggregationPlan = EVENT_PLAN, max_message_bytes: int = 1_000_000,
        revise_within_ms: int | None = None, pauses: bool = False) -> World:
    """``max_message_bytes``: small, and stage 1's partials and values come in pieces;
    ``revise_within_ms``: late: revise, in both stages; ``pauses``: see ``generated``."""
    rng = random.Random(seed)
    world = World(generated(rng, 30, pauses=pauses), emit_every_ms=emit_every_ms, plan=plan,
                  revise_within_ms=revise_within_ms)
    instances = [Instance(partitions, PartialEmitter("rep", REPARTITIONS, writer=name,
                                                     compression="zstd",
                                                     max_message_bytes=max_message_bytes),
                          plan=plan, revise_within_ms=revise_within_ms)
                 for name, partitions in OWNERS.items()]
    for instance in instances:
        instance.start(0)
    world.start_two()
    now = 0
    while any(i.next[p] < len(world.inputs[p]) for i in instances for p in i.partitions):
        now += 10
        for instance in rng.sample(instances, len(instances)):
            world.step_one(instance, now, crash=crashes and rng.random() < 0.1)
        if rng.random() < 0.5:
            world.step_two(now, crash=crashes and rng.random() < 0.15)
    now += IDLE_MS * 2  # every partition idle: every session closes
    for instance in instances:
        world.step_one(instance, now, crash=False)
    world.step_two(now, crash=False)
    world.step_two(now, crash=False)
    return world


def late_rows(world: World) -> list[Row]:
    if not world.late:
        return []
    late = pl.concat(world.late).select("k", pl.col("ts").dt.epoch("ms"), "v_sum", "n_count",
                                        "v_max")
    return [tuple(r) for r in late.rows()]
