"""``python -m consumer``: run the daemon, check a configuration, create its topics,
explain a plan, tail the output or dead-letter topic.

Every mistake a user can make ends in one line per problem on stderr,
``consumer: ...``, and the exit code of ``wire.errors`` (2: mend the configuration, an
option or a file; 1: the broker or the run failed).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import signal
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import TextIO, TypeVar

import pyarrow as pa

from consumer.config import (
    KafkaSettings,
    LoadedConfig,
    Settings,
    load_config,
    pinned_origin,
    pinned_schema,
    plan_for,
)
from consumer.kafka.clients import (
    KafkaSetupError,
    KafkaUnreachableError,
    MissingTopicsError,
    check_topics,
    daemon_identity,
)
from consumer.kafka.tail import (
    peek_first_record,
    read_dead_letters,
    read_late_records,
    read_output,
)
from consumer.kafka.tail_views import (
    dead_letter_json,
    late_record_json,
    print_dead_letter,
    print_late_record,
    print_window,
    window_json,
)
from consumer.kafka.topics import create_topics, needed_message_bytes, topic_specs
from consumer.options import parser
from consumer.service.logs import configure_logging
from wire.broker import DEFAULT_BOOTSTRAP
from wire.console import quiet_on_closed_pipe
from wire.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArrowaggError, UsageError
from wire.files import InputFile
from wire.input import DecodeLimits, WireFormatError, decode_ipc_stream

log = logging.getLogger("consumer")

Shown = TypeVar("Shown")

BROKER_TIMEOUT_S = 10.0


def main(argv: list[str] | None = None) -> int:
    return quiet_on_closed_pipe(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error already printed in one line
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    try:
        if args.command == "tail":
            return _tail(args)
        config = load_config(args.config)
        configure_logging(config.settings.logging.level, config.settings.logging.format)
        try:
            return _COMMANDS[args.command](config, args)
        except KafkaSetupError as err:
            raise _mended(err, config) from None
    except ArrowaggError as err:
        _say(err)
        return err.exit_code
    except KeyboardInterrupt:
        return EXIT_OK


_COMMANDS: dict[str, Callable[[LoadedConfig, argparse.Namespace], int]] = {
    "run": lambda config, args: _run(config.settings, args.config),
    "check": lambda config, args: _check(config, offline=args.offline),
    "topics": lambda config, args: _create_topics(config.settings, args),
    "explain": lambda config, args: _explain(config.settings, args.sample),
}


def _mended(err: KafkaSetupError, config: LoadedConfig | None,
            bootstrap_from: str | None = None) -> KafkaSetupError:
    """``err`` with a hint that names where to mend it: the flag or the config's key (or
    the variable that overrides it) that set the broker's address, and the create
    command for the config file given."""
    if isinstance(err, KafkaUnreachableError):
        return err.mended_at(bootstrap_from or _bootstrap_origin(config))
    if isinstance(err, MissingTopicsError) and config is not None:
        return err.mended_at(f"python -m consumer topics create --config "
                             f"{shlex.quote(config.source)}")
    return err


def _bootstrap_origin(config: LoadedConfig | None) -> str:
    if config is None:
        return f"--bootstrap-servers (the default is {DEFAULT_BOOTSTRAP})"
    variable = config.overrides.get("kafka.bootstrap_servers") or config.overrides.get("kafka")
    if variable is not None:
        return f"{variable} (it overrides kafka.bootstrap_servers of {config.source})"
    return f"kafka.bootstrap_servers in {config.source}"


def _say(err: ArrowaggError) -> None:
    for line in str(err).splitlines():
        print(f"consumer: {err.headline}{line}", file=sys.stderr)


def _run(settings: Settings, config_path: Path | None = None) -> int:
    from consumer.compose import build_processor  # noqa: PLC0415 - keeps --help fast
    from consumer.service.fanout import start_service  # noqa: PLC0415
    from consumer.service.reload import ConfigReloader  # noqa: PLC0415

    service = start_service(settings.service, os.environ, identity=daemon_identity(settings),
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
        check_topics(settings.kafka, _topics(settings),
                     max_message_bytes=needed_message_bytes(output))
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


def _topics(settings: Settings) -> list[str]:
    output = settings.output
    return [*settings.input.topics, output.topic,
            *(t for t in (output.late_topic, output.dlq_topic) if t)]


def _check(config: LoadedConfig, *, offline: bool) -> int:
    from consumer.checkup import describe_windows, effective_config, warnings  # noqa: PLC0415
    from consumer.kafka.topics import describe_topics  # noqa: PLC0415

    settings = config.settings
    print(effective_config(config))
    print("\nwindows:")
    print(textwrap.fill(describe_windows(settings), width=92, initial_indent="  ",
                        subsequent_indent="  "))
    states = None
    problems: list[str] = []
    if not offline:
        topics = _topics(settings)
        try:
            states = describe_topics(settings.kafka, topics, BROKER_TIMEOUT_S)
            check_topics(settings.kafka, topics, timeout_s=BROKER_TIMEOUT_S,
                         max_message_bytes=needed_message_bytes(settings.output))
        except KafkaSetupError as err:
            problems.append(str(_mended(err, config)))
        if states is not None:
            print(f"\ntopics on {settings.kafka.bootstrap_servers}:")
            for name in dict.fromkeys(topics):
                state = states.get(name)
                print(f"  {name}: {state.describe() if state else 'missing'}")
    found = warnings(settings, states)
    print("\nwarnings:" if found else "\nwarnings: none")
    for warning in found:
        print(textwrap.fill(warning, width=92, initial_indent="  - ",
                            subsequent_indent="    "))
    if problems:
        _say(KafkaSetupError("\n".join(problems)))
        return EXIT_FAILED
    print("\nthe broker was not asked (--offline)" if offline
          else "\nok: the daemon can start with this configuration")
    return EXIT_OK


def _create_topics(settings: Settings, args: argparse.Namespace) -> int:
    specs = topic_specs(settings.input, settings.output, input_partitions=args.partitions,
                        output_partitions=args.output_partitions)
    needed = {t: n for t, (n, _) in needed_message_bytes(settings.output).items()}
    outcomes = create_topics(settings.kafka, specs, needed=needed,
                             replication_factor=args.replication_factor,
                             timeout_s=BROKER_TIMEOUT_S, dry_run=args.dry_run)
    for outcome in outcomes:
        spec, state = outcome.spec, outcome.state
        if outcome.action == "failed":
            continue
        what = state.describe() if state is not None else (
            f"{spec.partitions} partition(s), max.message.bytes {spec.max_message_bytes}")
        left = "; left alone" if outcome.action == "exists" else ""
        print(f"{outcome.action} {spec.name} ({spec.role}): {what}{left}")
    problems = [o.problem for o in outcomes if o.problem]
    if problems:
        _say(KafkaSetupError("\n".join(problems)))
        return EXIT_FAILED
    return EXIT_OK


def _explain(settings: Settings, sample: Path | None) -> int:
    from consumer.checkup import describe_windows  # noqa: PLC0415 - keeps --help fast

    schema, origin = _explain_schema(settings, sample)
    plan = plan_for(settings, schema)
    print("windows:")
    print(textwrap.fill(describe_windows(settings), width=92, initial_indent="  ",
                        subsequent_indent="  "))
    print(f"\nschema: from {origin}")
    print(plan.describe())
    return EXIT_OK


def _explain_schema(settings: Settings, sample: Path | None) -> tuple[pa.Schema, str]:
    """The schema explain works from, and where it came from: --sample, the pinned
    schema, or the first message on the input topics (as the daemon would take it)."""
    if sample is not None:
        return InputFile.open(sample).schema(), f"--sample {sample}"
    if (pinned := pinned_schema(settings.aggregation)) is not None:
        return pinned, pinned_origin(settings.aggregation)
    record = peek_first_record(settings.kafka, settings.input.topics,
                               timeout_s=BROKER_TIMEOUT_S)
    if record is None:
        raise KafkaSetupError(f"no message on {', '.join(settings.input.topics)} within "
                              f"{BROKER_TIMEOUT_S:g}s; pass --sample FILE, or pin the plan "
                              "with aggregation.schema_from")
    try:
        schema = decode_ipc_stream(record.value, DecodeLimits()).schema
    except WireFormatError as err:
        raise UsageError(f"{record.where}, the first message on the input topics, is no "
                         f"input ({err}); pass --sample FILE") from None
    return schema, (f"{record.where}, the first message on the input topics (the daemon "
                    "takes the first with rows; pin it with aggregation.schema_from)")


def _tail(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else None
    kafka, topic, bootstrap_from = _tail_source(args, config)
    try:
        _tail_topic(args, kafka, topic)
    except KafkaSetupError as err:
        raise _mended(err, config, bootstrap_from) from None
    return EXIT_OK


def _tail_topic(args: argparse.Namespace, kafka: KafkaSettings, topic: str) -> None:
    reading = {"from_beginning": args.from_beginning, "idle_timeout_s": args.idle_timeout_s,
               "on_skipped": _warn}
    json_lines = args.format == "json"
    if args.dlq is not None:
        _print_each(read_dead_letters(kafka, topic, limit=args.max_windows, **reading),
                    dead_letter_json if json_lines else None, print_dead_letter)
    elif args.late is not None:
        _print_each(read_late_records(kafka, topic, limit=args.max_windows, **reading),
                    late_record_json if json_lines else None,
                    functools.partial(print_late_record, max_rows=args.rows))
    else:
        _print_each(read_output(kafka, topic, max_windows=args.max_windows,
                                complete=args.complete, **reading),
                    window_json if json_lines else None,
                    functools.partial(print_window, max_rows=args.rows))


def _print_each(items: Iterable[Shown], as_json: Callable[[Shown], str] | None,
                as_table: Callable[[Shown, TextIO], None]) -> None:
    """Each item as one JSON line (``as_json``), or else as a table."""
    for item in items:
        if as_json is not None:
            print(as_json(item), flush=True)
        else:
            as_table(item, sys.stdout)


def _tail_source(args: argparse.Namespace, config: LoadedConfig | None,
                 ) -> tuple[KafkaSettings, str, str]:
    """The broker (with its security), the topic tail reads, and where the broker's
    address came from (for a hint when nothing answers there)."""
    settings = config.settings if config is not None else None
    from_env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    kafka = settings.kafka if settings else KafkaSettings(
        bootstrap_servers=from_env or DEFAULT_BOOTSTRAP)
    bootstrap_from = _bootstrap_origin(config) if config is not None else (
        "KAFKA_BOOTSTRAP_SERVERS (or --bootstrap-servers)" if from_env
        else _bootstrap_origin(None))
    if args.bootstrap_servers:
        kafka = kafka.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
        bootstrap_from = "--bootstrap-servers"
    topic = args.topic or args.dlq or args.late
    flag, key = ("--topic", "output.topic")
    if args.dlq is not None:
        flag, key = "--dlq", "output.dlq_topic"
    elif args.late is not None:
        flag, key = "--late", "output.late_topic"
    if not topic and settings is not None:
        topic = getattr(settings.output, key.removeprefix("output."))
    if not topic:
        raise UsageError(f"tail needs {flag} TOPIC, or --config with {key} set")
    return kafka, topic, bootstrap_from


def _warn(line: str) -> None:
    print(f"consumer: {line}", file=sys.stderr, flush=True)
