"""systemd's notify protocol against a real AF_UNIX datagram socket."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from consumer.service.sdnotify import SystemdNotifier, notifier_from_environ
from tests.consumer.service.probes import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with tempfile.TemporaryDirectory(prefix="sd-") as folder, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        path = str(Path(folder) / "notify")  # short: AF_UNIX paths stop at 107 bytes
        sock.bind(path)
        yield Receiver(sock, path)


N = TypeVar("N", bound=SystemdNotifier)


@pytest.fixture
def opened() -> Iterator[Callable[[N], N]]:
    """Close every notifier a test made (each holds a socket)."""
    made: list[SystemdNotifier] = []

    def register(notifier: N) -> N:
        made.append(notifier)
        return notifier

    yield register
    for notifier in made:
        notifier.close()


Opened = Callable[[SystemdNotifier], SystemdNotifier]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(datagrams: list[str]) -> list[str]:
    return [line for datagram in datagrams for line in datagram.split("\n")]


def test_ready_is_sent_once_when_first_ready(receiver: Receiver, opened: Opened) -> None:
    notifier = opened(notifier_from_environ({"NOTIFY_SOCKET": receiver.address},
                                            status=lambda: "windows emitted 0, lag 5, groups 2"))
    notifier.state(open_windows=0, groups=0, ready=False)  # assigned, still replaying
    assert receiver.datagrams(0.1) == []
    notifier.state(open_windows=1, groups=2, ready=True)
    assert receiver.datagrams() == ["READY=1\nSTATUS=windows emitted 0, lag 5, groups 2"]
    notifier.state(open_windows=1, groups=2, ready=False)  # a rebalance
    notifier.state(open_windows=1, groups=2, ready=True)
    assert "READY=1" not in lines(receiver.datagrams(0.1))


def test_watchdog_pings_at_most_every_half_of_watchdog_usec(receiver: Receiver,
                                                            opened: Opened) -> None:
    clock = FakeClock()
    notifier = opened(SystemdNotifier(receiver.address, watchdog_usec=2_000_000, clock=clock))
    for now in (0.0, 0.3, 0.9, 1.0, 1.5, 1.99, 2.1, 2.2, 3.1, 5.0):
        clock.now = now
        notifier.loop_turned(int(now * 1000))
    # Due at 0.0, then 1 s (half of 2 s) after each ping: 1.0, 2.1, 3.1, 5.0.
    assert receiver.datagrams() == ["WATCHDOG=1"] * 5


def test_status_follows_ready_every_few_seconds(receiver: Receiver, opened: Opened) -> None:
    clock = FakeClock()
    emitted = [0]
    notifier = opened(SystemdNotifier(receiver.address, clock=clock,
                                      status=lambda: f"windows emitted {emitted[0]}"))
    notifier.loop_turned(0)
    assert receiver.datagrams(0.1) == []  # no watchdog, not ready: nothing to say
    notifier.state(open_windows=0, groups=0, ready=True)
    emitted[0] = 4
    clock.now = 5.0
    notifier.loop_turned(5000)
    clock.now = 6.0
    notifier.loop_turned(6000)
    assert receiver.datagrams() == ["READY=1\nSTATUS=windows emitted 0",
                                    "STATUS=windows emitted 4"]


def test_a_blocked_loop_stops_the_pings(receiver: Receiver, opened: Opened) -> None:
    """The watchdog keys off the main loop: when it stops turning, systemd hears nothing."""
    notifier = opened(notifier_from_environ({"NOTIFY_SOCKET": receiver.address,
                                             "WATCHDOG_USEC": "100000"}))  # pings >= 50 ms apart
    turning, stop = threading.Event(), threading.Event()
    turning.set()

    def main_loop() -> None:
        while not stop.is_set():
            turning.wait()
            notifier.loop_turned(0)
            time.sleep(0.005)

    thread = threading.Thread(target=main_loop, daemon=True)
    thread.start()
    try:
        running = receiver.datagrams(0.5)
        assert 3 <= len(running) <= 11  # ~10 pings in 0.5 s, never one per turn (~100)
        assert set(running) == {"WATCHDOG=1"}
        turning.clear()  # the loop blocks, e.g. in a hung broker call
        time.sleep(0.02)
        receiver.datagrams(0.06)  # at most one ping sent just before it blocked
        assert receiver.datagrams(0.5) == []
        turning.set()  # unblocked: the pings come back
        assert "WATCHDOG=1" in receiver.datagrams(0.3)
    finally:
        stop.set()
        turning.set()
        thread.join(5)


def test_stopping(receiver: Receiver, opened: Opened) -> None:
    notifier = opened(SystemdNotifier(receiver.address))
    notifier.stopping()
    got = lines(receiver.datagrams())
    assert got[0] == "STOPPING=1"
    assert got[1].startswith("STATUS=stopping")


def test_abstract_socket_address(opened: Opened) -> None:
    name = f"arrowagg-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = opened(notifier_from_environ({"NOTIFY_SOCKET": "@" + name}))
        notifier.state(open_windows=0, groups=0, ready=True)
        assert Receiver(sock, "@" + name).datagrams() == ["READY=1\nSTATUS="]


def test_watchdog_meant_for_another_process_is_not_fed(receiver: Receiver,
                                                       opened: Opened) -> None:
    notifier = opened(notifier_from_environ({"NOTIFY_SOCKET": receiver.address,
                                             "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}))
    notifier.loop_turned(0)
    notifier.state(open_windows=0, groups=0, ready=True)
    assert lines(receiver.datagrams())[0] == "READY=1"  # READY still goes; no WATCHDOG


def test_without_notify_socket_nothing_is_sent(opened: Opened) -> None:
    notifier = opened(notifier_from_environ({"WATCHDOG_USEC": "100000"}))
    assert not notifier.enabled
    notifier.loop_turned(0)
    notifier.state(open_windows=0, groups=0, ready=True)
    notifier.stopping()
    notifier.close()
    assert not notifier.enabled


def test_a_vanished_manager_does_not_raise(receiver: Receiver, opened: Opened,
                                           caplog: pytest.LogCaptureFixture) -> None:
    notifier = opened(SystemdNotifier(receiver.address + "-gone"))
    notifier.stopping()
    notifier.stopping()
    warnings = [record.getMessage().split(":")[0] for record in caplog.records]
    assert warnings == [f"cannot notify systemd at {receiver.address}-gone"]  # once


def test_a_manager_that_does_not_read_never_stops_the_loop(
        receiver: Receiver, opened: Callable[[SystemdNotifier], SystemdNotifier]) -> None:
    """Ten unread datagrams (net.unix.max_dgram_qlen) made a blocking send wait: the
    main loop stood still until the manager read (a test's receiver, between reads)."""
    notifier = opened(SystemdNotifier(receiver.address, watchdog_usec=2))
    def send_many() -> None:
        for i in range(100):
            notifier.notify(f"STATUS={i}")

    sent = threading.Thread(target=send_many, daemon=True)
    sent.start()
    sent.join(10)
    assert not sent.is_alive(), "notify blocked on a full socket"
    assert receiver.datagrams()[:3] == ["STATUS=0", "STATUS=1", "STATUS=2"]
