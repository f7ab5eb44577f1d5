"""The user-facing benchmark (bench/, not bench/research/) measures the product as it
ships: it never patches the product's code, and never imports the research instruments,
which do."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
PRODUCT = ("consumer", "producer", "wire")


def user_facing() -> list[Path]:
    return sorted(BENCH.glob("*.py"))


def imported(tree: ast.Module) -> dict[str, str]:
    """Each name the module binds by an import, and the module it comes from."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def patches(tree: ast.Module, names: dict[str, str]) -> list[str]:
    """Where the module sets an attribute of something it imported from the product, or
    calls ``setattr`` at all."""
    product = {name for name, source in names.items() if source.split(".")[0] in PRODUCT}
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        found += [f"line {t.lineno}: {ast.unparse(t)} =" for t in targets
                  if isinstance(t, ast.Attribute) and _root(t) in product]
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
            found.append(f"line {node.lineno}: setattr")
    return found


def _root(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_the_user_facing_modules_are_found() -> None:
    assert {"__main__.py", "kernel.py", "kernel_floor.py", "polars_floor.py",
            "report.py"} <= {path.name for path in user_facing()}


def test_no_user_facing_module_patches_the_product() -> None:
    found = {}
    for path in user_facing():
        tree = ast.parse(path.read_text(), str(path))
        names = imported(tree)
        mocks = [source for source in names.values() if source.startswith("unittest.mock")
                 or source.split(".")[0] == "mock"]
        if where := patches(tree, names) + mocks:
            found[path.name] = where
    assert not found, f"the user-facing benchmark patches the product: {found}"


def test_no_user_facing_module_imports_the_research() -> None:
    found = [path.name for path in user_facing() if any(
        source.startswith("bench.research") for source in imported(
            ast.parse(path.read_text(), str(path))).values())]
    assert not found, f"these import bench.research: {found}"


def test_a_patch_is_seen() -> None:
    tree = ast.parse("from consumer.core.aggregate import PartialAggregator\n"
                     "import wire.input as checks\n"
                     "PartialAggregator.merge = print\n"
                     "checks.validate_batch = print\n"
                     "setattr(object, 'x', 1)\n")
    assert patches(tree, imported(tree)) == [
        "line 3: PartialAggregator.merge =", "line 4: checks.validate_batch =",
        "line 5: setattr"]
