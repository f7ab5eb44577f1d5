"""``python -m producer``: publish Arrow/Parquet files or synthetic sensor batches to Kafka.

Every mistake a user can make ends in one line on stderr, ``producer: ...``, and the exit
code its error carries (``wire.errors``): 2 to mend an option or a file (a missing or
unreadable file, a bad option), 1 when the broker failed us (unreachable, a missing
topic, undelivered messages).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Never, NoReturn

import pyarrow as pa
from pyarrow import ipc
from tqdm import tqdm

from producer.generate import SENSOR_SCHEMA, sensor_batch
from producer.publisher import FRAMING_BYTES, BrokerUnreachableError, Publisher, PublishError
from wire.broker import DEFAULT_BOOTSTRAP
from wire.console import quiet_on_closed_pipe
from wire.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, ArrowaggError, UsageError
from wire.files import InputFile
from wire.input import Compression, WireFormatError
from wire.split import RowTooBigError

CHECK_TIMEOUT_S = 10.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other user error, instead of argparse's usage block.
        self.exit(EXIT_USAGE, f"producer: {message} (see {self.prog} --help)\n")


def _positive(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def _message_bytes(text: str) -> int:
    value = int(_positive(int)(text))
    if value <= FRAMING_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text} leaves no room for data: it must be more than {FRAMING_BYTES}, the bytes "
            "kept for the key, the headers and Kafka's framing")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m producer",
        description="arrowagg's workers' side: publish Arrow record batches to an input "
                    "topic in the arrowagg wire format (docs/wire-format.md).",
        epilog="examples:\n"
               "  python -m producer generate --topic sensors --rate 5 --duration-s 60\n"
               "  python -m producer generate --out batches.arrows --batches 100 --start-ms 0\n"
               "  python -m producer publish --topic sensors --compression zstd batches.arrows\n"
               "Run 'python -m producer COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the Kafka client's own log lines on stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    publish = commands.add_parser(
        "publish", help="publish Arrow IPC stream/file or Parquet files, batch by batch",
        description="Publish each record batch of each FILE (Arrow IPC stream, Arrow IPC "
                    "file / Feather v2, or Parquet) as one or more messages.")
    publish.add_argument("files", nargs="+", type=Path, metavar="FILE",
                         help="an Arrow IPC stream (.arrows), Arrow IPC file (.arrow, "
                              ".feather) or Parquet file; the kind is told by its content")
    publish.add_argument("--repeat", type=_positive(int), default=1, metavar="N",
                         help="publish the files N times over (default: 1)")
    _add_kafka_options(publish, topic_required=True)
    generate = commands.add_parser(
        "generate", help="publish synthetic sensor batches (or write them with --out)",
        description="Publish seeded synthetic sensor batches: site, sensor, ts and "
                    "pre-aggregated readings. Event times follow the wall clock (each "
                    "batch covers the last --span-ms) unless --start-ms fixes them.")
    count = generate.add_mutually_exclusive_group()
    count.add_argument("--batches", type=_positive(int), metavar="N",
                       help="publish N batches in all (default: 10)")
    count.add_argument("--duration-s", type=_positive(float), metavar="S",
                       help="keep publishing for S seconds instead")
    generate.add_argument("--rows-per-batch", type=_positive(int), default=10_000, metavar="R",
                          help="rows in each batch (default: 10000)")
    generate.add_argument("--groups", type=_positive(int), default=100, metavar="G",
                          help="distinct (site, sensor) pairs (default: 100)")
    generate.add_argument("--rate", type=_positive(float), metavar="BATCHES_PER_S",
                          help="pace all producers together to this rate (default: flat out)")
    generate.add_argument("--span-ms", type=_positive(int), default=1_000, metavar="MS",
                          help="event time one batch covers (default: 1000)")
    generate.add_argument("--start-ms", type=int, metavar="MS",
                          help="epoch ms of the first batch's events, for reproducible runs; "
                               "each round of batches then starts --span-ms later")
    generate.add_argument("--seed", type=int, default=0, help="batch i uses seed+i (default: 0)")
    generate.add_argument("--producers", type=_positive(int), default=1, metavar="K",
                          help="take turns between K producer identities (default: 1)")
    generate.add_argument("--out", type=Path, metavar="FILE",
                          help="write an Arrow IPC stream file instead of publishing")
    _add_kafka_options(generate, topic_required=False)
    return parser


def _add_kafka_options(command: argparse.ArgumentParser, *, topic_required: bool) -> None:
    command.add_argument("--topic", required=topic_required, metavar="T",
                         help="the input topic, which must exist" + (
                             "" if topic_required else " (or give --out)"))
    command.add_argument("--bootstrap-servers", metavar="B",
                         help=f"default: $KAFKA_BOOTSTRAP_SERVERS or {DEFAULT_BOOTSTRAP}")
    command.add_argument("--compression", choices=["none", "lz4", "zstd"], default="none",
                         help="Arrow IPC body compression (default: none)")
    command.add_argument("--max-message-bytes", type=_message_bytes, default=1_000_000,
                         metavar="N", help="split larger batches; match the topic's "
                                           "max.message.bytes (default: 1000000)")


def main(argv: Sequence[str] | None = None) -> int:
    return quiet_on_closed_pipe(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error already printed in one line
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("producer").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    try:
        if args.command == "publish":
            return _publish(args)
        return _generate(args)
    except ArrowaggError as err:  # usage (2), or the broker refused or lost messages (1)
        print(f"producer: {err.headline}{err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("producer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _publish(args: argparse.Namespace) -> int:
    inputs = [InputFile.open(path) for path in args.files]  # every file checked up front
    counts = [source.row_count() for source in inputs]
    total = None if None in counts else args.repeat * sum(c or 0 for c in counts)
    tally = _Tally()
    with ExitStack() as stack:
        publisher = _connect(args, stack)
        stack.enter_context(_telling_what_was_sent(tally, [publisher]))
        bar = stack.enter_context(tqdm(total=total, unit="row", unit_scale=True,
                                       file=sys.stderr, disable=None))
        for _ in range(args.repeat):
            for source in inputs:
                for batch in source.batches():
                    _send(publisher, batch, tally, str(source.path), args.max_message_bytes)
                    bar.update(batch.num_rows)
    files = f"{len(inputs)} file{'s' * (len(inputs) != 1)}"
    print(tally.summary("published", f"from {files} to topic {args.topic!r}",
                        publisher.bytes_sent))
    return EXIT_OK


def _send(publisher: Publisher, batch: pa.RecordBatch | pa.Table, tally: _Tally,
          where: str, max_message_bytes: int) -> None:
    """Publish one batch; a row too big for --max-message-bytes is a usage error."""
    try:
        messages = publisher.publish(batch)
    except WireFormatError as err:
        if not isinstance(err.__cause__, RowTooBigError):
            raise
        encoded = err.__cause__.encoded_bytes
        raise UsageError(
            f"{where}: one row encodes to {encoded} bytes, more than --max-message-bytes "
            f"{max_message_bytes} leaves for it; raise it to at least "
            f"{encoded + FRAMING_BYTES} (and the topic's max.message.bytes with it)") from None
    tally.count(batch.num_rows, messages)


@contextmanager
def _telling_what_was_sent(tally: _Tally, publishers: list[Publisher]) -> Iterator[None]:
    """A failure after some batches went out says how many: a rerun would repeat them."""
    try:
        yield
    except (ArrowaggError, KeyboardInterrupt) as err:
        if not tally.batches:
            raise
        for publisher in publishers:
            publisher.drain(5.0)
        delivered = sum(p.delivered for p in publishers)
        sent = (f"{_plural(tally.batches, 'batch')} ({tally.rows:,} rows; {delivered} of "
                f"{tally.messages} messages delivered) had already been sent to topic "
                f"{publishers[0].topic!r}")
        if isinstance(err, KeyboardInterrupt):
            raise InterruptedAfterError(f"interrupted; {sent}") from None
        failed = UsageError if err.exit_code == EXIT_USAGE else PublishError
        raise failed(f"{err.headline}{err}; before that, {sent}") from None


class InterruptedAfterError(ArrowaggError):
    exit_code: ClassVar[int] = EXIT_INTERRUPTED


def _generate(args: argparse.Namespace) -> int:
    if (args.topic is None) == (args.out is None):
        raise UsageError("generate needs either --topic (to publish) or --out (to write a file)")
    schedule = _Schedule(batches=args.batches, duration_s=args.duration_s, rate=args.rate,
                         producers=args.producers, span_ms=args.span_ms, start_ms=args.start_ms)
    if args.out is not None:
        return _write_generated(args, schedule)
    tally = _Tally()
    with ExitStack() as stack:
        publishers = [_connect(args, stack)]
        publishers += [stack.enter_context(_publisher(args)) for _ in range(args.producers - 1)]
        stack.enter_context(_telling_what_was_sent(tally, publishers))
        bar = stack.enter_context(_batch_bar(schedule))
        for index, producer, start_ms in schedule.run(wait=time.sleep):
            batch = _batch(args, index, start_ms)
            _send(publishers[producer], batch, tally, "a generated batch",
                  args.max_message_bytes)
            bar.update(1)
    where = f"to topic {args.topic!r} from {_plural(args.producers, 'producer')}"
    print(tally.summary("published", where, sum(p.bytes_sent for p in publishers)))
    return EXIT_OK


def _write_generated(args: argparse.Namespace, schedule: _Schedule) -> int:
    compression = None if args.compression == "none" else args.compression
    options = ipc.IpcWriteOptions(compression=compression)
    tally = _Tally()
    try:
        with ExitStack() as stack:
            sink = stack.enter_context(pa.OSFile(str(args.out), "wb"))
            writer = stack.enter_context(ipc.new_stream(sink, SENSOR_SCHEMA, options=options))
            bar = stack.enter_context(_batch_bar(schedule))
            for index, _producer, start_ms in schedule.run(wait=time.sleep):
                batch = _batch(args, index, start_ms)
                writer.write_table(batch)
                tally.count(batch.num_rows, 1)
                bar.update(1)
    except OSError as err:
        why = os.strerror(err.errno) if err.errno else str(err)
        raise UsageError(f"cannot write {args.out} ({why}); check its directory") from None
    print(tally.summary("wrote", f"to {args.out}", args.out.stat().st_size, messages=False))
    return EXIT_OK


def _batch(args: argparse.Namespace, index: int, start_ms: int) -> pa.Table:
    return sensor_batch(rows=args.rows_per_batch, groups=args.groups, start_ms=start_ms,
                        span_ms=args.span_ms, seed=args.seed + index)


def _publisher(args: argparse.Namespace) -> Publisher:
    compression: Compression = args.compression
    return Publisher(bootstrap_servers=_bootstrap(args)[0], topic=args.topic,
                     compression=compression, max_message_bytes=args.max_message_bytes)


def _connect(args: argparse.Namespace, stack: ExitStack) -> Publisher:
    """A publisher whose broker answered and whose topic exists, closed by ``stack``."""
    publisher = _publisher(args)
    try:
        publisher.check_topic(CHECK_TIMEOUT_S)
    except BrokerUnreachableError as err:
        publisher.close()
        raise BrokerUnreachableError(f"{err} with {_bootstrap(args)[1]}") from None
    except PublishError:
        publisher.close()
        raise
    return stack.enter_context(publisher)


def _bootstrap(args: argparse.Namespace) -> tuple[str, str]:
    """The broker address, and where to mend it: the option, or what stood in for it."""
    if args.bootstrap_servers:
        return args.bootstrap_servers, "--bootstrap-servers"
    if from_env := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return from_env, "--bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS, which gave this one)"
    return DEFAULT_BOOTSTRAP, f"--bootstrap-servers (the default is {DEFAULT_BOOTSTRAP})"


def _batch_bar(schedule: _Schedule) -> tqdm[Never]:
    return tqdm(total=schedule.total, unit="batch", file=sys.stderr, disable=None)


@dataclass(frozen=True)
class _Schedule:
    """When each generated batch is due, which producer sends it, and the time it covers."""

    batches: int | None
    duration_s: float | None
    rate: float | None
    producers: int
    span_ms: int
    start_ms: int | None
    default_batches: int = 10

    @property
    def total(self) -> int | None:
        """How many batches in all, when a count rather than a duration bounds the run."""
        return None if self.duration_s is not None else self.batches or self.default_batches

    def run(self, *, wait: Callable[[float], None]) -> Iterator[tuple[int, int, int]]:
        """Yield ``(batch index, producer index, first event ms)``, each when it is due."""
        began = time.monotonic()
        index = 0
        while self.total is None or index < self.total:
            due = began + index / self.rate if self.rate else time.monotonic()
            if self.duration_s is not None and due - began >= self.duration_s:
                return
            wait(max(0.0, due - time.monotonic()))
            yield index, index % self.producers, self._start_ms(index)
            index += 1

    def _start_ms(self, index: int) -> int:
        if self.start_ms is None:
            # The batch holds the readings of the span just past, as a live worker's would,
            # so no event lies in the future and event-time windows close on time.
            return time.time_ns() // 1_000_000 - self.span_ms
        # Producers in one round cover the same span, like parallel workers.
        return self.start_ms + (index // self.producers) * self.span_ms


@dataclass
class _Tally:
    messages: int = 0
    batches: int = 0
    rows: int = 0
    began: float = field(default_factory=time.monotonic)

    def count(self, rows: int, messages: int) -> None:
        self.rows += rows
        self.messages += messages
        self.batches += 1

    def summary(self, verb: str, where: str, size: int, *, messages: bool = True) -> str:
        """One line: what was done, the counts, where to, and the time taken."""
        details = [f"{self.rows:,} rows", _size(size)]
        if messages:
            head = _plural(self.messages, "message")
            details.insert(0, _plural(self.batches, "batch"))
        else:
            head = _plural(self.batches, "batch")
        return (f"{verb} {head} ({', '.join(details)}) {where} "
                f"in {time.monotonic() - self.began:.1f}s")


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {noun}{'es' if noun.endswith('ch') else 's'}"


def _size(count: int) -> str:
    scaled, unit = float(count), "B"
    for larger in ("kB", "MB", "GB"):
        if scaled < 1000:
            break
        scaled, unit = scaled / 1000, larger
    return f"{count} B" if unit == "B" else f"{scaled:.1f} {unit}"
