"""Dockerfile, docker-compose.yml, its host-network override and the alert rules, checked
without a Docker engine: the files parse, the stack has its services, every entry point
is a command line the CLIs accept (with the compose variables at their defaults), and
every alert of the README has a rule. tests/deploy/compose/ builds and runs it all
(`make compose-test`)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from consumer.config import load_settings
from consumer.healthcheck import DEFAULT_PORT
from consumer.options import parser as consumer_parser
from producer.cli import _parser as producer_parser
from tests.conftest import REPO

HEALTHCHECK = ["python", "-m", "consumer.healthcheck"]


def dockerfile() -> dict[str, str]:
    """Instruction → its (last) argument text, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    instructions: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, rest = line.strip().partition(" ")
            instructions[name.upper()] = " ".join(rest.split())
    return instructions


class ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (!reset, !override) read as the value they tag."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    assert isinstance(node, yaml.ScalarNode)
    return loader.construct_scalar(node)


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, _untagged)


def compose(path: str = "docker-compose.yml") -> dict[str, Any]:
    """The file with every ``${VAR:-default}`` at its default, as compose reads it with no
    variable set."""
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", (REPO / path).read_text())
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    return document


def test_the_image_runs_the_daemon_and_checks_its_health() -> None:
    image = dockerfile()
    entrypoint, command = json.loads(image["ENTRYPOINT"]), json.loads(image["CMD"])
    assert entrypoint == ["python", "-m", "consumer"]
    args = consumer_parser().parse_args(command)
    assert (args.command, args.config) == ("run", Path("/etc/arrowagg/config.yaml"))
    healthcheck = re.fullmatch(r"(--\S+ )*CMD (\[.*\])", image["HEALTHCHECK"])
    assert healthcheck is not None
    assert json.loads(healthcheck.group(2)) == HEALTHCHECK
    assert image["EXPOSE"] == str(DEFAULT_PORT)
    assert image["STOPSIGNAL"] == "SIGTERM"
    assert image["USER"] == "arrowagg"
    # The image's config is the example, whose first HTTP port is the healthcheck's
    # default (a container's daemon is alone and takes it).
    assert load_settings(REPO / "config.yaml").service.http_ports()[0] == DEFAULT_PORT


def test_compose_has_the_whole_stack() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "topics", "daemon", "worker-1", "worker-2", "subscriber",
                             "prometheus"}
    daemon = services["daemon"]
    assert daemon["healthcheck"]["test"] == ["CMD", *HEALTHCHECK]
    assert daemon["environment"]["ARROWAGG_SERVICE__HTTP_HOST"] == "0.0.0.0"  # noqa: S104
    assert daemon["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert (daemon["build"]["context"], daemon["build"]["target"]) == (".", "daemon")
    assert "command" not in daemon  # the image's CMD: run --config /etc/arrowagg/config.yaml
    assert "ARROWAGG_PROCESSING__INSTANCE_ID" not in daemon["environment"]  # host name: scalable
    for name in ("topics", "worker-1", "worker-2", "subscriber"):
        # The image without the daemon's HEALTHCHECK: `up --wait` waits for them to run.
        assert services[name]["build"]["target"] == "tools"
        assert "healthcheck" not in services[name]
        assert services[name]["init"] is True  # SIGTERM ends them (PID 1 would ignore it)


def test_the_images_are_official_by_default_and_the_ca_bundle_a_build_secret() -> None:
    services = compose()["services"]
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["daemon"]["build"]["args"] == {"BASE_IMAGE": "python:3.11-slim"}
    assert "ARG BASE_IMAGE=python:3.11-slim" in (REPO / "Dockerfile").read_text()
    assert services["daemon"]["build"]["secrets"] == ["ca_bundle"]
    image = dockerfile()
    assert "ca_bundle" not in image.get("ENV", "") + image.get("COPY", "")
    run_lines = [line for line in (REPO / "Dockerfile").read_text().splitlines()
                 if "ca_bundle" in line and not line.lstrip().startswith("#")]
    assert run_lines[0].startswith("RUN --mount=type=secret,id=ca_bundle")


def test_the_host_network_override_leaves_no_port_fixed() -> None:
    override = (REPO / "deploy" / "compose.host-network.yml").read_text()
    services = yaml.load(override, Loader=ComposeLoader)["services"]  # noqa: S506 - safe
    assert set(services) == set(compose()["services"])
    assert all(service["network_mode"] == "host" for service in services.values())
    body = "\n".join(line.split("#")[0] for line in override.splitlines())
    for port in re.findall(r"(?<![\w.-])(\d{4,5})(?![\d.])", body):
        assert re.search(rf"\$\{{\w+:-[^}}]*{port}", body), f"port {port} is not a variable"


def test_every_alert_of_the_readme_has_a_rule() -> None:
    readme = (REPO / "README.md").read_text()
    table = readme.split("### Metrics to alert on", 1)[1].split("\n\n", 2)[1]
    rows = table.splitlines()[2:]
    metrics = {m for row in rows for m in re.findall(r"`(\w+)", row.split("|")[1])}
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs = " ".join(rule["expr"] for group in rules["groups"] for rule in group["rules"])
    # One rule a row; the last row (`arrowagg_ready`, `up`) is two: not ready, not scraped.
    assert len(rules["groups"][0]["rules"]) == len(rows) + 1
    assert [metric for metric in sorted(metrics) if metric not in exprs] == []


def test_every_service_command_is_one_the_clis_accept() -> None:
    services = compose()["services"]
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker["entrypoint"] == ["python", "-m", "producer"]
        args = producer_parser().parse_args(worker["command"])
        assert args.command == "generate"
        assert args.topic == "sensors"
        assert args.duration_s == 3600
    tail = consumer_parser().parse_args(services["subscriber"]["command"])
    assert (tail.command, tail.topic) == ("tail", "sensors-agg")


def test_the_topics_step_creates_the_topics_of_the_images_config() -> None:
    topics = compose()["services"]["topics"]
    assert topics["build"]["context"] == compose()["services"]["daemon"]["build"]["context"]
    assert topics["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    args = consumer_parser().parse_args(topics["command"])
    assert (args.command, args.topics_command) == ("topics", "create")
    assert args.config == Path("/etc/arrowagg/config.yaml")  # the image's copy of config.yaml


def test_the_image_holds_every_package_the_project_installs() -> None:
    # pip install . in the image builds from what was copied; a package left out (wire/,
    # when it was added) makes an image whose every command fails on import.
    text = (REPO / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, flags=re.MULTILINE))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied
