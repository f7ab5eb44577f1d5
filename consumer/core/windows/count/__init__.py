"""Count windows: a window closes every N messages or M rows.

- ``engine``: ``CountWindowEngine``.
"""
