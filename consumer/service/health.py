"""The daemon's HTTP endpoints: ``/metrics``, ``/healthz`` (liveness), ``/readyz``.

A stdlib ``ThreadingHTTPServer`` in a daemon thread; the processor's main thread only
stores two values (the last loop turn, readiness), which the server thread reads.

- ``/healthz``: 200 while the main loop turned within ``liveness_timeout_s`` (start-up
  counts as a turn), else 503: a stuck loop is what a restart can mend.
- ``/readyz``: 200 only while the last reported state was ready (assigned, not replaying).
- ``/metrics``: the Prometheus text exposition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from consumer.service.observer import NullObserver
from wire.errors import ArrowaggError

log = logging.getLogger(__name__)


class ServiceSetupError(ArrowaggError):
    """The HTTP port cannot be opened; one line for the user."""


class HealthServer(NullObserver):
    def __init__(self, host: str, port: int, *, metrics: Callable[[], bytes],
                 liveness_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._timeout_s = liveness_timeout_s
        self._clock = clock
        self._last_turn = clock()
        self._ready = False
        try:
            self._server = _Server((host, port), _Handler, self)
        except OSError as err:
            raise ServiceSetupError(
                f"cannot serve HTTP on {host}:{port} ({err.strerror}); choose another "
                "service.http_port (0: any free port) or set it to null") from None
        # A short poll interval keeps close() quick; serving itself does not wait on it.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="arrowagg-http", daemon=True)
        self._thread.start()
        log.info("serving /metrics, /healthz, /readyz on http://%s:%d", host, self.port)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def live(self) -> bool:
        return self._clock() - self._last_turn <= self._timeout_s

    def ready(self) -> bool:
        return self._ready

    def loop_turned(self, now_ms: int) -> None:  # noqa: ARG002 - our own clock is monotonic
        self._last_turn = self._clock()

    def state(self, *, open_windows: int, groups: int, ready: bool,  # noqa: ARG002
              paused: int = 0) -> None:  # noqa: ARG002
        self._ready = ready

    def stopping(self) -> None:
        self._ready = False

    def respond(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``."""
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self._metrics()
        if path == "/healthz":
            ok = self.live()
            return (200 if ok else 503), text, b"ok\n" if ok else b"main loop stalled\n"
        if path == "/readyz":
            ok = self.ready()
            return (200 if ok else 503), text, b"ready\n" if ok else b"not ready\n"
        return 404, text, b"try /metrics, /healthz or /readyz\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 health: HealthServer) -> None:
        self.health = health
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        status, content_type, body = self.server.health.respond(self.path.split("?", 1)[0])
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        log.debug("%s %s", self.address_string(), format % args)
