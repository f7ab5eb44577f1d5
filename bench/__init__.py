"""``python -m bench``: arrowagg measured against its peers (``make bench``).

Four sections, each a module: ``kernel`` (the aggregation path on pre-encoded payloads,
no Kafka), ``e2e`` (through the real broker, against a raw consumer and Quix Streams),
``memory`` (RSS while streaming 1 GB and 10 GB) and ``latency`` (window close to a
readable result). ``report`` writes ``bench/results/*.json`` and ``docs/benchmarks.md``.
"""

# The daemon sets Polars' allocator options before Polars loads (consumer/allocator.py);
# importing it first makes every section measure the allocator the daemon ships with.
import consumer  # noqa: F401
