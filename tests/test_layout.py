"""The code layout a new user's commands depend on: every module imports through the installed
distribution from any directory, the command-line tools never load CDK, no package of ours shadows
a dependency, and no module imports itself in a circle.

`make synth` once failed on a fresh clone because ``constructs/`` merged into the ``constructs``
library only when the repository root was on ``sys.path`` (pytest's, not the ``gennstack``
entry point's). The subprocess tests here run from a temporary directory, so nothing the test
runner puts on ``sys.path`` can hide such a failure again.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.support import ROOT

OUR_PACKAGES = ("gennstack", "gennstack_infra")
# What loads CDK: the CDK libraries, jsii (starts Node.js), cdk-nag, and our CDK package.
CDK_MODULES = ("aws_cdk", "jsii", "constructs", "cdk_nag", "gennstack_infra")
# Every `gennstack` command's module (gennstack/cli.py dispatches to these).
COMMAND_MODULES = (
    "gennstack.cli",
    "gennstack.summary",
    "gennstack.diagram",
    "gennstack.bench.cli",
    "gennstack.cost.cli",
    "gennstack.preflight.cli",
    "gennstack.drill.cli",
    "gennstack.gateway.cli",
    "gennstack.config_reference",
    "gennstack.resume.cli",
)


def _python(code: str, cwd: Path) -> str:
    """Run ``code`` in the suite's interpreter in isolated mode (-I: neither the working directory
    nor PYTHONPATH on sys.path), so imports resolve only through the installed distribution."""
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _module_files(package: str) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name, with its source file."""
    files = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _modules(package: str) -> list[str]:
    return list(_module_files(package))


def test_every_module_imports_from_outside_the_repository(tmp_path: Path) -> None:
    modules = [m for package in OUR_PACKAGES for m in _modules(package)]
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "print(json.dumps(files))\n"
    )
    files = json.loads(_python(code, tmp_path))
    assert set(files) == set(modules) and len(modules) > 90
    outside = {m: f for m, f in files.items() if not Path(f).resolve().is_relative_to(ROOT)}
    assert not outside, outside


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_commands_never_load_cdk(module: str, tmp_path: Path) -> None:
    code = (f"import sys, {module}\n"
            f"print([m for m in sys.modules if m.split('.')[0] in {CDK_MODULES!r}])")
    assert _python(code, tmp_path).strip() == "[]"


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Every module of ours that ``path`` imports, at any depth: module level, inside functions and
    under ``TYPE_CHECKING`` (a circle through a type-only import is still a circle to a reader)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module: path for package in OUR_PACKAGES for module, path in _module_files(package).items()}
    known = set(paths)
    return {module: _imports(path, module, known) for module, path in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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
                    circles.append(sorted(component))
    return circles


def test_import_circles_are_found() -> None:
    """The finder itself: the circle the config once had (config -> fit -> scaling -> config)."""
    graph = {"config": {"fit"}, "fit": {"scaling", "capacity"}, "scaling": {"config"}, "capacity": set()}
    assert import_circles(graph) == [["config", "fit", "scaling"]]
    graph["scaling"] = set()
    assert import_circles(graph) == []


def test_no_import_circles() -> None:
    graph = import_graph()
    assert graph["gennstack.serving.fit"] >= {"gennstack.serving.scaling"}  # the graph sees real edges
    assert import_circles(graph) == []


def test_plain_modules_never_import_cdk_code() -> None:
    """Pure logic in plain modules that constructs call, never the reverse: nothing in ``gennstack``
    imports ``gennstack_infra`` or a CDK library, even lazily inside a function."""
    offenders = {}
    for module, path in _module_files("gennstack").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in CDK_MODULES]
            if bad:
                offenders.setdefault(module, []).extend(bad)
    assert not offenders, offenders


def test_no_package_is_named_after_a_dependency() -> None:
    """No directory or module at the repository root, and no package of ours at any depth, has the
    name of a top-level module another installed distribution provides (``constructs/`` once did)."""
    provided = {name for name, dists in metadata.packages_distributions().items() if set(dists) != {"gennstack"}}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    # a tracked .py file at the root, or a root folder holding .py files directly (an importable package,
    # namespace or not, whenever the root is on sys.path)
    ours = {Path(f).stem for f in tracked if "/" not in f and f.endswith(".py")}
    ours |= {Path(f).parts[0] for f in tracked if len(Path(f).parts) == 2 and f.endswith(".py")}
    ours |= {part for package in OUR_PACKAGES for module in _modules(package) for part in module.split(".")}
    assert "constructs" in provided and "aws_cdk" in provided  # the check sees the CDK libraries
    assert not ours & provided, sorted(ours & provided)



def test_summary_runs_from_any_directory_without_loading_cdk(synth, tmp_path: Path) -> None:
    """What `make synth` runs last, from outside the repository: the summary, its system-node fit
    (which reads every controller chart's values) and its cost lines, and still no CDK module."""
    code = (
        "import sys\n"
        "from gennstack.cli import main\n"
        f"code = main(['summary', '--cdk-out', {str(synth.outdir)!r}])\n"
        f"loaded = [m for m in sys.modules if m.split('.')[0] in {CDK_MODULES!r}]\n"
        "print('LOADED', loaded)\n"
        "sys.exit(code)\n"
    )
    out = _python(code, tmp_path)
    assert "Stack GenNStack:" in out and "system nodes: 4 x m7i.large" in out
    assert out.rstrip().endswith("LOADED []"), out[-500:]
