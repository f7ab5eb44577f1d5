"""deploy/arrowagg@.service: the keys the daemon relies on, and systemd's own verdict."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from consumer.config import ProcessingSettings
from consumer.options import parser as _parser
from tests.conftest import REPO

UNIT = REPO / "deploy" / "arrowagg@.service"
Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections → key → every value (systemd keys may repeat)."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "min": 60}
    for suffix, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * factor
    return float(value)


def test_notify_watchdog_restart_and_reload() -> None:
    service = parse_unit(UNIT.read_text())["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["Restart"] == ["on-failure"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["EnvironmentFile"] == ["-/etc/arrowagg/env"]
    # The loop may sit in one broker call for 30 s (committed(), init_transactions()):
    # a watchdog shorter than two of those would kill a healthy daemon.
    watchdog = seconds(service["WatchdogSec"][0])
    assert watchdog >= 60
    assert watchdog / 2 > ProcessingSettings().poll_timeout_ms / 1000
    assert seconds(service["TimeoutStopSec"][0]) >= 30


def test_exec_start_is_the_cli_the_tests_run() -> None:
    service = parse_unit(UNIT.read_text())["Service"]
    argv = shlex.split(service["ExecStart"][0])
    assert argv[0].endswith("/python")
    assert argv[1:3] == ["-m", "consumer"]
    args = _parser().parse_args(argv[3:])
    assert args.command == "run"
    assert args.config == Path("/etc/arrowagg/config.yaml")


def test_each_instance_of_the_template_has_a_stable_id_of_its_own() -> None:
    """arrowagg@1, arrowagg@2...: the instance name goes into the instance id, which names
    the static group member and the transactional.id."""
    environment = parse_unit(UNIT.read_text())["Service"]["Environment"]
    assert "ARROWAGG_PROCESSING__INSTANCE_ID=%H-%i" in environment


def test_hardening() -> None:
    service = parse_unit(UNIT.read_text())["Service"]
    expected = {
        "DynamicUser": "yes", "ProtectSystem": "strict", "NoNewPrivileges": "yes",
        "PrivateTmp": "yes", "ProtectHome": "yes", "CapabilityBoundingSet": "",
        "AmbientCapabilities": "", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "SystemCallArchitectures": "native",
        "UMask": "0077",
    }
    for key, value in expected.items():
        assert service.get(key) == [value], key
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    """``systemd-analyze verify`` (part of this machine's systemd) flags unknown keys and
    bad values as warnings; none may appear. It also wants ExecStart's binary to exist,
    so the copy runs this interpreter."""
    text = UNIT.read_text()
    unit = parse_unit(text)
    assert set(unit) == {"Unit", "Service", "Install"}
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert unit["Unit"]["After"] == ["network-online.target"]
    tool = shutil.which("systemd-analyze")
    if tool is None:  # machines without systemd: the key checks above are the test
        return
    copy = tmp_path / "arrowagg@.service"
    copy.write_text(text.replace("/opt/arrowagg/bin/python", sys.executable))
    instance = str(tmp_path / "arrowagg@1.service")  # verified as an instance of the template
    result = subprocess.run([tool, "verify", instance], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""
    bad = tmp_path / "arrowagg@.service"
    bad.write_text(copy.read_text().replace("WatchdogSec=", "WatchdogSecs="))
    flagged = subprocess.run([tool, "verify", instance], capture_output=True, text=True,
                             check=False, timeout=60)
    assert "Unknown key 'WatchdogSecs'" in flagged.stderr  # the check can fail
