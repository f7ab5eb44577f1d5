"""Dockerfile and docker-compose.yml, checked without a Docker engine: the files parse,
the stack has its services, and every entry point is a command line the CLIs accept."""

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


def compose() -> dict[str, Any]:
    document = yaml.safe_load((REPO / "docker-compose.yml").read_text())
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
    assert set(services) == {"kafka", "topics", "daemon", "worker-1", "worker-2", "subscriber"}
    daemon = services["daemon"]
    assert daemon["healthcheck"]["test"] == ["CMD", *HEALTHCHECK]
    assert daemon["environment"]["ARROWAGG_SERVICE__HTTP_HOST"] == "0.0.0.0"  # noqa: S104
    assert daemon["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert daemon["build"] == "."
    assert "command" not in daemon  # the image's CMD: run --config /etc/arrowagg/config.yaml
    for name in ("worker-1", "worker-2", "subscriber"):
        assert services[name]["healthcheck"] == {"disable": True}  # no HTTP server there
        assert services[name]["image"] == daemon["image"]


def test_every_service_command_is_one_the_clis_accept() -> None:
    services = compose()["services"]
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker["entrypoint"] == ["python", "-m", "producer"]
        args = producer_parser().parse_args(worker["command"])
        assert args.command == "generate"
        assert args.topic == "sensors"
    tail = consumer_parser().parse_args(services["subscriber"]["command"])
    assert (tail.command, tail.topic) == ("tail", "sensors-agg")


def test_the_topics_step_creates_the_topics_of_the_images_config() -> None:
    topics = compose()["services"]["topics"]
    assert topics["image"] == compose()["services"]["daemon"]["image"]
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
