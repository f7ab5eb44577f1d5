"""The layering of docs/design.md is enforced by import-linter's contracts in
pyproject.toml: here they hold, and a forbidden import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml")],
                          cwd=tree, env=env, capture_output=True, text=True, check=False,
                          timeout=120)


def copy_sources(tree: Path) -> Path:
    for package in ("wire", "consumer", "producer"):
        shutil.copytree(REPO / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_every_contract_is_kept() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 kept, 0 broken" in done.stdout


def test_a_core_module_importing_the_kafka_client_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    windows = tree / "consumer" / "core" / "windows.py"
    windows.write_text(windows.read_text().replace(
        "import polars as pl\n", "import confluent_kafka\nimport polars as pl\n", 1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert "consumer.core.windows -> confluent_kafka" in done.stdout
    assert "The core is pure: no Kafka client, none of the daemon's edges BROKEN" in done.stdout


def test_the_output_format_importing_the_daemon_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    output = tree / "wire" / "output.py"
    output.write_text(output.read_text().replace(
        "import polars as pl\n", "import polars as pl\n\nimport consumer.core.types\n", 1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert "wire.output -> consumer.core.types" in done.stdout
