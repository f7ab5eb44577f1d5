"""What both command lines do when the reader of their output goes away.

``python -m consumer tail ... | head -1`` closes the pipe after one line; the next
write fails with EPIPE. Like ``cat``, a command then ends at once and says nothing: the
reader asked for no more. Python ignores SIGPIPE and raises BrokenPipeError instead, and
flushes stdout once more on its way out, which would fail again (and print "Exception
ignored ...") unless stdout is pointed somewhere that takes everything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from wire.errors import EXIT_PIPE_CLOSED


def quiet_on_closed_pipe(command: Callable[[], int]) -> int:
    """``command()``'s exit code, with its output flushed; EXIT_PIPE_CLOSED, silently,
    when the reader of stdout (or stderr) has gone away."""
    try:
        code = command()
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_the_rest()
        return EXIT_PIPE_CLOSED
    return code


def _discard_the_rest() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # a stream without a file (captured, closed)
            continue
    os.close(devnull)
