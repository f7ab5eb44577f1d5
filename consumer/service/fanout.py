"""The daemon as a service: one observer that fans the processor's hooks out to the
Prometheus metrics, the HTTP health endpoints and systemd's notify socket.

A hook that fails is logged once and never reaches the processor. Work that must run on
the main thread but is asked for from a signal handler (SIGHUP: reload) is queued here
and done on the next turn of the loop.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence

from consumer.config import ServiceSettings
from consumer.core.types import ClosedWindow, PartitionKey
from consumer.service.health import HealthServer
from consumer.service.metrics import Metrics
from consumer.service.observer import ProcessorObserver
from consumer.service.port_file import port_file
from consumer.service.sdnotify import SystemdNotifier, notifier_from_environ

log = logging.getLogger(__name__)


class ServiceObserver:
    def __init__(self, metrics: Metrics, notifier: SystemdNotifier,
                 health: HealthServer | None = None, *,
                 others: Sequence[ProcessorObserver] = ()) -> None:
        """``others`` are told too, first (e.g. a test's probe)."""
        self.metrics = metrics
        self.notifier = notifier
        self.health = health
        self._parts: list[ProcessorObserver] = [*others, metrics,
                                                *([health] if health else []), notifier]
        self._failed: set[tuple[str, str]] = set()
        self._reload: Callable[[], object] | None = None
        self._reload_requested = False
        self._stopping = False

    # -- control (signal handlers may call these) -------------------------------------

    def on_reload(self, callback: Callable[[], object]) -> None:
        self._reload = callback

    def request_reload(self) -> None:
        """Safe in a signal handler: the reload runs on the main loop's next turn."""
        self._reload_requested = True

    def stopping(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self.health is not None:
            self.health.stopping()
        self.notifier.stopping()

    def close(self) -> None:
        if self.health is not None:
            self.health.close()
        self.notifier.close()

    # -- ProcessorObserver ------------------------------------------------------------

    def loop_turned(self, now_ms: int) -> None:
        self._each("loop_turned", lambda part: part.loop_turned(now_ms))
        if self._reload_requested:
            self._reload_requested = False
            if self._reload is not None:
                self._guarded("reload", "reload", self._reload)

    def assigned(self, partitions: Sequence[PartitionKey]) -> None:
        self._each("assigned", lambda part: part.assigned(partitions))

    def revoked(self, partitions: Sequence[PartitionKey]) -> None:
        self._each("revoked", lambda part: part.revoked(partitions))

    def consumed(self, partition: PartitionKey, messages: int, rows: int, nbytes: int) -> None:
        self._each("consumed", lambda part: part.consumed(partition, messages, rows, nbytes))

    def rejected(self, reason: str) -> None:
        self._each("rejected", lambda part: part.rejected(reason))

    def rejected_rows(self, reason: str, rows: int) -> None:
        self._each("rejected_rows", lambda part: part.rejected_rows(reason, rows))

    def late(self, rows: int) -> None:
        self._each("late", lambda part: part.late(rows))

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,
                  committed_at_ms: int) -> None:
        self._each("committed",
                   lambda part: part.committed(windows, closed_at_ms, committed_at_ms))

    def aborted(self) -> None:
        self._each("aborted", lambda part: part.aborted())

    def rebalanced(self) -> None:
        self._each("rebalanced", lambda part: part.rebalanced())

    def state(self, *, open_windows: int, groups: int, ready: bool, paused: int = 0) -> None:
        self._each("state", lambda part: part.state(open_windows=open_windows, groups=groups,
                                                    ready=ready and not self._stopping,
                                                    paused=paused))

    def completeness(self, waiting: int, holding_back: Sequence[PartitionKey]) -> None:
        self._each("completeness", lambda part: part.completeness(waiting, holding_back))

    def statistics(self, stats_json: str) -> None:
        self._each("statistics", lambda part: part.statistics(stats_json))

    def _each(self, hook: str, call: Callable[[ProcessorObserver], None]) -> None:
        for part in self._parts:
            self._guarded(type(part).__name__, hook, functools.partial(call, part))

    def _guarded(self, owner: str, hook: str, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:
            if (owner, hook) not in self._failed:  # once: hooks run on every turn
                self._failed.add((owner, hook))
                log.exception("%s.%s failed (the daemon goes on)", owner, hook)


def start_service(settings: ServiceSettings, environ: Mapping[str, str], *,
                  identity: str | None = None, read_committed: bool = True,
                  others: Sequence[ProcessorObserver] = ()) -> ServiceObserver:
    """Metrics, the HTTP server (unless ``http_port`` is None) and the systemd notifier
    (``environ``: systemd's variables and where the port file goes); raises
    ServiceSetupError when no port can be opened. ``identity``: the daemon's
    ``<group_id>-<instance_id>``, which names its port file (consumer/service/port_file.py).
    ``read_committed``: the input's isolation level, which sets how lag is read."""
    metrics = Metrics(read_committed=read_committed)
    health = None
    if ports := settings.http_ports():
        health = HealthServer(settings.http_host, ports, metrics=metrics.exposition,
                              liveness_timeout_s=settings.liveness_timeout_s,
                              identity=identity,
                              port_file=None if identity is None else port_file(identity,
                                                                                environ))
    return ServiceObserver(metrics, notifier_from_environ(environ, metrics.summary), health,
                           others=others)
