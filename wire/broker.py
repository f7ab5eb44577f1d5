"""Where both command lines look for a Kafka broker when nothing says where, and whether
anything listens there at all.

The daemon's (consumer/cli.py) and the workers' (producer/cli.py) fall back to
``DEFAULT_BOOTSTRAP`` when neither an option nor ``KAFKA_BOOTSTRAP_SERVERS`` names a
broker: the address ``scripts/kafka-local start`` listens on by default, as in
config.yaml. ``nothing_listens`` lets both fail at once when every address refuses the
connection, where librdkafka keeps retrying until its timeout (10 s) is out.
"""

from __future__ import annotations

import socket

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def nothing_listens(bootstrap_servers: str, timeout_s: float = 1.0) -> str | None:
    """Why no broker can answer at any of ``bootstrap_servers`` (``host:port,...``), when
    the network says so at once: every address refuses the connection or names no host.
    None when one might answer (it took the connection, or gave no word within
    ``timeout_s``, as a firewall dropping packets does): the client then waits as usual."""
    addresses = [a.strip() for a in bootstrap_servers.split(",") if a.strip()]
    reasons = []
    for address in addresses:
        host, _, port = address.split("://")[-1].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return None
        except ConnectionRefusedError:
            reasons.append((address, "Connection refused"))
        except socket.gaierror as err:
            reasons.append((address, f"no such host ({err.strerror})"))
        except (OSError, ValueError):
            return None
    if len(reasons) == 1:
        return f"nothing listens there: {reasons[0][1]}"
    return "nothing listens there: " + "; ".join(f"{a}: {why}" for a, why in reasons)
