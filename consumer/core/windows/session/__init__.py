"""Session windows per group keys: a session closes after ``gap_ms`` without rows.

- ``spans``: ``SessionSpec`` and the mergeable runs of rows per keys (the pure part);
- ``closing``: sessions closed by the frontier, and what stays open;
- ``engine``: ``SessionWindowEngine``;
- ``late``: rows of sessions already emitted;
- ``offsets``: which input offsets the open sessions still need;
- ``replay``: what the engine does while re-reading input after a restart.
"""
