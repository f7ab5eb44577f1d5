"""A rebalance storm through Apache Kafka, with and without the scale-out: while the
workers publish, instances of one group join and leave every 0.5-2 s (SIGTERM, SIGKILL),
one is stalled (SIGSTOP) past max.poll.interval.ms and woken, and zombies are started
with the instance id of a running one. Every broker call of the run loop meets
rebalances half-way (docs/reliability.md, "Broker calls and their errors"); the output
must still equal DuckDB over everything sent, and every instance that ended must have
ended cleanly: exit 0 after SIGTERM, or exit 1 with one line that says it was fenced.

The storm blows over time windows that merge (one stage and the scale-out) and over the
scale-out's hardest mode: session windows with aggregates that need every value, whose
late rows revise sessions already out (late: revise)."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.cells import (
    GAP_MS,
    LATE,
    SESSION_PLANS,
    after_the_end,
    held_rows,
    held_sessions,
    late_pairs,
    session_cell_input,
)
from tests.integration.conftest import committed_offsets, end_offsets
from tests.integration.data import KEYS, output_frame, reference
from tests.integration.faults import (
    DurablePublisher,
    PacedPublishing,
    keyed_by_partition,
    read_topic,
    repeated_groups,
    wait_until,
    write_figures,
)
from tests.integration.instances import (
    FENCED_EXIT_S,
    REPARTITIONS,
    SIZE_MS,
    Instances,
    check_output,
    make_topics,
    session_frontiers,
    wait_all_windows,
    worker_batches,
)
from tests.integration.session_data import session_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORM_S = 24.0
STALL_S = 11.0  # past max.poll.interval.ms (8 s) and the session (6 s)
MAX_RUNNING = 4


@dataclass
class Member:
    name: str
    instance_id: str
    process: subprocess.Popen[bytes]
    ending: str | None = None  # "term", "kill" or "fenced": how the test ended it
    stalled_until: float | None = None
    # A zombie: started with the id of ``rival_of``, a running member. Two consumers with
    # one group.instance.id race, and the broker keeps whichever joins last: when the
    # elder rejoins after its zombie (a rebalance was under way), the zombie is fenced.
    rival_of: str | None = None


@dataclass
class Storm:
    """The instances of the storm and what the test did to them."""

    instances: Instances
    rng: random.Random
    members: dict[str, Member] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)
    ended: list[Member] = field(default_factory=list)
    # The ids of killed instances, taken by the next to join (as a restart policy would):
    # a new producer with the id aborts the transaction the killed one left open, which
    # would otherwise hold read_committed readers back for transaction.timeout.ms.
    killed_ids: list[str] = field(default_factory=list)
    due: list[str] = field(default_factory=lambda: ["zombie", "stall", "kill", "term"])

    def join(self, instance_id: str | None = None) -> Member:
        name = f"i{len(self.members) + len(self.ended)}"
        if instance_id is None:
            instance_id = self.killed_ids.pop() if self.killed_ids else name
        process = self.instances.launch(name, instance_id)
        member = Member(name, instance_id, process)
        self.members[name] = member
        return member

    def live(self) -> list[Member]:
        """Members consuming, neither stalled nor being ended."""
        return [m for m in self.members.values() if m.ending is None
                and m.stalled_until is None and self.instances.consuming(m.name)]

    def act(self) -> None:
        """One action: the first of ``due`` that can be done now, else a random one."""
        live = self.live()
        choices = ["join"] if len(self.members) < MAX_RUNNING else []
        if len(live) > 1:
            choices += ["term", "kill", "zombie"]
            if not any(m.stalled_until for m in self.members.values()):
                choices.append("stall")
        if not choices:
            return
        action = next((a for a in self.due if a in choices), self.rng.choice(choices))
        if action in self.due:
            self.due.remove(action)
        self.actions[action] = self.actions.get(action, 0) + 1
        if action == "join":
            self.join()
            return
        victim = self.rng.choice(live)
        if action == "zombie":  # a second process with its id: the first must go, fenced
            victim.ending = "fenced"
            self.join(victim.instance_id).rival_of = victim.name
        elif action == "stall":
            victim.process.send_signal(signal.SIGSTOP)
            victim.stalled_until = time.monotonic() + STALL_S
        else:
            victim.ending = action
            victim.process.send_signal(signal.SIGTERM if action == "term" else signal.SIGKILL)
            if action == "kill":
                self.killed_ids.append(victim.instance_id)

    def reap(self) -> None:
        """Wake the stalled whose time is up; collect the members that exited."""
        for member in list(self.members.values()):
            if member.stalled_until is not None and time.monotonic() >= member.stalled_until:
                member.process.send_signal(signal.SIGCONT)
                member.stalled_until = None
            if member.process.poll() is not None:
                self.ended.append(self.members.pop(member.name))

    def calm(self) -> None:
        """Wake the stalled, wait for those being ended; at least two keep consuming."""
        for member in self.members.values():
            if member.stalled_until is not None:
                member.process.send_signal(signal.SIGCONT)
                member.stalled_until = None
        for member in list(self.members.values()):
            if member.ending is not None:
                member.process.wait(FENCED_EXIT_S)
        self.reap()
        while len(self.members) < 2 or self.killed_ids:
            self.join()
        wait_until(lambda: len(self.live()) >= 2, timeout_s=60, what="two instances consuming")

    def stop_all(self) -> None:
        for member in self.members.values():
            member.ending = "term"
            member.process.send_signal(signal.SIGTERM)
        for member in self.members.values():
            member.process.wait(60)
        self.reap()


def storm(instances: Instances, publishing: PacedPublishing, seed: int) -> Storm:
    weather = Storm(instances, random.Random(seed))
    weather.join()
    weather.join()
    wait_until(lambda: len(weather.live()) == 2, timeout_s=60, what="two instances consuming")
    ends = time.monotonic() + STORM_S
    while time.monotonic() < ends:
        time.sleep(weather.rng.uniform(0.5, 2.0))
        weather.reap()
        weather.act()
    publishing.finish()
    weather.calm()
    return weather


def exits(weather: Storm, instances: Instances) -> dict[str, int]:
    """Every ended instance's exit, checked against how it was ended: 0 after SIGTERM,
    1 with one line saying "fenced" for a zombie's elder (or for the zombie, when the
    elder won the race for their id), and never a traceback."""
    counts: dict[str, int] = {}
    for member in weather.ended:
        code = member.process.returncode
        text = instances.log(member.name).read_text()
        last = text.strip().splitlines()[-1] if text.strip() else ""
        assert "Traceback" not in text, f"{member.name}: {text[-3000:]}"
        ending = member.ending
        if ending is None and member.rival_of is not None and code == 1:
            ending = "fenced-zombie"  # its elder rejoined last (Member.rival_of)
        if ending == "term":
            assert code == 0, f"{member.name} exited {code} after SIGTERM: {last}"
        elif ending in ("fenced", "fenced-zombie"):
            assert code == 1, f"{member.name} (fenced) exited {code}: {last}"
            assert last.startswith("consumer: "), last
            assert "fenced" in last, last
        else:
            assert ending == "kill", (member, last)
            assert code == -signal.SIGKILL, (member, last)
        counts[f"{ending}:{code}"] = counts.get(f"{ending}:{code}", 0) + 1
    return counts


@pytest.mark.parametrize("scale_out", [False, True], ids=["one-stage", "scale-out"])
def test_a_rebalance_storm_leaves_the_output_exact_and_every_exit_clean(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, scale_out: bool,
) -> None:
    topics = make_topics(topic_factory)
    rng = random.Random(31)
    data = worker_batches(rng)
    if not scale_out:  # one stage: a group's rows must live in one partition
        data = keyed_by_partition(data)
    instances = Instances(tmp_path, bootstrap, topics, repartitions=6 if scale_out else None)
    publisher = DurablePublisher(bootstrap, topics["input"])
    weather = Storm(instances, rng)
    try:
        publishing = PacedPublishing(publisher, data, pause_s=0.02)
        weather = storm(instances, publishing, seed=31)
        publisher.flush()
        if scale_out:
            wait_all_windows(bootstrap, topics, data)
        else:
            wait_one_stage_windows(bootstrap, topics)
        weather.stop_all()
    finally:
        instances.kill_all()
    ended = exits(weather, instances)
    logs = [instances.log(m.name) for m in weather.ended]
    if scale_out:
        figures = check_output(bootstrap, topics, data, logs)
    else:
        figures = check_one_stage(bootstrap, topics, data)
    write_figures(f"rebalance_storm_{'scale_out' if scale_out else 'one_stage'}",
                  {"actions": weather.actions, "exits": ended, **figures})
    assert weather.due == [], f"every kind of action was taken: {weather.actions}"


def wait_one_stage_windows(bootstrap: str, topics: dict[str, str]) -> None:
    """Until the group's offsets reach the input's end: every window of the input is in a
    committed transaction (offsets pass only input whose windows are all emitted)."""
    wait_until(lambda: committed_offsets(bootstrap, topics["group"], topics["input"])
               == end_offsets(bootstrap, topics["input"]),
               timeout_s=120, what="every input record committed")


def check_one_stage(bootstrap: str, topics: dict[str, str],
                    data: list[tuple[int, pa.Table]]) -> dict[str, int]:
    got, _starts = output_frame(bootstrap, topics["output"])
    expected = reference([t for _, t in data], SIZE_MS)
    window_keys = ["window_start", *KEYS]
    late = read_topic(bootstrap, topics["late"], 1, quiet_s=1.0)
    figures = {"input_rows": sum(t.num_rows for _, t in data), "output_rows": got.height,
               "reference_rows": expected.height, "duplicates": repeated_groups(got, KEYS),
               "lost": expected.join(got.select(window_keys), on=window_keys,
                                     how="anti").height,
               "late_records": len(late)}
    print(figures)
    assert figures["duplicates"] == 0
    assert figures["late_records"] == 0
    assert_frame_equal(got.drop("window_end").select(expected.columns).sort(window_keys),
                       expected, check_exact=False, rel_tol=1e-9, abs_tol=1e-9,
                       check_dtypes=False)
    return figures


def test_a_rebalance_storm_leaves_revised_holistic_sessions_exact(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
) -> None:
    """Session windows in the scale-out, median/quantile/n_unique/an expression over the
    values stage 1 sends with its partial sessions, rows far behind (late) and rows behind
    sessions (merged, or revising them once out), through the storm; after it, rows
    behind sessions that went out, which revise them. What a subscriber holds, every
    revision applied, is DuckDB's sessions of every row not sent late."""
    sections, aggregates = SESSION_PLANS["holistic"]
    sections = {**sections, "window": {**sections["window"], **LATE["revise"]}}
    topics = make_topics(topic_factory)
    data, far = session_cell_input(random.Random(37), revise=True)
    rows = pa.concat_tables([t for _, t in data])
    last_end = int(pl.DataFrame(rows).select(pl.col("ts").dt.epoch("ms").max()).item()) + GAP_MS
    instances = Instances(tmp_path, bootstrap, topics, sections=sections)
    publisher = DurablePublisher(bootstrap, topics["input"])
    weather = Storm(instances, random.Random(37))
    try:
        # Paced to span the storm, as the time windows' input does.
        publishing = PacedPublishing(publisher, data, pause_s=STORM_S / len(data))
        weather = storm(instances, publishing, seed=37)
        publisher.flush()
        wait_until(lambda: (t := session_frontiers(bootstrap, topics["output"])) and len(t)
                   == REPARTITIONS and min(t.values()) >= last_end,
                   timeout_s=120, what="every part's frontier past the last session")
        # Rows behind sessions that went out, kept through the storm: they revise them.
        behind = after_the_end(rows, max(rows.column("row_id").to_pylist()) + 1)
        before = held_rows(bootstrap, topics["output"])
        publisher.publish(0, behind)
        publisher.flush()
        rows = pa.concat_tables([rows, behind])
        wait_until(lambda: held_rows(bootstrap, topics["output"]) >= before + behind.num_rows,
                   timeout_s=60, what="the updates the rows behind make")
        weather.stop_all()
    finally:
        instances.kill_all()
    ended = exits(weather, instances)
    late_ids = set(late_pairs(bootstrap, topics["late"]).get_column("row_id").to_list())
    got, updates = held_sessions(bootstrap, topics["output"])
    kept = rows.filter(pa.array([i not in late_ids for i in rows.column("row_id").to_pylist()]))
    expected = session_reference([kept], GAP_MS, aggregates)
    session_keys = ["window_start", *KEYS]
    figures = {
        "input_rows": rows.num_rows, "sessions": expected.height, "update_rows": updates,
        "output_rows": got.height, "late_rows": len(late_ids), "far_behind_rows": len(far),
        "duplicates": got.group_by(session_keys).len().filter(pl.col("len") > 1).height,
        "lost": expected.join(got, on=session_keys, how="anti").height,
    }
    print(figures)
    write_figures("rebalance_storm_sessions", {"actions": weather.actions, "exits": ended,
                                               **figures})
    assert late_ids == far, "exactly the rows far behind are late, each once"
    assert figures["duplicates"] == 0
    assert updates > 0, "rows behind sessions already out revised them"
    assert int(got.get_column("row_count").sum()) + len(late_ids) == rows.num_rows
    assert_frame_equal(got.select(expected.columns).sort(session_keys),
                       expected.sort(session_keys), check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert weather.due == [], f"every kind of action was taken: {weather.actions}"
