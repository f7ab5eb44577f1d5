"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), in a few lines.

Datagrams to ``$NOTIFY_SOCKET`` (an AF_UNIX path, or an abstract socket when it starts
with "@"): ``READY=1`` once, when the processor first reports ready (transactions
initialised, partitions assigned, replay done); ``WATCHDOG=1`` from the main loop's turn,
at most every half of ``$WATCHDOG_USEC``, so a stuck loop stops the pings and systemd
restarts the daemon; ``STOPPING=1`` on stop; ``STATUS=`` a short line for
``systemctl status``. Without ``$NOTIFY_SOCKET`` every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from consumer.service.observer import NullObserver

log = logging.getLogger(__name__)

STATUS_INTERVAL_S = 5.0


class SystemdNotifier(NullObserver):
    def __init__(self, address: str | None, *, watchdog_usec: int | None = None,
                 status: Callable[[], str] = lambda: "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._address = "\0" + address[1:] if address and address.startswith("@") else address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if address else None
        if self._socket is not None:
            # A manager that does not read yet must not stop the main loop: a blocking
            # send waits as soon as 10 datagrams are unread (net.unix.max_dgram_qlen).
            self._socket.settimeout(0.0)
        self._watchdog_s = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._status = status
        self._clock = clock
        self._ready_sent = False
        self._last_ping: float | None = None
        self._last_status: float | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def notify(self, *assignments: str) -> None:
        """Send ``KEY=VALUE`` lines as one datagram; never raises."""
        if self._socket is None or self._address is None or not assignments:
            return
        try:
            self._socket.sendto("\n".join(assignments).encode(), self._address)
        except BlockingIOError:
            # The manager has unread messages already; a ping or status more is nothing.
            log.debug("systemd's notify socket is full; dropped %s", ", ".join(assignments))
        except OSError as err:
            if not self._failed:  # once: the manager may be gone while we stop
                log.warning("cannot notify systemd at %s: %s", self._address, err)
            self._failed = True

    def loop_turned(self, now_ms: int) -> None:  # noqa: ARG002 - our own clock is monotonic
        now = self._clock()
        lines = []
        if self._watchdog_s is not None and _due(self._last_ping, self._watchdog_s, now):
            self._last_ping = now
            lines.append("WATCHDOG=1")
        if self._ready_sent and _due(self._last_status, STATUS_INTERVAL_S, now):
            self._last_status = now
            lines.append(f"STATUS={self._status()}")
        self.notify(*lines)

    def state(self, *, open_windows: int, groups: int, ready: bool,  # noqa: ARG002
              paused: int = 0) -> None:  # noqa: ARG002
        if ready and not self._ready_sent:
            self._ready_sent = True
            self._last_status = self._clock()
            self.notify("READY=1", f"STATUS={self._status()}")

    def stopping(self) -> None:
        self.notify("STOPPING=1", "STATUS=stopping: finishing the batch in flight")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _due(last: float | None, interval_s: float, now: float) -> bool:
    return last is None or now - last >= interval_s


def notifier_from_environ(environ: Mapping[str, str],
                          status: Callable[[], str] = lambda: "") -> SystemdNotifier:
    """The notifier for the variables systemd sets (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``,
    ``WATCHDOG_PID``: pings only when the watchdog is meant for this process)."""
    watchdog = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    usec = int(watchdog) if watchdog.isdigit() and int(watchdog) > 0 else None
    if pid and pid != str(os.getpid()):
        usec = None
    return SystemdNotifier(environ.get("NOTIFY_SOCKET") or None, watchdog_usec=usec,
                           status=status)
