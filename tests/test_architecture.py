"""The layering of docs/design.md is enforced by import-linter's contracts in
pyproject.toml: here they hold, and a forbidden import breaks them. And the project's
two rules of size and naming hold: no module over 400 lines, no public name defined in
two modules."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_MODULE_LINES = 400
# Loggers and entry points: every module may have its own.
CONVENTIONAL_NAMES = frozenset({"log", "main"})


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
    assert "7 kept, 0 broken" in done.stdout


def test_a_core_module_importing_the_kafka_client_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    windows = tree / "consumer" / "core" / "windows" / "bounds.py"
    windows.write_text(windows.read_text().replace(
        "import polars as pl\n", "import confluent_kafka\nimport polars as pl\n", 1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert "consumer.core.windows.bounds -> confluent_kafka" in done.stdout
    assert "The core is pure: no Kafka client, none of the daemon's edges BROKEN" in done.stdout


def test_one_window_kind_importing_another_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    count = tree / "consumer" / "core" / "windows" / "count" / "engine.py"
    count.write_text(count.read_text().replace(
        "import polars as pl\n",
        "import polars as pl\n\nimport consumer.core.windows.session.spans\n", 1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert ("consumer.core.windows.count.engine -> consumer.core.windows.session.spans"
            in done.stdout)
    assert "Each window kind has a room of its own: none imports another BROKEN" in done.stdout


def test_the_windows_importing_the_scale_out_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    store = tree / "consumer" / "core" / "windows" / "store.py"
    store.write_text(store.read_text().replace(
        "import polars as pl\n", "import polars as pl\n\nimport consumer.core.scale_out.key_hash\n",
        1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert "consumer.core.windows.store -> consumer.core.scale_out.key_hash" in done.stdout


def test_the_output_format_importing_the_daemon_breaks_the_build(tmp_path: Path) -> None:
    tree = copy_sources(tmp_path)
    output = tree / "wire" / "output.py"
    output.write_text(output.read_text().replace(
        "import polars as pl\n", "import polars as pl\n\nimport consumer.core.types\n", 1))
    done = lint_imports(tree)
    assert done.returncode == 1
    assert "wire.output -> consumer.core.types" in done.stdout


def modules(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (REPO / package).rglob("*.py"))


def defined_names(module: Path) -> set[str]:
    """The public names a module defines at its top level: functions, classes and
    assigned names without a leading underscore (imports define nothing)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(), str(module)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n.id for target in node.targets for n in ast.walk(target)
                         if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_") and n not in CONVENTIONAL_NAMES}


def test_no_module_is_over_400_lines() -> None:
    lines = {path: len(path.read_text().splitlines())
             for path in modules("consumer", "producer", "wire", "bench")}
    over = [f"{path.relative_to(REPO)}: {count}" for path, count in lines.items()
            if count > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them): {', '.join(over)}"


def test_no_public_name_is_defined_in_two_modules() -> None:
    where: dict[str, list[str]] = {}
    for path in modules("consumer", "producer", "wire"):
        for name in defined_names(path):
            where.setdefault(name, []).append(str(path.relative_to(REPO)))
    twice = [f"{name} ({', '.join(paths)})" for name, paths in sorted(where.items())
             if len(paths) > 1]
    assert not twice, ("public names defined in more than one module (define each once, "
                       f"import it elsewhere, or rename one): {'; '.join(twice)}")


def test_every_module_is_in_the_design_map() -> None:
    """docs/design.md's Layout table names every module by its path, so a newcomer can
    find each one's owner there."""
    text = (REPO / "docs" / "design.md").read_text()
    named = set(re.findall(r"`((?:wire|producer|consumer)/[\w/]+\.py)`", text))
    missing = [str(path.relative_to(REPO)) for path in modules("wire", "producer", "consumer")
               if path.name != "__init__.py" and str(path.relative_to(REPO)) not in named]
    assert not missing, f"modules missing from docs/design.md's Layout: {', '.join(missing)}"
    gone = sorted(n for n in named if not (REPO / n).exists())
    assert not gone, f"docs/design.md names modules that do not exist: {', '.join(gone)}"


def test_imported_test_modules_finds_both_forms_of_import(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text("import os\nfrom tests.a.test_b import X\nfrom tests.a.helpers import Y\n"
                      "import tests.c.test_d\n")
    assert imported_test_modules(source) == ["tests.a.test_b", "tests.c.test_d"]


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in conftest or helper modules: a test module imported by
    another runs its module-level code twice and ties two tests' edits together."""
    offenders = {str(path.relative_to(REPO)): imported
                 for path in sorted((REPO / "tests").rglob("test_*.py"))
                 if (imported := imported_test_modules(path))}
    assert offenders == {}, "move what they share to a helper module or conftest"


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (``test_*``) that ``path`` imports."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]
