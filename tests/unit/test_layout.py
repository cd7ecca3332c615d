"""The house rules of the package layout, checked from the code's own imports (ast, nothing is imported).

Counted as imports: every ``import`` / ``from ... import`` statement anywhere in a module, at module level,
inside functions and under ``if TYPE_CHECKING:`` alike. A function-level import still ties the two modules
together (it only postpones the circle to the first call), and a TYPE_CHECKING import is a circle a type
checker and a reader both walk. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
module, else of ``pkg``. Parent packages that Python imports on the way (``a.b`` for ``a.b.c``) are not
counted: every ``__init__.py`` in the package is docstring-only, which the last test here checks.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "moe_overlap"
BENCHMARKS = PACKAGE.parent / "benchmarks"
SKILL = PACKAGE / "skill"
VERIFY = PACKAGE / "verify"
MAX_LINES = 400
MAX_SKILL_TOP_MODULES = 8
MAX_VERIFY_TOP_MODULES = 2  # __init__.py and api.py: everything else lives in a subpackage by job
MAX_MODULES_PER_FOLDER = 12
# What no skill/ module may import: the torch side, the run side and the wiring.
SKILL_FORBIDDEN = ("moe_overlap.ep", "moe_overlap.verify", "moe_overlap.mcp", "moe_overlap.commands",
                   "moe_overlap.server", "moe_overlap.cli")
HEAVY = ("torch", "transformer_engine", "megatron", "mcp")


def _modules(root: Path | None = None) -> dict[str, Path]:
    root = PACKAGE if root is None else root
    out = {}
    for path in root.rglob("*.py"):
        if "results" in path.relative_to(root).parts:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports (see the module docstring for what counts)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:  # `import a.b.func`-style tails: the module that holds it
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path | None = None) -> dict[str, set[str]]:
    """The import graph of the package (or of benchmarks/: its scripts import each other as benchmarks.*)."""
    modules = _modules(root)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module, as a path a -> b -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan; the package is a few hundred modules, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_circle(graph, comp) for comp in components]


def _circle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth-first inside the component)."""
    start = min(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle found in component {sorted(comp)}")


def test_cycle_finder_names_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_function_level_and_type_checking_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "moe_overlap"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""root"""\n')
    (pkg / "sub" / "__init__.py").write_text('"""sub"""\n')
    (pkg / "sub" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from moe_overlap.sub.b import X\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import a\n    return a\nX = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    graph = import_graph()
    assert graph["moe_overlap.sub.a"] == {"moe_overlap.sub.b"}
    assert graph["moe_overlap.sub.b"] == {"moe_overlap.sub.a"}
    assert find_cycles(graph) == [["moe_overlap.sub.a", "moe_overlap.sub.b", "moe_overlap.sub.a"]]


def test_no_import_circle_in_the_package():
    cycles = find_cycles(import_graph())
    cycles += find_cycles(import_graph(BENCHMARKS))
    assert not cycles, "import circles (move the shared types into a module of their own):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_skill_top_level_is_small():
    modules = sorted(p.name for p in SKILL.glob("*.py"))
    assert len(modules) <= MAX_SKILL_TOP_MODULES, f"skill/ has {len(modules)} top-level modules: {modules}"


def _allowed(package: Path) -> tuple[str, ...]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    # The docstring ends with the line; a long list may wrap onto the lines after it.
    match = re.search(r"^May import: (.*)\Z", doc, re.MULTILINE | re.DOTALL)
    where = package.relative_to(PACKAGE.parent)
    assert match, f"{where}/__init__.py: the docstring must end with a 'May import:' line"
    return tuple(re.findall(r"moe_overlap(?:\.[a-z_]+)+", match.group(1)))


def _subpackages(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())


def _outside_docstring(root: Path, graph: dict[str, set[str]]) -> list[str]:
    """The imports of root's subpackages that the subpackage's 'May import:' line does not allow."""
    problems = []
    for package in _subpackages(root):
        own = ".".join(package.relative_to(PACKAGE.parent).parts)
        allowed = (own, *_allowed(package))
        for name, targets in graph.items():
            if name != own and not name.startswith(own + "."):
                continue
            problems += [f"{name} imports {t} (allowed: {', '.join(allowed)})" for t in sorted(targets)
                         if not any(t == a or t.startswith(a + ".") for a in allowed)]
    return problems


def test_skill_subpackages_import_only_what_their_docstring_allows():
    graph = import_graph()
    assert _subpackages(SKILL), "skill/ has no subpackages"
    problems = _outside_docstring(SKILL, graph)
    problems += [f"{name} imports {t}" for name, targets in graph.items() if name.startswith("moe_overlap.skill")
                 for t in targets if t.startswith(SKILL_FORBIDDEN)]
    assert not problems, "\n".join(problems)


def test_verify_subpackages_import_only_what_their_docstring_allows():
    graph = import_graph()
    assert {p.name for p in _subpackages(VERIFY)} >= {"plan", "run", "judge", "calibrate"}
    problems = _outside_docstring(VERIFY, graph)
    # The run side never reaches back into the wiring that calls it.
    wiring = SKILL_FORBIDDEN[2:]
    problems += [f"{name} imports {t}" for name, targets in graph.items() if name.startswith("moe_overlap.verify")
                 for t in targets if t.startswith(wiring)]
    assert not problems, "\n".join(problems)


def test_verify_top_level_is_only_the_entry_point():
    modules = sorted(p.name for p in VERIFY.glob("*.py"))
    assert len(modules) <= MAX_VERIFY_TOP_MODULES, f"verify/ has {len(modules)} top-level modules: {modules}"


def test_benchmarks_import_each_other_as_a_package():
    """One mechanism: benchmarks.<folder>.<module> (a bare `import peers_body` needs sys.path tricks)."""
    modules = _modules(BENCHMARKS)
    bare = {m.rsplit(".", 1)[-1] for m in modules}
    problems = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            problems += [f"{name}: import {t}" for t in targets if t.split(".")[0] in bare - {"benchmarks"}]
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(f"{name}: relative import (a script run by path has no package)")
    assert not problems, "\n".join(problems)


def test_no_package_folder_holds_too_many_modules():
    folders = [VERIFY, *VERIFY.rglob("*"), BENCHMARKS, *BENCHMARKS.rglob("*")]
    folders = [d for d in folders if d.is_dir() and d.name != "__pycache__"
               and "results" not in d.relative_to(PACKAGE.parent).parts]
    crowded = {str(d.relative_to(PACKAGE.parent)): n for d in folders
               if (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules (group them by job): {crowded}"


def test_package_init_files_import_nothing():
    """So importing one module never drags in its siblings, and parent packages add no edges to the graph."""
    offenders = []
    for init in [*PACKAGE.rglob("__init__.py"), *BENCHMARKS.rglob("__init__.py")]:
        tree = ast.parse(init.read_text(encoding="utf-8"))
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
            offenders.append(str(init.relative_to(PACKAGE.parent)))
    assert not offenders, f"__init__.py files with imports: {offenders}"


def test_every_skill_module_is_torch_free():
    names = sorted(n for n in _modules() if n.startswith("moe_overlap.skill"))
    code = ("import importlib, sys\n"
            f"for n in {names!r}:\n    importlib.import_module(n)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"skill/ imported {proc.stdout.strip()}"


def test_readme_layout_names_every_subpackage():
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    missing = [f"moe_overlap/{p.name}/" for p in PACKAGE.iterdir()
               if (p / "__init__.py").is_file() and f"moe_overlap/{p.name}/" not in layout]
    missing += [f"{root.name}/{p.name}/" for root in (SKILL, VERIFY, BENCHMARKS) for p in _subpackages(root)
                if not re.search(rf"^\s+{p.name}/\s", layout, re.MULTILINE)]
    assert not missing, f"README's Layout section does not show: {missing}"
