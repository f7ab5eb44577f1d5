"""Tumbling and hopping windows, by event or processing time.

- ``engine``: ``TimeWindowEngine``: rows into their windows, windows closed by the
  watermark (or the clock), late rows, replays after a restart;
- ``retained``: emitted windows kept for late-data revisions (``window.late: revise``);
- ``late_partials``: with the scale-out, late rows of windows open to revisions, sent on
  as partial states (stage 2 keeps and revises the windows);
- ``emitted_rows``: a message's rows of windows its partition already emitted: skipped on
  a replay, late, or revising kept windows.
"""
