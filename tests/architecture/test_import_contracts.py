"""The layers of src/lego_rl, enforced: an import that points up a floor fails here, naming the import.

The floors and the forbidden imports are import-linter contracts in pyproject.toml (`[tool.importlinter]`);
each runs as its own test. Three rules import-linter cannot state are checked here with grimp, the import
graph import-linter itself builds:
- no two files of the package import each other, directly or round a longer loop;
- `lego_rl.monitor`, once it exists, imports nothing of lego_rl but the run store (and `errors` under it);
- a harness plugin (plugins/*) uses only lego_rl's plugin-facing floors: harness, sandbox, errors;
- only `config`, `cli` and `compose` name the whole config (`LegoConfig`, `ResolvedConfig`), even for a type
  annotation: every other room gets typed settings projected by `compose`.
Imports under `if TYPE_CHECKING:` are not imports at run time and are ignored everywhere.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONTRACT_IDS = [c["id"] for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]]
PLUGIN_PACKAGES = sorted(p.parent.name for p in ROOT.glob("plugins/*/src/*/__init__.py"))

# Allow-lists: every lego_rl module a package's files import must lie under one of these.
ONLY_IMPORTS = {
    "lego_rl.monitor": ("lego_rl.monitor", "lego_rl.runstore", "lego_rl.errors"),
    **{plugin: ("lego_rl.harness", "lego_rl.sandbox", "lego_rl.errors") for plugin in PLUGIN_PACKAGES},
}


CONFIG_TYPES = {"LegoConfig", "ResolvedConfig"}
CONFIG_READERS = ("lego_rl.config", "lego_rl.cli", "lego_rl.compose")
"""The rooms that may name the whole config; the others get typed settings from ``lego_rl.compose``."""


def config_type_imports(root: Path) -> list[str]:
    """``module: name (l.N)`` for every import of ``LegoConfig`` or ``ResolvedConfig`` from ``lego_rl.config`` in
    a module of ``root`` (a ``lego_rl`` package directory) outside ``CONFIG_READERS``, ``TYPE_CHECKING`` ones too."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("lego_rl", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if any(module == r or module.startswith(r + ".") for r in CONFIG_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lego_rl.config"):
                found += [f"{module}: {a.name} (l.{node.lineno})" for a in node.names if a.name in CONFIG_TYPES]
    return found


def lint_imports(*contracts: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """import-linter's own command over pyproject.toml; with `pythonpath`, over the lego_rl found there."""
    env = {**os.environ, "COLUMNS": "200"}  # its report is wrapped to the terminal width; keep lines whole
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    cmd = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
           str(PYPROJECT), "--no-cache", "--no-logo", *(arg for c in contracts for arg in ("--contract", c))]
    return subprocess.run(cmd, cwd=pythonpath or ROOT, env=env, capture_output=True, text=True, timeout=120)


def violations(result: subprocess.CompletedProcess[str]) -> set[str]:
    """The offending imports an import-linter report lists (`a -> b (l.N)`)."""
    return {line.strip(" -") for line in result.stdout.splitlines() if " -> " in line}


def import_graph(*packages: str) -> grimp.ImportGraph:
    return grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} (l.{self.line}: {self.text})"


def imports_between(graph: grimp.ImportGraph, importer: str, imported: str) -> list[Import]:
    return [Import(importer, imported, d["line_number"], d["line_contents"])
            for d in graph.get_import_details(importer=importer, imported=imported)]


def file_cycles(graph: grimp.ImportGraph) -> list[list[Import]]:
    """Each set of files that import each other (a strongly connected component of more than one file),
    as the imports that join them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    # Tarjan's algorithm, iterative: the package's import chains are deep enough to trouble recursion.
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [[imp for a in comp for b in comp if a != b for imp in imports_between(graph, a, b)]
            for comp in sorted(components)]


def outside_allowed(graph: grimp.ImportGraph, package: str, allowed: tuple[str, ...]) -> list[Import]:
    """The imports from `package`'s files into lego_rl that land outside `allowed` (nothing if `package`
    does not exist)."""
    if package not in graph.modules:
        return []
    found = []
    for module in sorted({package} | graph.find_descendants(package)):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            inside = imported == "lego_rl" or imported.startswith("lego_rl.")
            if inside and not any(imported == a or imported.startswith(a + ".") for a in allowed):
                found += imports_between(graph, module, imported)
    return found


# --- the rules, over the real code ---


@pytest.mark.parametrize("contract", CONTRACT_IDS)
def test_import_contract(contract: str) -> None:
    result = lint_imports(contract)
    assert result.returncode == 0, \
        f"import contract {contract!r} (pyproject.toml [tool.importlinter]) is broken:\n" \
        f"{result.stdout}{result.stderr}"


def test_no_import_cycle_between_files() -> None:
    cycles = file_cycles(import_graph("lego_rl", *PLUGIN_PACKAGES))
    listed = "\n".join("cycle:\n" + "\n".join(f"  {imp}" for imp in cycle) for cycle in cycles)
    assert not cycles, f"files that import each other (move what both need to a module below both):\n{listed}"


@pytest.mark.parametrize("package", sorted(ONLY_IMPORTS))
def test_package_imports_only_its_allowed_floors(package: str) -> None:
    graph = import_graph("lego_rl", *PLUGIN_PACKAGES)
    bad = outside_allowed(graph, package, ONLY_IMPORTS[package])
    listed = "\n".join(f"  {imp}" for imp in bad)
    allowed = ", ".join(ONLY_IMPORTS[package])
    assert not bad, f"{package} may import from lego_rl only {allowed}; it imports:\n{listed}"


def test_only_compose_config_and_cli_name_the_whole_config() -> None:
    bad = config_type_imports(ROOT / "src" / "lego_rl")
    assert not bad, ("outside config, cli and compose no module reads the whole config; add the value to the "
                     "part's settings type and set it in lego_rl.compose (compose.projection):\n  " + "\n  ".join(bad))


def test_every_plugin_is_checked() -> None:
    # A plugin that is not installed would make the graph build fail above; one missing from the list would
    # pass unchecked. The four shipped harnesses must all be there.
    assert {"lego_harness_claude_code", "lego_harness_codex", "lego_harness_opencode",
            "lego_harness_openhands"} <= set(PLUGIN_PACKAGES)


# --- the rules can fail: the same checks over a copy of the package with a planted import ---


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "lego_rl", tmp_path / "lego_rl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def plant(root: Path, module: str, source: str) -> None:
    """Append `source` to `module` of the copy; a module that does not exist is created as a package."""
    parts = module.split(".")
    path = root.joinpath(*parts)
    if path.with_suffix(".py").exists():
        target = path.with_suffix(".py")
    else:
        for depth in range(1, len(parts) + 1):
            package = root.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            if not (package / "__init__.py").exists():
                (package / "__init__.py").write_text('"""planted by a test."""\n')
        target = path / "__init__.py"
    target.write_text(target.read_text() + "\n" + source + "\n")


def test_an_upward_import_breaks_the_floors(package_copy: Path) -> None:
    plant(package_copy, "lego_rl.trajectory.records", "import lego_rl.rollout.generate  # planted")
    result = lint_imports("layers", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.trajectory is not allowed to import lego_rl.rollout" in result.stdout
    assert "lego_rl.trajectory.records -> lego_rl.rollout.generate" in result.stdout


def test_an_import_between_independent_siblings_breaks_the_floors(package_copy: Path) -> None:
    plant(package_copy, "lego_rl.chat.render", "from lego_rl.sandbox import base  # planted")
    result = lint_imports("layers", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.chat.render -> lego_rl.sandbox" in result.stdout


def test_an_indirect_http_import_makes_train_impure(package_copy: Path) -> None:
    # train -> trajectory is allowed; trajectory pulling in aiohttp is what makes train impure.
    plant(package_copy, "lego_rl.trajectory.sample", "import aiohttp  # planted")
    result = lint_imports("train-pure", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.train is not allowed to import aiohttp" in result.stdout
    assert "lego_rl.trajectory.sample -> aiohttp" in result.stdout


def test_rollout_reading_the_config_breaks_its_contract(package_copy: Path) -> None:
    # rollout sits above config, so the floors allow it; the narrower rule is what keeps the projection in one place.
    plant(package_copy, "lego_rl.rollout.generate", "from lego_rl.config.schema import LegoConfig  # planted")
    assert lint_imports("layers", pythonpath=package_copy).returncode == 0
    result = lint_imports("rollout-no-config", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.rollout.generate -> lego_rl.config.schema" in result.stdout


def test_the_driver_reading_the_config_or_ray_breaks_its_contract(package_copy: Path) -> None:
    plant(package_copy, "lego_rl.driver.scheduler", "from lego_rl.config import resolve  # planted")
    plant(package_copy, "lego_rl.driver.weight_sync", "import ray  # planted")
    result = lint_imports("driver-pure", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.driver.scheduler -> lego_rl.config.resolve" in result.stdout
    assert "lego_rl.driver.weight_sync -> ray" in result.stdout


def test_the_cluster_room_reading_the_resolved_config_breaks_its_contract(package_copy: Path) -> None:
    plant(package_copy, "lego_rl.cluster.ray_nodes", "from lego_rl.config.resolve import ResolvedConfig  # planted")
    result = lint_imports("config-read-by-compose", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.cluster.ray_nodes -> lego_rl.config.resolve" in result.stdout
    assert [b.split(" (")[0] for b in config_type_imports(package_copy / "lego_rl")] == [
        "lego_rl.cluster.ray_nodes: ResolvedConfig"]


def test_a_type_checking_import_of_the_config_is_still_a_reader(package_copy: Path) -> None:
    """import-linter ignores TYPE_CHECKING imports; the config rule does not (an annotation names the dependency)."""
    plant(package_copy, "lego_rl.driver.runner",
          "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lego_rl.config.schema import LegoConfig")
    assert [b for b in config_type_imports(package_copy / "lego_rl") if b.startswith("lego_rl.driver.runner:")]


def test_a_new_top_level_module_needs_a_floor(package_copy: Path) -> None:
    plant(package_copy, "lego_rl.scheduler", "")
    result = lint_imports("layers", pythonpath=package_copy)
    assert result.returncode != 0
    assert "lego_rl.scheduler" in result.stdout


def test_packages_still_to_come_take_their_floors(package_copy: Path) -> None:
    """monitor does not exist yet; when it arrives reading the run store, it fits its floor and the contracts
    give the same verdict as without it. The run store must stay at the bottom: an import up from it fails."""
    baseline = lint_imports("layers", pythonpath=package_copy)
    plant(package_copy, "lego_rl.monitor.view", "import lego_rl.runstore.events")
    plant(package_copy, "lego_rl.cli.monitor_cmd", "import lego_rl.monitor.view, lego_rl.driver.runner")
    with_them = lint_imports("layers", pythonpath=package_copy)
    assert with_them.returncode == baseline.returncode, with_them.stdout
    assert violations(with_them) == violations(baseline)

    plant(package_copy, "lego_rl.runstore.planted_up", "import lego_rl.trajectory.sample  # up")
    result = lint_imports("layers", pythonpath=package_copy)
    assert result.returncode != 0
    assert violations(result) - violations(baseline) == {
        "lego_rl.runstore.planted_up -> lego_rl.trajectory.sample (l.3)"}


def test_a_cycle_between_files_is_reported_with_its_imports() -> None:
    graph = grimp.ImportGraph()
    edges = [("p.a", "p.b", 3), ("p.b", "p.c", 4), ("p.c", "p.a", 5), ("p.c", "p.d", 6),
             ("p.e", "p.e2", 1), ("p.e2", "p.e", 2)]
    for importer, imported, line in edges:
        graph.add_import(importer=importer, imported=imported, line_number=line,
                         line_contents=f"import {imported}")
    cycles = file_cycles(graph)
    assert [sorted(str(imp) for imp in cycle) for cycle in cycles] == [
        ["p.a -> p.b (l.3: import p.b)", "p.b -> p.c (l.4: import p.c)", "p.c -> p.a (l.5: import p.a)"],
        ["p.e -> p.e2 (l.1: import p.e2)", "p.e2 -> p.e (l.2: import p.e)"],
    ]


def test_an_import_outside_the_allow_list_is_reported() -> None:
    graph = grimp.ImportGraph()
    graph.add_module("lego_rl")
    graph.add_import(importer="lego_rl.monitor.view", imported="lego_rl.runstore.read", line_number=1,
                     line_contents="from lego_rl.runstore import read")
    graph.add_import(importer="lego_rl.monitor", imported="lego_rl.serving.client", line_number=7,
                     line_contents="from lego_rl.serving import client")
    graph.add_import(importer="lego_rl.monitor.view", imported="rich", line_number=2,
                     line_contents="import rich")
    bad = outside_allowed(graph, "lego_rl.monitor", ONLY_IMPORTS["lego_rl.monitor"])
    assert [str(imp) for imp in bad] == [
        "lego_rl.monitor -> lego_rl.serving.client (l.7: from lego_rl.serving import client)"]
    assert outside_allowed(graph, "lego_rl.nosuch", ("lego_rl.errors",)) == []
