"""How big each section runs: the full ``make bench`` sizes, or the smoke test's."""

from __future__ import annotations

from dataclasses import dataclass, replace

MB = 1_000_000
GB = 1_000_000_000


@dataclass(frozen=True)
class KernelCase:
    name: str
    messages: int
    rows_per_message: int
    groups: int
    messages_per_window: int
    repetitions: int = 5


@dataclass(frozen=True)
class PeerRun:
    """How much of the peers' slice (20,000 rows a window) one end-to-end peer drains."""

    windows: int  # 0 leaves the peer out
    repetitions: int = 1  # the median run is kept


@dataclass(frozen=True)
class Sizes:
    kernel_cases: tuple[KernelCase, ...]
    poll_messages: int  # messages per engine.add, as one consume() of the daemon returns
    e2e_bytes: int
    e2e_partitions: int
    e2e_repetitions: int
    peers: dict[str, PeerRun]  # bench.peers.PEERS by name; one missing is left out
    memory_bytes: tuple[int, ...]  # at fixed cardinality
    memory_groups: tuple[int, ...]  # the cardinality sweep
    memory_sweep_bytes: int  # streamed at each point of the sweep: several windows
    memory_sweep_repetitions: int  # each point of the sweep: the median run
    latency_s: float
    latency_window_ms: int
    latency_messages_per_s: int
    latency_rows_per_message: int
    scale_out_bytes: int  # the input the 1, 2 and 3 instances drain
    # (instances, two stages) of each scale-out job: one instance without scale_out first
    scale_out_runs: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (2, True), (3, True))
    scale_out_repeats: int = 3  # the one-instance runs of each job: the table has medians
    # RSS per open group end to end (bench.peer_memory): these peers, at each cardinality
    peer_memory_peers: tuple[str, ...] = ("arrowagg", "flink", "kstreams")
    peer_memory_groups: tuple[int, ...] = (10_000, 1_000_000)
    peer_memory_windows: int = 2  # the second is the steady one
    peer_memory_rows_per_window: int = 1_000_000


FULL = Sizes(
    kernel_cases=(
        KernelCase("10M rows, 10k groups", 200, 50_000, 10_000, 10, repetitions=7),
        KernelCase("5M rows, 1M groups", 100, 50_000, 1_000_000, 20, repetitions=5),
    ),
    poll_messages=16,
    e2e_bytes=1 * GB,
    e2e_partitions=4,
    e2e_repetitions=5,
    # ~10-40 s each: arrowagg's 5M rows take about as long as its startup (a shorter
    # slice leaves its steady rate to a fraction of a second), Denormalized ~10k rows/s
    peers={"arrowagg": PeerRun(250, repetitions=3), "quix": PeerRun(20),
           "bytewax": PeerRun(20), "bytewax_json": PeerRun(20), "denormalized": PeerRun(10),
           "flink": PeerRun(20), "kstreams": PeerRun(20)},
    memory_bytes=(1 * GB, 10 * GB),
    memory_groups=(10_000, 100_000, 1_000_000),
    # 4 GB is 6 windows of 10 polls: 1 GB was 1.5, a warm-up (1M groups: 785 MB steady
    # after 1 GB, 883-912 after 4 GB, 885-895 after 8; 10k groups: 386-389 at 4 and 8).
    memory_sweep_bytes=4 * GB,
    memory_sweep_repetitions=3,
    latency_s=40.0,
    latency_window_ms=1_000,
    latency_messages_per_s=40,
    latency_rows_per_message=2_000,
    scale_out_bytes=1 * GB,
)

SMOKE = replace(
    FULL,
    kernel_cases=(KernelCase("tiny", 8, 2_000, 100, 2, repetitions=2),),
    poll_messages=3,
    e2e_bytes=4 * MB,
    e2e_partitions=2,
    e2e_repetitions=1,
    peers={"arrowagg": PeerRun(3), "quix": PeerRun(0), "bytewax": PeerRun(0),
           "bytewax_json": PeerRun(0), "denormalized": PeerRun(0), "flink": PeerRun(0),
           "kstreams": PeerRun(0)},
    memory_bytes=(10 * MB, 20 * MB),
    memory_groups=(100, 1_000),
    memory_sweep_bytes=10 * MB,
    memory_sweep_repetitions=1,
    latency_s=4.0,
    latency_window_ms=500,
    latency_messages_per_s=20,
    latency_rows_per_message=100,
    scale_out_bytes=3 * MB,
    # Both modes and a split, each job (four jobs: every launch counts in make test's time)
    scale_out_runs=((1, False), (2, True)),
    scale_out_repeats=1,
    peer_memory_peers=("arrowagg",),
    peer_memory_groups=(100, 1_000),
    peer_memory_rows_per_window=2_000,
)
