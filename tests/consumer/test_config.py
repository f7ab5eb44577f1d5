from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from consumer.config import ConfigError, Settings, load_config, load_settings, settings_from_dict

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"


def minimal(**sections: Any) -> dict[str, Any]:
    """The smallest valid document, with ``sections`` replacing or adding sections."""
    base: dict[str, Any] = {
        "input": {"topics": ["in"]},
        "output": {"topic": "out"},
        "window": {"size_ms": 1_000, "timestamp_column": "ts"},
    }
    return {**base, **sections}


def config_error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        settings_from_dict(data, source="config.yaml")
    return str(info.value)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set their own overrides; the ambient environment must not leak in."""
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


# -- the example file -------------------------------------------------------------------


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE_CONFIG)
    assert settings.input.topics == ["sensors"]
    assert settings.output.topic == "sensors-agg"
    assert settings.output.format == "arrow"
    assert settings.output.compression == "zstd"
    assert settings.window.kind == "tumbling"
    assert settings.window.time == "event"
    assert settings.window.timestamp_column == "ts"
    assert settings.window.size_ms == 5_000
    assert settings.window.allowed_lateness_ms == 1_000
    assert settings.aggregation.keys is None
    assert settings.processing.guarantee == "exactly_once"
    assert settings.kafka.consumer == {}


def test_minimal_document_fills_defaults() -> None:
    settings = settings_from_dict(minimal())
    assert settings.kafka.group_id == "arrowagg"
    assert settings.window.step_ms is None
    assert settings.window.allowed_lateness_ms == 0
    assert settings.processing.merge_every_batches == 8
    assert settings.logging.level == "INFO"


def test_librdkafka_keys_pass_through_untouched() -> None:
    consumer = {"fetch.max.bytes": 1 << 20, "check.crcs": True, "fetch.wait.max.ms": 50}
    producer = {"enable.idempotence": True, "linger.ms": 5.5, "compression.type": "zstd"}
    settings = settings_from_dict(minimal(kafka={"consumer": consumer, "producer": producer}))
    assert settings.kafka.consumer == consumer
    assert settings.kafka.producer == producer


# -- unknown keys ------------------------------------------------------------------------


def test_unknown_key_in_a_section_is_named() -> None:
    message = config_error(minimal(window={"sizee_ms": 5_000, "size_ms": 1,
                                           "timestamp_column": "ts"}))
    assert "window.sizee_ms: unknown key" in message
    assert message.startswith("config.yaml: ")
    assert "\n" not in message


def test_unknown_section_is_named() -> None:
    message = config_error(minimal(windows={"size_ms": 5_000}))
    assert message == "config.yaml: windows: unknown key (check its spelling and section)"


def test_unknown_key_in_the_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "arrowagg.yaml"
    path.write_text(
        "input: {topics: [a]}\noutput: {topic: b, formatt: json}\n"
        "window: {size_ms: 10, timestamp_column: ts}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == (
        f"{path}: output.formatt: unknown key (check its spelling and section)"
    )


def test_every_problem_gets_its_own_line() -> None:
    message = config_error(minimal(output={"topic": "out", "formatt": "json"},
                                   logging={"levle": "INFO"}))
    lines = message.splitlines()
    assert len(lines) == 2
    assert any("output.formatt: unknown key" in line for line in lines)
    assert any("logging.levle: unknown key" in line for line in lines)


def test_invalid_choice_names_the_key() -> None:
    message = config_error(minimal(output={"topic": "out", "format": "xml"}))
    assert message.startswith("config.yaml: output.format: ")
    assert "\n" not in message


# -- window consistency ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({"kind": "tumbling", "timestamp_column": "ts"}, "tumbling windows need size_ms"),
        ({"kind": "hopping", "timestamp_column": "ts"}, "hopping windows need size_ms"),
        ({"kind": "hopping", "size_ms": 1_000, "timestamp_column": "ts"},
         "hopping windows need step_ms, at most size_ms"),
        ({"kind": "hopping", "size_ms": 1_000, "step_ms": 1_001, "timestamp_column": "ts"},
         "hopping windows need step_ms, at most size_ms"),
        ({"kind": "tumbling", "size_ms": 1_000}, "event-time windows need timestamp_column"),
        ({"kind": "tumbling", "size_ms": 1_000, "timestamp_column": ""},
         "event-time windows need timestamp_column"),
        ({"kind": "count"}, "count windows need count_batches or count_rows"),
    ],
)
def test_inconsistent_window_is_rejected(window: dict[str, Any], expected: str) -> None:
    assert config_error(minimal(window=window)) == f"config.yaml: window: {expected}"


@pytest.mark.parametrize(
    "window",
    [
        {"kind": "tumbling", "size_ms": 1_000, "timestamp_column": "ts"},
        {"kind": "tumbling", "time": "processing", "size_ms": 1_000},
        {"kind": "hopping", "size_ms": 1_000, "step_ms": 1_000, "timestamp_column": "ts"},
        {"kind": "hopping", "size_ms": 1_000, "step_ms": 250, "timestamp_column": "ts"},
        {"kind": "count", "count_batches": 10},
        {"kind": "count", "count_rows": 10_000},
    ],
)
def test_consistent_window_is_accepted(window: dict[str, Any]) -> None:
    settings = settings_from_dict(minimal(window=window))
    assert settings.window.kind == window["kind"]


def test_missing_window_section_names_the_window_section() -> None:
    # There is no sensible default window (a size has to be chosen): the section is
    # required, and the message names it.
    data = minimal()
    del data["window"]
    with pytest.raises(ConfigError) as info:
        settings_from_dict(data, source="config.yaml")
    assert str(info.value) == "config.yaml: window: Field required"


@pytest.mark.parametrize(
    ("window", "key"),
    [
        ({"size_ms": 0, "timestamp_column": "ts"}, "window.size_ms"),
        ({"size_ms": 10, "timestamp_column": "ts", "allowed_lateness_ms": -1},
         "window.allowed_lateness_ms"),
        ({"size_ms": 10, "timestamp_column": "ts", "idle_timeout_ms": 0},
         "window.idle_timeout_ms"),
    ],
)
def test_out_of_range_window_value_names_the_key(window: dict[str, Any], key: str) -> None:
    assert config_error(minimal(window=window)).startswith(f"config.yaml: {key}: ")


def test_input_needs_a_topic() -> None:
    assert config_error(minimal(input={"topics": []})).startswith("config.yaml: input.topics: ")


# -- environment overrides ---------------------------------------------------------------


def test_kafka_bootstrap_servers_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-a:19092,broker-b:19092")
    settings = load_settings(EXAMPLE_CONFIG)
    assert settings.kafka.bootstrap_servers == "broker-a:19092,broker-b:19092"
    assert settings.kafka.group_id == "arrowagg"  # the rest of the section is kept


def test_kafka_bootstrap_servers_without_a_kafka_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-c:9092")
    assert settings_from_dict(minimal()).kafka.bootstrap_servers == "broker-c:9092"


def test_prefixed_env_overrides_a_nested_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_KAFKA__GROUP_ID", "group-from-env")
    monkeypatch.setenv("ARROWAGG_WINDOW__SIZE_MS", "777")
    settings = load_settings(EXAMPLE_CONFIG)
    assert settings.kafka.group_id == "group-from-env"
    assert settings.window.size_ms == 777
    # Overriding one key keeps the file's other keys of the same section.
    assert settings.kafka.client_id == "arrowagg"
    assert settings.window.timestamp_column == "ts"
    assert settings.window.allowed_lateness_ms == 1_000


def test_invalid_env_override_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_WINDOW__SIZE_MS", "-5")
    with pytest.raises(ConfigError, match=r"window\.size_ms: "):
        load_settings(EXAMPLE_CONFIG)


def test_without_env_the_file_wins() -> None:
    settings = load_settings(EXAMPLE_CONFIG)
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.kafka.group_id == "arrowagg"


# -- immutability ------------------------------------------------------------------------


def test_settings_are_frozen() -> None:
    settings = settings_from_dict(minimal())
    with pytest.raises(ValidationError, match="frozen"):
        settings.window.size_ms = 2
    with pytest.raises(ValidationError, match="frozen"):
        settings.kafka.group_id = "other"
    with pytest.raises(ValidationError, match="frozen"):
        settings.output = settings.output
    assert settings.window.size_ms == 1_000


def test_settings_are_hashable_and_compare_by_value() -> None:
    first, second = settings_from_dict(minimal()), settings_from_dict(minimal())
    assert first.window == second.window
    assert hash(first.window) == hash(second.window)
    assert isinstance(first, Settings)


# -- unreadable files --------------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: cannot read the config file")
    assert "\n" not in message


def test_bad_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("input:\n  topics: [a, b\noutput: {topic: x}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid YAML (")
    assert "\n" not in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- input\n- output\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping of sections"):
        load_settings(path)


def test_empty_file_reports_the_missing_sections(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert f"{path}: input: " in message
    assert f"{path}: output: " in message


# -- strict values -----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [
    (True, "true (a boolean)"), (1.5, "1.5 (a fraction)"), (1000.0, "1000.0 (a fraction)"),
    ("1000", "the text '1000' (write it without quotes)"),
])
def test_a_window_size_must_be_a_whole_number(value: object, shown: str) -> None:
    message = config_error(minimal(window={"size_ms": value, "timestamp_column": "ts"}))
    assert message == f"config.yaml: window.size_ms: must be a whole number, not {shown}"


@pytest.mark.parametrize(("section", "key"), [
    ("processing", "poll_max_messages"), ("processing", "commit_interval_ms"),
    ("input", "max_message_bytes"), ("output", "max_message_bytes"),
    ("dlq_limit", "window_messages"),
])
def test_every_integer_setting_refuses_booleans_and_text(section: str, key: str) -> None:
    base = minimal()
    for value in (True, "5"):
        data = {**base, section: {**base.get(section, {}), key: value}}
        assert config_error(data).startswith(f"config.yaml: {section}.{key}: must be a whole "
                                             "number, not ")


@pytest.mark.parametrize(("value", "shown"), [
    (True, "true"), ("5", "'5'"), ("9474-9464", "'9474-9464'"), (70_000, "70000"),
    ("0-10", "'0-10'"),
])
def test_the_http_port_is_a_port_a_range_or_null(value: object, shown: str) -> None:
    assert config_error(minimal(service={"http_port": value})) == (
        "config.yaml: service.http_port: must be a port (0: any free one), a range of ports "
        f"like 9464-9474, or null for no HTTP server; not {shown}")
    for fine, ports in ((9464, (9464,)), ("9464-9466", (9464, 9465, 9466)), (0, (0,)),
                        (None, ())):
        assert settings_from_dict(minimal(service={"http_port": fine})).service.http_ports(
            ) == ports


def test_text_settings_refuse_numbers() -> None:
    message = config_error(minimal(kafka={"group_id": 42}))
    assert message == "config.yaml: kafka.group_id: must be text (put it in quotes)"


def test_numbers_and_paths_still_load() -> None:
    settings = settings_from_dict(minimal(
        dlq_limit={"max_invalid_ratio": 1}, service={"liveness_timeout_s": 5},
        kafka={"security": {"ssl_ca_location": "/etc/arrowagg/ca.pem"}}))
    assert settings.dlq_limit.max_invalid_ratio == 1.0
    assert settings.service.liveness_timeout_s == 5.0
    assert settings.kafka.security.ssl_ca_location == Path("/etc/arrowagg/ca.pem")


# -- the group id and the raw librdkafka keys --------------------------------------------


def test_an_empty_group_id_is_one_line() -> None:
    # librdkafka aborts the whole process (exit 134) on an empty group.id.
    assert config_error(minimal(kafka={"group_id": ""})) == (
        "config.yaml: kafka.group_id: must not be empty")
    assert config_error(minimal(kafka={"consumer": {"group.id": ""}})) == (
        "config.yaml: kafka.consumer.group.id: must not be empty")


def test_an_unknown_librdkafka_key_is_named() -> None:
    message = config_error(minimal(kafka={"consumer": {"fetch.wait.max.ms": 50,
                                                       "fetch.max.bytez": 1}}))
    assert message == ("config.yaml: kafka.consumer.fetch.max.bytez: librdkafka has no such "
                       "property (check its spelling)")
    message = config_error(minimal(kafka={"producer": {"lingerr.ms": 5}}))
    assert message.startswith("config.yaml: kafka.producer.lingerr.ms: librdkafka has no such")


def test_a_value_librdkafka_refuses_is_named_with_its_key() -> None:
    message = config_error(minimal(kafka={"producer": {"linger.ms": "soon"}}))
    assert message.startswith("config.yaml: kafka.producer.linger.ms: librdkafka refuses it: ")
    assert "\n" not in message


def test_a_key_of_the_other_client_is_named() -> None:
    message = config_error(minimal(kafka={"consumer": {"acks": "all"},
                                          "producer": {"fetch.min.bytes": 1}}))
    assert message.splitlines() == [
        ("config.yaml: kafka.consumer.acks: a producer property, which a consumer ignores; "
        "move it to kafka.producer"),
        ("config.yaml: kafka.producer.fetch.min.bytes: a consumer property, which a producer "
        "ignores; move it to kafka.consumer"),
    ]


# -- keys that do not apply to the window ------------------------------------------------


@pytest.mark.parametrize(("window", "key", "owners", "kind"), [
    ({"kind": "tumbling", "size_ms": 1_000, "step_ms": 500, "timestamp_column": "ts"},
     "step_ms", "hopping windows (tumbling ones advance by size_ms)", "event-time tumbling"),
    ({"kind": "count", "count_rows": 10, "size_ms": 1_000}, "size_ms",
     "tumbling and hopping windows", "count"),
    ({"kind": "count", "count_rows": 10, "time": "processing"}, "time",
     "tumbling, hopping and session windows", "count"),
    ({"kind": "count", "count_rows": 10, "allowed_lateness_ms": 5}, "allowed_lateness_ms",
     "event-time windows", "count"),
    ({"kind": "tumbling", "size_ms": 1_000, "timestamp_column": "ts", "count_batches": 5},
     "count_batches", "count windows", "event-time tumbling"),
    ({"kind": "hopping", "size_ms": 1_000, "step_ms": 500, "time": "processing",
      "count_rows": 5}, "count_rows", "count windows", "processing-time hopping"),
    ({"kind": "tumbling", "time": "processing", "size_ms": 1_000, "idle_timeout_ms": 5},
     "idle_timeout_ms", "event-time, session and count windows", "processing-time tumbling"),
    ({"kind": "tumbling", "size_ms": 1_000, "timestamp_column": "ts", "gap_ms": 500},
     "gap_ms", "session windows", "event-time tumbling"),
    ({"kind": "tumbling", "time": "processing", "size_ms": 1_000, "allowed_lateness_ms": 5},
     "allowed_lateness_ms", "event-time windows", "processing-time tumbling"),
])
def test_a_key_of_another_kind_of_window_is_rejected(
        window: dict[str, Any], key: str, owners: str, kind: str) -> None:
    assert config_error(minimal(window=window)) == (
        f"config.yaml: window.{key}: belongs to {owners}, and these are {kind} windows; "
        "remove it (or change window.kind / window.time)")


def test_count_windows_keep_their_idle_timeout_and_timestamp_column() -> None:
    window = {"kind": "count", "count_rows": 10, "idle_timeout_ms": 500,
              "timestamp_column": "ts"}
    assert settings_from_dict(minimal(window=window)).window.idle_timeout_ms == 500


def test_a_key_of_another_window_kind_set_to_its_default_is_as_good_as_absent() -> None:
    # What a dump of the settings writes back: every key, most at their defaults.
    window = {"kind": "count", "count_rows": 10, "time": "event", "size_ms": None,
              "step_ms": None, "allowed_lateness_ms": 0, "count_batches": None}
    assert settings_from_dict(minimal(window=window)).window.count_rows == 10


# -- topics ------------------------------------------------------------------------------


@pytest.mark.parametrize(("output", "key", "says"), [
    ({"topic": "in"}, "output.topic", ("'in' is also an input topic: the daemon would read "
                                      "its own output back")),
    ({"topic": "out", "late_topic": "in"}, "output.late_topic",
     "'in' is also an input topic: the daemon would read its own late rows back"),
    ({"topic": "out", "dlq_topic": "in"}, "output.dlq_topic",
     "'in' is also an input topic: the daemon would read its own dead letters back"),
    ({"topic": "out", "dlq_topic": "out"}, "output.dlq_topic",
     "'out' is the output topic: subscribers would read dead letters as windows"),
    ({"topic": "out", "late_topic": "out"}, "output.late_topic",
     "'out' is the output topic: subscribers would read late rows as windows"),
    ({"topic": "out", "late_topic": "x", "dlq_topic": "x"}, "output.dlq_topic",
     "'x' is also output.late_topic"),
])
def test_a_topic_used_twice_is_rejected(output: dict[str, str], key: str, says: str) -> None:
    message = config_error(minimal(output=output))
    assert message.startswith(f"config.yaml: {key}: {says}")
    assert "\n" not in message


def test_an_input_topic_listed_twice_or_misnamed_is_rejected() -> None:
    assert config_error(minimal(input={"topics": ["in", "a", "in"]})) == (
        "config.yaml: input.topics: lists 'in' more than once")
    assert config_error(minimal(output={"topic": "out put"})).startswith(
        "config.yaml: output.topic: 'out put' is not a valid Kafka topic name")


# -- which environment variable ----------------------------------------------------------


def test_an_env_error_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_WINDOW__SIZE_MS", "-5")
    monkeypatch.setenv("ARROWAGG_PROCESSING__POLL_MAX_MESSAGES", "many")
    with pytest.raises(ConfigError) as info:
        load_settings(EXAMPLE_CONFIG)
    assert str(info.value).splitlines() == [
        ("environment variable ARROWAGG_WINDOW__SIZE_MS: window.size_ms: Input should be "
        "greater than 0"),
        ("environment variable ARROWAGG_PROCESSING__POLL_MAX_MESSAGES: "
        "processing.poll_max_messages: must be a whole number, not the text 'many' "
        "(write it without quotes)"),
    ]


def test_a_misspelt_env_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_WINDOW__SIZEE_MS", "5000")
    with pytest.raises(ConfigError) as info:
        load_settings(EXAMPLE_CONFIG)
    assert str(info.value) == ("environment variable ARROWAGG_WINDOW__SIZEE_MS: "
                               "window.sizee_ms: unknown key (check its spelling and section)")


def test_a_section_error_names_the_file_and_the_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_WINDOW__STEP_MS", "2000")
    with pytest.raises(ConfigError) as info:
        settings_from_dict(minimal(window={"kind": "hopping", "size_ms": 1_000,
                                           "timestamp_column": "ts"}), source="config.yaml")
    assert str(info.value) == ("config.yaml with environment variable ARROWAGG_WINDOW__STEP_MS:"
                               " window: hopping windows need step_ms, at most size_ms")


def test_env_values_are_read_as_yaml_unless_the_key_takes_text(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWAGG_INPUT__TOPICS", "[a, b]")
    monkeypatch.setenv("ARROWAGG_KAFKA__GROUP_ID", "007")
    monkeypatch.setenv("ARROWAGG_KAFKA__CONSUMER", "{fetch.wait.max.ms: 50}")
    monkeypatch.setenv("ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD", "123456")
    monkeypatch.setenv("ARROWAGG_SERVICE__HTTP_PORT", "null")
    config = load_config(EXAMPLE_CONFIG)
    settings = config.settings
    assert settings.input.topics == ["a", "b"]
    assert settings.kafka.group_id == "007"
    assert settings.kafka.consumer == {"fetch.wait.max.ms": 50}
    password = settings.kafka.security.sasl_password
    assert password is not None
    assert password.get_secret_value() == "123456"
    assert settings.service.http_port is None
    assert config.overrides == {
        "input.topics": "ARROWAGG_INPUT__TOPICS", "kafka.group_id": "ARROWAGG_KAFKA__GROUP_ID",
        "kafka.consumer": "ARROWAGG_KAFKA__CONSUMER",
        "kafka.security.sasl_password": "ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD",
        "service.http_port": "ARROWAGG_SERVICE__HTTP_PORT"}


def test_the_scale_out_refuses_windows_stage_2_cannot_merge() -> None:
    document = minimal(window={"kind": "count", "count_rows": 10},
                       scale_out={"repartition_topic": "sensors-repartition"})
    assert config_error(document).startswith("config.yaml: scale_out: needs time windows")


SESSIONS = {"kind": "session", "gap_ms": 1_000, "timestamp_column": "ts"}


@pytest.mark.parametrize("aggregation", [
    {"columns": {"power": "mean", "n": "count"}},
    {"columns": {"power": "median", "n": "n_unique"}},
    {"columns": {"power": {"quantile": 0.9}}},
    {"expressions": {"p": "pl.col('power').sum()"}},
], ids=["merging", "median-n_unique", "quantile", "expression"])
def test_the_scale_out_takes_sessions_with_any_aggregate(aggregation: dict[str, Any]) -> None:
    settings = settings_from_dict(minimal(
        window=SESSIONS, aggregation=aggregation,
        scale_out={"repartition_topic": "sensors-repartition"}))
    assert settings.scale_out is not None
    assert settings.window.kind == "session"


@pytest.mark.parametrize("emit_every_ms", [None, 500], ids=["final-only", "early-results"])
def test_the_scale_out_takes_session_revisions(emit_every_ms: int | None) -> None:
    window = {**SESSIONS, "late": "revise", "revision_lateness_ms": 5_000,
              "emit_every_ms": emit_every_ms}
    settings = settings_from_dict(minimal(
        window={k: v for k, v in window.items() if v is not None},
        scale_out={"repartition_topic": "sensors-repartition"}))
    assert settings.scale_out is not None
    assert (settings.window.late, settings.window.emit_every_ms) == ("revise", emit_every_ms)


@pytest.mark.parametrize("scale_out", [None, {"repartition_topic": "sensors-repartition"}],
                         ids=["one-instance", "scale-out"])
def test_session_early_results_run_on_one_instance_and_with_the_scale_out(
        scale_out: dict[str, str] | None) -> None:
    window = {"kind": "session", "gap_ms": 1_000, "timestamp_column": "ts",
              "emit_every_ms": 500}
    document = minimal(window=window) if scale_out is None else minimal(window=window,
                                                                        scale_out=scale_out)
    assert settings_from_dict(document).window.emit_every_ms == 500


# -- late rows, revisions, buffered aggregates (issue 16) -------------------------------


@pytest.mark.parametrize(("window", "says"), [
    ({"late": "revise"}, ("config.yaml: window: late: revise needs revision_lateness_ms: how "
                         "long past its end an emitted window is kept for late rows to "
                         "revise it")),
    ({"revision_lateness_ms": 5_000}, ("config.yaml: window: revision_lateness_ms applies to "
                                      "late: revise only, and late is topic; remove it or "
                                      "set late: revise")),
    ({"late": "drop", "revision_lateness_ms": 5_000}, ("late is drop; remove it or set late: "
                                                      "revise")),
    ({"late": "revise", "revision_lateness_ms": 0}, "greater than 0"),
    ({"late": "later"}, "'topic', 'revise' or 'drop'"),
    ({"late": "revise", "revision_lateness_ms": 1_000_000},
     "window.revision_lateness_ms: keeps up to 1001 emitted windows"),
    ({"kind": "count", "count_rows": 10, "size_ms": None, "late": "drop"},
     "window.late: belongs to event-time windows"),
    ({"time": "processing", "late": "revise", "revision_lateness_ms": 1_000},
     "window.late: belongs to event-time windows"),
])
def test_late_settings_that_do_not_fit_are_named(window: dict[str, Any], says: str) -> None:
    base = {"size_ms": 1_000, "timestamp_column": "ts"}
    assert says in config_error(minimal(window={**base, **window}))


def test_late_revise_is_accepted_with_its_bound() -> None:
    settings = settings_from_dict(minimal(window={
        "size_ms": 1_000, "timestamp_column": "ts", "late": "revise",
        "revision_lateness_ms": 60_000}))
    assert (settings.window.late, settings.window.revision_lateness_ms) == ("revise", 60_000)


def test_late_drop_with_a_late_topic_is_a_contradiction() -> None:
    message = config_error(minimal(
        output={"topic": "out", "late_topic": "late"},
        window={"size_ms": 1_000, "timestamp_column": "ts", "late": "drop"}))
    assert "output.late_topic: window.late is drop" in message


def test_the_scale_out_takes_revisions_and_aggregates_that_need_the_windows_values() -> None:
    settings = settings_from_dict(minimal(scale_out={"repartition_topic": "re"}, aggregation={
        "columns": {"latency": {"quantile": 0.99}, "user": "n_unique"},
        "expressions": {"p": "pl.col('x').median()"}}, window={
        "size_ms": 1_000, "timestamp_column": "ts", "late": "revise",
        "revision_lateness_ms": 5_000}))
    assert settings.scale_out is not None
    assert settings.window.late == "revise"


def test_quantiles_and_expressions_are_checked_when_loaded() -> None:
    settings = settings_from_dict(minimal(aggregation={
        "columns": {"latency": {"quantile": 0.99}, "user": "n_unique", "t": "median"},
        "expressions": {"error_rate": "(pl.col('status') >= 500).mean()"}}))
    assert settings.aggregation.expressions == {
        "error_rate": "(pl.col('status') >= 500).mean()"}
    assert "a quantile needs its q" in config_error(minimal(
        aggregation={"columns": {"latency": "quantile"}}))
    assert "less than or equal to 1" in config_error(minimal(
        aggregation={"columns": {"latency": {"quantile": 1.5}}}))
    refused = config_error(minimal(
        aggregation={"expressions": {"x": "__import__('os').system('true')"}}))
    assert "expressions.x: the method 'system' is not allowed" in refused


def test_session_windows_take_every_aggregate_and_revise() -> None:
    settings = settings_from_dict(minimal(
        window={"kind": "session", "gap_ms": 1_000, "timestamp_column": "ts",
                "late": "revise", "revision_lateness_ms": 5_000},
        aggregation={"columns": {"latency": "median", "bytes": {"quantile": 0.9}},
                     "expressions": {"p": "pl.col('x').n_unique()"}}))
    assert settings.window.late == "revise"
    assert settings.aggregation.expressions == {"p": "pl.col('x').n_unique()"}
