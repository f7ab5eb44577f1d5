"""The machine and library versions every result is stamped with."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("polars", "pyarrow", "datafusion", "duckdb", "confluent-kafka", "matplotlib")


def machine_info(foreign: dict[str, Path] | None = None) -> dict[str, Any]:
    """Cores, memory, CPU model, Python and the versions of the libraries compared;
    ``foreign``: packages installed in other interpreters (the end-to-end peers')."""
    versions = {name: _version(name) for name in LIBRARIES}
    for name, python in (foreign or {}).items():
        if python.exists():
            versions[name] = _foreign_version(python, name)
    import confluent_kafka  # noqa: PLC0415 - librdkafka's version is only known at run time

    versions["librdkafka"] = confluent_kafka.libversion()[0]
    return {
        "cores": os.cpu_count(),
        "memory_gb": round(_mem_total_kb() / 1024 / 1024, 1),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "versions": versions,
    }


def describe(info: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"machine: {info['cores']} cores, {info['memory_gb']} GB, {info['cpu']}; "
            f"Python {info['python']}\nlibraries: {versions}")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _foreign_version(python: Path, name: str) -> str:
    code = f"from importlib import metadata; print(metadata.version({name!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    return done.stdout.strip() or "not installed"


def _mem_total_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def rss_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in kB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found["VmRSS"], found["VmHWM"]
