"""The wire formats arrowagg shares with everyone else: what workers publish (``input``),
what the daemon emits (``output``), and how both are cut to Kafka's message size
(``split``, ``ipc_sizes``); plus the input files the CLIs read (``files``), the
broker they fall back to (``broker``) and the project's one exception base (``errors``).

Owns: bytes <-> Arrow tables and the Kafka headers around them. May import: pyarrow,
polars and the standard library only; never ``consumer`` or ``producer``, which both
import it (checked by import-linter, see pyproject.toml).
"""
