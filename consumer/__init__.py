"""arrowagg's consumer daemon: decode, window, aggregate, emit, commit.

Rooms, from the bottom up (each may import only the ones below it; import-linter checks
it, see pyproject.toml):

- ``core``: the pure pipeline, from message fields to output records and commit points;
  no Kafka client, no I/O, time is a parameter.
- ``config``: the settings models and their loading.
- ``service``: how the daemon is watched (metrics, HTTP health, systemd notify, reload).
- ``kafka``: the run loop and everything that talks to a broker.
- ``compose``: builds the pipeline and the processor from the settings.
- ``cli``, ``healthcheck``: the entry points; ``options``, the command line's grammar.

``allocator`` stands apart: it sets Polars' allocator options, which only count before
Polars loads, so it runs here, before any room imports Polars.
"""

from consumer.allocator import configure_polars_allocator

configure_polars_allocator()

__version__ = "0.1.0"
