"""The daemon's pure core: decoded rows in; windows, late rows, dead letters and commit
points out (``pipeline`` ties it together for one poll at a time).

Owns: the plan, window assignment, partial aggregation, open-window state, watermarks,
offset tracking, the memory budget and the dead-letter guard. May import: ``wire``,
polars, pyarrow. Never a Kafka client, ``consumer.config``, ``consumer.kafka`` or
``consumer.service``: components receive plain values, so every one of them is tested
with plain frames (import-linter keeps it so).
"""
