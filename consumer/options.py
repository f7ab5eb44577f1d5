"""``python -m consumer``'s grammar: its commands and their options (consumer/cli.py
runs them). A usage mistake is one line, ``consumer: ... (see ... --help)``, exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from consumer.kafka.tail_views import DEFAULT_ROWS
from consumer.kafka.topics import DEFAULT_INPUT_PARTITIONS, DEFAULT_OUTPUT_PARTITIONS
from wire.broker import DEFAULT_BOOTSTRAP
from wire.errors import EXIT_USAGE

DEFAULT_CONFIG = Path("config.yaml")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other user error, instead of argparse's usage block.
        self.exit(EXIT_USAGE, f"consumer: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="python -m consumer",
        description="arrowagg: aggregate Arrow IPC record batches on Kafka, per window.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    run = commands.add_parser(
        "run", help="run the daemon: consume, window, aggregate, emit, commit",
        description="Join the consumer group and aggregate until SIGTERM or SIGINT.")
    _add_config(run)
    check = commands.add_parser(
        "check", help="check a configuration: effective settings, windows, warnings",
        description="Print the effective configuration (environment overrides marked, "
                    "secrets masked), the windows in words and warnings; then check the "
                    "topics on the broker. Exit 2 on a configuration error, 1 when the "
                    "broker or a topic would stop the daemon.")
    _add_config(check)
    check.add_argument("--offline", action="store_true",
                       help="do not ask the broker about the topics")
    topics = commands.add_parser(
        "topics", help="create the configuration's topics",
        description="Topics of the configuration: input, output, late and dead-letter.")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True,
                                           metavar="ACTION", parser_class=_Parser)
    create = topic_commands.add_parser(
        "create", help="create the topics that do not exist; report the others",
        description="Create the input, output, late and dead-letter topics that do not "
                    "exist, with max.message.bytes to fit input.max_message_bytes and "
                    "output.max_message_bytes. Existing topics are left alone and reported.")
    _add_config(create)
    create.add_argument("--partitions", type=_positive_int, default=DEFAULT_INPUT_PARTITIONS,
                        metavar="N", help="partitions of an input topic: how many instances "
                                          f"can share the work (default: "
                                          f"{DEFAULT_INPUT_PARTITIONS})")
    create.add_argument("--output-partitions", type=_positive_int,
                        default=DEFAULT_OUTPUT_PARTITIONS, metavar="N",
                        help="partitions of the output, late and dead-letter topics "
                             f"(default: {DEFAULT_OUTPUT_PARTITIONS})")
    create.add_argument("--replication-factor", type=_positive_int, metavar="R",
                        help="replicas of each partition (default: 3, or the number of "
                             "brokers when there are fewer)")
    create.add_argument("--dry-run", action="store_true",
                        help="only ask the broker to validate the creations")
    explain = commands.add_parser(
        "explain", help="print the aggregation plan for a schema",
        description="Show the windows in words, then keys, each column's aggregation (and "
                    "which aggregates buffer the window's values, and why) and skipped "
                    "columns. The schema comes from --sample, else from "
                    "aggregation.schema_from, else from the first message on the input "
                    "topics.")
    _add_config(explain)
    explain.add_argument("--sample", type=Path,
                         help="an Arrow IPC stream/file or Parquet file with the input schema")
    _add_tail(commands)
    return top


def _add_config(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                         help="YAML config (default: config.yaml); the environment's "
                              "KAFKA_BOOTSTRAP_SERVERS and ARROWAGG_* override it")


def _add_tail(commands: argparse._SubParsersAction[_Parser]) -> None:
    tail = commands.add_parser(
        "tail", help="show each output window, dead letter or late record",
        description="Read the output topic (read_committed) and print every window; with "
                    "--dlq the dead letters (each rejected message's origin and reason); "
                    "with --late the late records (rows that came after their window was "
                    "emitted, and which window). Joins no consumer group and commits "
                    "nothing.")
    which = tail.add_mutually_exclusive_group()
    which.add_argument("--topic", help="the output topic (default: output.topic of --config)")
    which.add_argument("--dlq", nargs="?", const="", metavar="TOPIC",
                       help="read dead letters from TOPIC (default: output.dlq_topic of "
                            "--config)")
    which.add_argument("--late", nargs="?", const="", metavar="TOPIC",
                       help="read late records from TOPIC (default: output.late_topic of "
                            "--config)")
    tail.add_argument("--config", type=Path,
                      help="take the topic, the broker and its security from this config")
    tail.add_argument("--bootstrap-servers",
                      help="default: the config's, else $KAFKA_BOOTSTRAP_SERVERS, else "
                           f"{DEFAULT_BOOTSTRAP}")
    tail.add_argument("--from-beginning", action="store_true",
                      help="start at the topic's beginning instead of its end")
    tail.add_argument("--format", choices=["table", "json"], default="table",
                      help="table (default), or json: one JSON object a line, for jq")
    tail.add_argument("--rows", type=_row_limit, default=DEFAULT_ROWS, metavar="N",
                      help=f"rows of each table to show, or 'all' (default: {DEFAULT_ROWS}; "
                           "json shows every row)")
    tail.add_argument("--max-windows", "--max-messages", type=_positive_int, metavar="N",
                      help="stop after this many messages")
    tail.add_argument("--complete", action="store_true",
                      help="show each window once, whole: all its chunks, revisions and "
                           "(scale-out) parts, when the last has arrived")
    tail.add_argument("--idle-timeout-s", type=float, default=float("inf"), metavar="S",
                      help="stop when nothing arrived for this long (default: never)")


def _row_limit(text: str) -> int | None:
    return None if text == "all" else _positive_int(text)
