"""The one exception base of arrowagg, and the exit codes its command lines use.

Every error raised on purpose (bad configuration, bad input, an unreachable broker, a
fenced producer) derives from ``ArrowaggError``. It carries what the edges need: the
exit code a command line ends with when this error stops it (``exit_code``), and, for
errors about one input message, the short stable ``reason`` code that dead-letter
headers and the ``arrowagg_rejected_messages_total{reason}`` metric use. ``str(err)`` is
one line for a human, saying what is wrong and how to mend it.

It lives in ``wire`` because ``wire`` is the package every other one imports.
"""

from __future__ import annotations

from typing import ClassVar, Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1      # the run failed (broker, transaction, too much bad input)
EXIT_USAGE: Final = 2       # the user must mend a configuration, option or file
EXIT_INTERRUPTED: Final = 130
EXIT_PIPE_CLOSED: Final = 141  # 128 + SIGPIPE, as cat: the reader of stdout went away


class ArrowaggError(Exception):
    """Root of arrowagg's errors; subclasses set ``exit_code`` (and ``reason``).

    A command line prints each line of ``str(err)`` after its own name and the class's
    ``headline`` (e.g. ``consumer: bad configuration: ...``), then exits ``exit_code``.
    """

    exit_code: ClassVar[int] = EXIT_FAILED
    headline: ClassVar[str] = ""


class UsageError(ArrowaggError):
    """Something the user asked for cannot be done as asked (an option, a file, a
    configuration value); mended by changing the request."""

    exit_code: ClassVar[int] = EXIT_USAGE


class InputRejectedError(ArrowaggError):
    """One input message (or input file) cannot be used; ``reason`` is its stable code,
    ``detail`` the explanation without it."""

    exit_code: ClassVar[int] = EXIT_USAGE

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
