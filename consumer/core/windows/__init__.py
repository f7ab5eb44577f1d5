"""Windows: rows of messages in, closed windows and commit points out.

What every kind shares is here; each kind has a package of its own, and no kind imports
another (import-linter holds it):

- ``engine``: the ``WindowEngine`` protocol, and the engine that stands in until the plan
  is known;
- ``bounds``: window bounds, one pure function over integer milliseconds;
- ``store``: open windows' partial state, merged every K batches, buffered values;
- ``watermark``: per-partition event-time progress and idleness, and the watermark;
- ``frontier``: each assigned partition's emitted frontier, replay and retention;
- ``revisions``: how an open window's revisions are numbered (early results, the
  budget's early revisions, the closing one);
- ``time/``: tumbling and hopping windows, by event or processing time;
- ``count/``: windows of N messages or M rows;
- ``session/``: session windows per group keys.
"""
