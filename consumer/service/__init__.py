"""How the daemon is watched and steered from outside: Prometheus metrics, the HTTP
health endpoints, systemd's notify socket, SIGHUP reloads and log formatting, fanned
out from the run loop's observer hooks (``observer`` is the protocol, ``fanout`` the
composition).

May import: ``core`` (its types) and ``config``; never ``consumer.kafka``.
"""
