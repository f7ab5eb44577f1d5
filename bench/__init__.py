"""``python -m bench``: arrowagg measured against the tools one would use instead
(``make bench``), written to ``bench/results/*.json`` and ``docs/benchmarks.md``.

The sections, each a module: ``peers`` (the whole job against Quix Streams, Bytewax,
Denormalized, Flink SQL and Kafka Streams, each in a process of its own) and
``peer_memory`` (memory per open group end to end), ``e2e`` (the daemon against a plain
read of the broker and the floors), ``kernel`` with ``kernel_floor`` (the aggregation
path on pre-encoded payloads against DataFusion, DuckDB, naive Polars and the Polars
floor, no Kafka), ``memory`` (RSS while streaming), ``latency`` and ``running`` (window
close to readable result; early results), ``scale_out`` and ``scale_out_containers``.
``report`` and its ``report_*`` modules write the page. None of them patches the
product; the experiments that do are in ``bench.research``.
"""

# The daemon sets Polars' allocator options before Polars loads (consumer/allocator.py);
# importing it first makes every section measure the allocator the daemon ships with.
import consumer  # noqa: F401
