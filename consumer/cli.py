"""``python -m consumer``: run the daemon, explain a plan, tail the output topic."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import pyarrow as pa

from consumer.config import Settings, load_settings
from consumer.core.plan import derive_plan
from consumer.kafka.clients import KafkaSetupError, check_topics
from consumer.kafka.tail import peek_first_value, print_window, read_output
from consumer.service.logs import configure_logging
from wire.errors import EXIT_OK, ArrowaggError
from wire.files import read_table
from wire.input import DecodeLimits, decode_ipc_stream

log = logging.getLogger("consumer")

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m consumer",
        description="arrowagg: aggregate Arrow IPC record batches on Kafka, per window.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run the daemon: consume, window, aggregate, emit, commit",
        description="Join the consumer group and aggregate until SIGTERM or SIGINT.")
    run.add_argument("--config", type=Path, default=Path("config.yaml"),
                     help="YAML config (default: config.yaml); env ARROWAGG_* overrides")
    explain = commands.add_parser(
        "explain", help="print the aggregation plan for a schema",
        description="Show keys, each column's aggregation and skipped columns. The schema "
                    "comes from --sample, or else from the first message on the input topic.")
    explain.add_argument("--config", type=Path, default=Path("config.yaml"))
    explain.add_argument("--sample", type=Path,
                         help="an Arrow IPC stream/file or Parquet file with the input schema")
    tail = commands.add_parser(
        "tail", help="show each output window as a table",
        description="Subscribe to the output topic (read_committed) and print every window.")
    tail.add_argument("--topic", required=True, help="the output topic")
    tail.add_argument("--bootstrap-servers",
                      default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                      help="default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092")
    tail.add_argument("--from-beginning", action="store_true",
                      help="start at the topic's beginning instead of its end")
    tail.add_argument("--max-windows", type=int, help="stop after this many messages")
    tail.add_argument("--idle-timeout-s", type=float, default=float("inf"),
                      help="stop when nothing arrived for this long (default: never)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "tail":
            return _tail(args)
        settings = load_settings(args.config)
        configure_logging(settings.logging.level, settings.logging.format)
        if args.command == "explain":
            return _explain(settings, args.sample)
        return _run(settings, args.config)
    except ArrowaggError as err:
        for line in str(err).splitlines():
            print(f"consumer: {err.headline}{line}", file=sys.stderr)
        return err.exit_code


def _run(settings: Settings, config_path: Path | None = None) -> int:
    from consumer.compose import build_processor  # noqa: PLC0415 - keeps --help fast
    from consumer.service.fanout import start_service  # noqa: PLC0415
    from consumer.service.reload import ConfigReloader  # noqa: PLC0415

    service = start_service(settings.service, os.environ,
                            read_committed=settings.processing.guarantee == "exactly_once")
    previous = {signum: signal.getsignal(signum)
                for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    # SIGHUP's default is to terminate: catch it before anything slow happens. The
    # reload itself runs on the main loop's next turn, not in the handler.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: service.request_reload())
    if config_path is not None:
        service.on_reload(ConfigReloader(config_path, settings).reload)
    try:
        output = settings.output
        check_topics(settings.kafka, [*settings.input.topics, output.topic,
                                      *(t for t in (output.late_topic, output.dlq_topic) if t)])
        processor = build_processor(settings, service)

        def stop(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: finishing the batch in flight, then stopping",
                     signal.Signals(signum).name)
            service.stopping()  # systemd's STOPPING=1, /readyz 503
            processor.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("arrowagg consuming %s -> %s (%s, %s windows)",
                 ",".join(settings.input.topics), output.topic,
                 settings.processing.guarantee, settings.window.kind)
        processor.run()
    finally:
        service.stopping()
        service.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    log.info("stopped cleanly: %s", processor.counters)
    return EXIT_OK


def _explain(settings: Settings, sample: Path | None) -> int:
    schema = read_table(sample).schema if sample else _peek_schema(settings)
    window, aggregation = settings.window, settings.aggregation
    plan = derive_plan(schema, time_column=window.timestamp_column if window.time == "event"
                       else None, keys=aggregation.keys, overrides=aggregation.columns)
    print(window.describe())
    print(plan.describe())
    return EXIT_OK


def _peek_schema(settings: Settings) -> pa.Schema:
    value = peek_first_value(settings.kafka.bootstrap_servers, settings.input.topics)
    if value is None:
        raise KafkaSetupError("the input topic has no message yet; pass --sample FILE")
    return decode_ipc_stream(value, DecodeLimits()).schema


def _tail(args: argparse.Namespace) -> int:
    idle = None if args.idle_timeout_s == float("inf") else args.idle_timeout_s
    windows = read_output(args.bootstrap_servers, args.topic, from_beginning=args.from_beginning,
                          idle_timeout_s=idle if idle is not None else 10**9,
                          max_windows=args.max_windows)
    try:
        for window in windows:
            print_window(window, sys.stdout)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK
