"""The daemon's HTTP endpoints: ``/metrics``, ``/healthz`` (liveness), ``/readyz``.

A stdlib ``ThreadingHTTPServer`` in a daemon thread; the processor's main thread only
stores two values (the last loop turn, readiness), which the server thread reads.

- ``/healthz``: 200 while the main loop turned within ``liveness_timeout_s`` (start-up
  counts as a turn), else 503: a stuck loop is what a restart can mend.
- ``/readyz``: 200 only while the last reported state was ready (assigned, not replaying).
- ``/metrics``: the Prometheus text exposition.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from consumer.service.observer import NullObserver
from consumer.service.port_file import INSTANCE_HEADER, remove_port, write_port
from wire.errors import ArrowaggError

log = logging.getLogger(__name__)


class ServiceSetupError(ArrowaggError):
    """The HTTP port cannot be opened; one line for the user."""


class HealthServer(NullObserver):
    def __init__(self, host: str, ports: int | Sequence[int], *, metrics: Callable[[], bytes],
                 liveness_timeout_s: float, identity: str | None = None,
                 port_file: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Serve on the first free port of ``ports`` (0: any free port). ``identity``
        (``<group_id>-<instance_id>``) is sent with every answer, so a healthcheck can
        tell this daemon from another that took its old port; ``port_file`` is where
        the port taken is written while serving."""
        self._metrics = metrics
        self._timeout_s = liveness_timeout_s
        self._clock = clock
        self._last_turn = clock()
        self._ready = False
        self.identity = identity
        self._server = _bind(host, (ports,) if isinstance(ports, int) else tuple(ports), self)
        self._port_file = port_file
        if port_file is not None:
            write_port(port_file, host, self.port)
        # A short poll interval keeps close() quick; serving itself does not wait on it.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="arrowagg-http", daemon=True)
        self._thread.start()
        log.info("serving /metrics, /healthz, /readyz on http://%s:%d%s", host, self.port,
                 f" (written to {port_file})" if port_file is not None else "")

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        if self._port_file is not None:
            remove_port(self._port_file)
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


def _bind(host: str, ports: tuple[int, ...], health: HealthServer) -> _Server:
    """A server on the first port of ``ports`` that is free; ServiceSetupError (one line)
    when none is."""
    for port in ports:
        try:
            return _Server((host, port), _Handler, health)
        except OSError as err:
            if err.errno != errno.EADDRINUSE or port == ports[-1]:
                where = (f"{host}:{port} ({err.strerror})" if len(ports) == 1
                         or err.errno != errno.EADDRINUSE
                         else f"{host}: ports {ports[0]}-{ports[-1]} are all taken")
                raise ServiceSetupError(
                    f"cannot serve HTTP on {where}; set service.http_port to another port "
                    "or range (0: any free port), or to null for no HTTP server") from None
            log.debug("HTTP port %d is taken; trying the next", port)
    raise ServiceSetupError("service.http_port gives no port to serve on")


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
        if self.server.health.identity is not None:
            self.send_header(INSTANCE_HEADER, self.server.health.identity)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        log.debug("%s %s", self.address_string(), format % args)
