"""Where a running daemon says which HTTP port it took, for ``consumer.healthcheck``.

With ``service.http_port`` a range or 0 the port is known only once it is bound, and
several instances on one host each take another. Each daemon writes ``HOST PORT`` to
``<dir>/<group_id>-<instance_id>.port`` (its transactional identity, which no two
running instances share) and removes it when it stops. The directory is systemd's
``$RUNTIME_DIRECTORY`` when set, else ``$XDG_RUNTIME_DIR/arrowagg``, else
``<temp dir>/arrowagg-<uid>``; it is created private to the user (0700).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

SUFFIX = ".port"
# The HTTP header a daemon answers with: its identity, so that a healthcheck reading an
# old port file can tell that another daemon took the port since.
INSTANCE_HEADER = "X-Arrowagg-Instance"


def port_dir(environ: Mapping[str, str]) -> Path:
    if runtime := environ.get("RUNTIME_DIRECTORY"):
        return Path(runtime.split(":")[0])
    if xdg := environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "arrowagg"
    return Path(tempfile.gettempdir()) / f"arrowagg-{os.getuid()}"


def port_file(identity: str, environ: Mapping[str, str]) -> Path:
    """The file of the daemon whose identity is ``<group_id>-<instance_id>``."""
    return port_dir(environ) / (quote(identity, safe="") + SUFFIX)


def write_port(path: Path, host: str, port: int) -> None:
    """Write ``HOST PORT`` to ``path`` whole (a reader never sees half of it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(f"{host} {port}\n")
    partial.replace(path)


def read_port(path: Path) -> tuple[str, int] | None:
    """``(host, port)`` from a port file; None when there is none or it is garbled."""
    try:
        host, port = path.read_text().split()
        return host, int(port)
    except (OSError, ValueError):
        return None


def remove_port(path: Path) -> None:
    path.unlink(missing_ok=True)


def only_port_file(environ: Mapping[str, str]) -> Path | None:
    """The one daemon's port file when exactly one is there (a container's case)."""
    found = sorted(port_dir(environ).glob(f"*{SUFFIX}"))
    return found[0] if len(found) == 1 else None
