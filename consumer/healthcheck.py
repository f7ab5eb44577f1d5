"""``python -m consumer.healthcheck``: exit 0 when the daemon's /healthz answers 200.

The container image's HEALTHCHECK, and a way to find one instance's endpoint among
several on one host. Which daemon, and on which port:

- ``--port N``: that port;
- ``--config FILE``: the daemon that file describes, with the environment's overrides
  (``ARROWAGG_PROCESSING__INSTANCE_ID=b`` picks instance b): the port it wrote to its
  port file (consumer/service/port_file.py), checked to be answered by that instance;
- neither: ``$ARROWAGG_SERVICE__HTTP_PORT`` when it is one port, else the port of the
  only daemon that wrote a port file here (a container's), else 9464.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from consumer.service.port_file import INSTANCE_HEADER, only_port_file, port_file, read_port
from wire.errors import ArrowaggError

DEFAULT_PORT = 9464


class NoDaemonError(ArrowaggError):
    """No port to ask: the daemon is not running (or serves no HTTP)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m consumer.healthcheck",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", help="default: the port file's, else 127.0.0.1")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=int)
    where.add_argument("--config", type=Path,
                       help="check the daemon this config (and the environment) describes")
    parser.add_argument("--path", default="/healthz", choices=["/healthz", "/readyz"])
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    try:
        host, port, identity = _endpoint(args, os.environ)
    except ArrowaggError as err:
        sys.stderr.write(f"healthcheck: {err}\n")
        return 1
    return _ask(f"http://{args.host or host}:{port}{args.path}", identity, args.timeout_s)


def _endpoint(args: argparse.Namespace,
              environ: Mapping[str, str]) -> tuple[str, int, str | None]:
    """(host, port, the identity that must answer there, if known)."""
    if args.port is not None:
        return "127.0.0.1", args.port, None
    if args.config is not None:
        # Only here: the configuration's imports (Polars, librdkafka) take seconds, and a
        # container runs the plain check every few seconds.
        from consumer.config import load_config  # noqa: PLC0415
        from consumer.kafka.clients import daemon_identity  # noqa: PLC0415

        settings = load_config(args.config).settings
        identity = daemon_identity(settings)
        ports = settings.service.http_ports()
        if not ports:
            raise NoDaemonError(f"{args.config} sets service.http_port to null: no HTTP server")
        if len(ports) == 1 and ports[0] != 0:
            return settings.service.http_host, ports[0], identity
        path = port_file(identity, environ)
        if (found := read_port(path)) is None:
            raise NoDaemonError(f"no port file {path}: is the daemon {identity} running?")
        return found[0], found[1], identity
    fixed = environ.get("ARROWAGG_SERVICE__HTTP_PORT", "")
    if fixed.isdigit() and int(fixed) != 0:
        return "127.0.0.1", int(fixed), None
    only = only_port_file(environ)
    found = read_port(only) if only is not None else None
    host, port = found if found is not None else ("127.0.0.1", DEFAULT_PORT)
    return host, port, None


def _ask(url: str, identity: str | None, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http: built here
            status, answered = int(response.status), response.headers.get(INSTANCE_HEADER)
    except urllib.error.HTTPError as err:
        status, answered = err.code, err.headers.get(INSTANCE_HEADER)
    except OSError as err:
        sys.stderr.write(f"healthcheck: {url}: {err}\n")
        return 1
    if identity is not None and answered != identity:
        sys.stderr.write(f"healthcheck: {url} is answered by {answered or 'another server'}, "
                         f"not {identity}: its port file is stale\n")
        return 1
    if status != 200:
        sys.stderr.write(f"healthcheck: {url}: HTTP {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
