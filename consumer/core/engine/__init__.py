"""Window engines: rows of messages in, closed windows and commit points out.

``base`` holds the shape every engine has and the engine used before the plan is known;
``time`` the tumbling/hopping engine (event or processing time); ``count`` the engine
that closes a window every N messages or M rows; ``session`` session windows per group
keys (with ``session_late``, its late rows, and ``session_replay``, what it does while
re-reading input after a restart).
"""
