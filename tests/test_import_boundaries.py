"""The layer rules, stated as data and checked against every module's imports.

Imports are read with `ast` (nothing is imported or executed), so a rule also holds for a module whose
dependencies are not installed. An import counts wherever it stands (module level, inside a function, under
`if TYPE_CHECKING:`), except where a rule says otherwise. A violation names the file and line, the importing
module, what it imports and the rule it breaks.

The rules (docs/architecture.md draws the same picture in words):

- services.schemas, the documents the system serves and accepts, is a leaf: it imports pydantic and the standard
  library only, so that reading a document never loads the analysis, numpy or pandas.
- services.analysis is pure: no I/O, no clock, no other layer but the documents it builds. It imports only the
  computational part of the standard library, numpy, pandas, pydantic and services.schemas.
- Live hang detection has one implementation: services.analysis.live judges a LiveState and reads no events (no
  pandas, no RunData); a LiveState is built from a run only by services.storage.live (for many runs at once by
  services.storage.live_batch, with live's code; for a pruned run, from the tail it stored:
  services.analysis.live_tail). Tests read scenarios through it too (tests/live_database.py).
- Only services.storage speaks SQL: no other application module imports SQLAlchemy, Alembic or psycopg, except
  SQLAlchemy's `Engine` and `Connection`, handles that callers pass into storage functions and that carry no SQL.
  Outside the application, migrations/ (Alembic) and the tests and benchmarks (which set up and inspect
  databases directly) are not bound by this rule.
- The dashboards, the CLI and the simulator reach the server only through services.api_client: none of their
  modules imports an HTTP client.
- ingest_client runs inside every training process: it imports the standard library, torch only lazily (inside a
  function, or for type checking), and nothing of the server. Its framework integrations import their framework.
- ingest_client's parts are arranged by where they run: the worker's code (every training process) never imports
  the launcher's (`goodput launch`) or the tools' (`goodput sync`), and the common wire format and settings import
  no other part: each part imports only those `CLIENT_PARTS` lists for it.
- The arrows between the packages of services (and the dashboards) point one way: each package imports only the
  ones listed for it in `MAY_IMPORT`.
- The collector's read routes are thin: they import of services only services.derive (a run as served) and
  services.schemas (the documents they answer with), besides the collector's own deps, auth and errors. The write
  path (ingest), the metrics exposition and the health probe are the exceptions `ROUTES_EXCEPTIONS` names.
- No import circle: among the modules of services and ingest_client, the imports at module level (type-only ones
  included: a circle that only type checking closes still ties the modules together) form no cycle.
- What a module reaches through others counts too: importing services.api_client (what the CLI and the dashboard
  load) reaches none of `API_CLIENT_NEVER_REACHES`, followed through the import graph and checked in a fresh
  interpreter.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPLICATION = ("services", "dashboards", "ingest_client")

# --- services.analysis: pure -------------------------------------------------------------------------------------
# The standard library's modules that compute without touching the outside world (`random` is seeded by callers:
# random.Random(seed)). Not here on purpose: os, io, pathlib, socket, subprocess, threading, logging, time,
# datetime (a clock), and anything else that reads or writes the world.
PURE_STDLIB = frozenset({
    "__future__", "abc", "bisect", "collections", "copy", "dataclasses", "decimal", "enum", "fractions",
    "functools", "heapq", "itertools", "math", "numbers", "operator", "random", "re", "statistics", "string",
    "textwrap", "types", "typing",
})
ANALYSIS_MAY_IMPORT = (*PURE_STDLIB, "numpy", "pandas", "pydantic", "services.analysis", "services.schemas")

# --- services.schemas: a leaf ------------------------------------------------------------------------------------
SCHEMAS = "services.schemas"
SCHEMAS_MAY_IMPORT = (*PURE_STDLIB, "array", "pydantic", "pydantic_core", SCHEMAS)

# --- live hang detection: one implementation ---------------------------------------------------------------------
LIVE_JUDGE = "services.analysis.live"
LIVE_JUDGE_MAY_NOT_IMPORT = ("pandas", "services.analysis.run_data")
LIVE_STATES = (f"{LIVE_JUDGE}.LiveState", f"{LIVE_JUDGE}.RankState")
# who may name the state: storage builds it (live_batch for many runs at once, with live's code), live_tail carries a
# pruned run's part of it, derive reads it for a verdict
LIVE_STATE_IMPORTERS = ("services.storage.live", "services.storage.live_batch", "services.analysis.live_tail",
                        "services.derive.live")

# --- SQL lives in services.storage -------------------------------------------------------------------------------
SQL_LIBRARIES = ("sqlalchemy", "alembic", "psycopg")
SQL_HOME = "services.storage"
SQL_HANDLES = frozenset({
    "sqlalchemy.Engine", "sqlalchemy.Connection", "sqlalchemy.engine.Engine", "sqlalchemy.engine.Connection",
})

# --- one client of our API ---------------------------------------------------------------------------------------
API_CLIENT = "services.api_client"
API_CONSUMERS = ("dashboards", "services.cli", "services.simulate")
HTTP_CLIENTS = ("httpx", "requests", "urllib3", "urllib.request", "http.client", "aiohttp", "socket")
# A client of the API reads documents: it never loads the analysis, the server or their heavy libraries.
API_CLIENT_NEVER_REACHES = ("numpy", "pandas", "sqlalchemy", "fastapi", "services.analysis", "services.storage",
                            "services.derive", "services.collector", "dashboards")

# --- the ingest client: standard library only --------------------------------------------------------------------
CLIENT = "ingest_client"
CLIENT_LAZY_IMPORTS = ("torch",)
# Opt-in modules that exist to hook into one framework; nothing else in the client imports them.
CLIENT_INTEGRATIONS = {
    "ingest_client.integrations.dcp": ("torch",),
    "ingest_client.integrations.huggingface": ("transformers",),
    "ingest_client.integrations.lightning": ("lightning", "pytorch_lightning"),
}
CLIENT_MAY_NOT_IMPORT = ("services", "dashboards")
# Each part of the client (by where it runs): what else of the client it may import besides itself. The package's
# own __init__ (the public surface) may import any part.
CLIENT_PARTS: dict[str, tuple[str, ...]] = {
    "ingest_client.common": (),
    "ingest_client.transport": ("ingest_client.common",),
    "ingest_client.worker": ("ingest_client.common", "ingest_client.transport"),
    "ingest_client.launcher": ("ingest_client.common", "ingest_client.transport", "ingest_client.worker"),
    "ingest_client.tools": ("ingest_client.common", "ingest_client.transport", "ingest_client.worker"),
    "ingest_client.integrations": ("ingest_client.common", "ingest_client.worker"),
    "ingest_client._bootstrap": ("ingest_client.worker.bootstrap",),
}

# --- thin routes --------------------------------------------------------------------------------------------------
ROUTES = "services.collector.routes"
ROUTES_MAY_IMPORT = ("services.derive", SCHEMAS, "services.collector.deps", "services.collector.auth",
                     "services.collector.errors", "services.collector.responses", ROUTES)
ROUTES_EXCEPTIONS: dict[str, str] = {
    f"{ROUTES}.ingest": "the write path: parses, checks and hands events to storage's writer; derives nothing",
    f"{ROUTES}.metrics": "the Prometheus exposition of services.metrics, which reads runs through services.derive",
    f"{ROUTES}.health": "the probe asks the database and the writer themselves whether they answer",
}

# --- the arrows between layers -----------------------------------------------------------------------------------
# Every package (or loose module) of services, and the dashboards: what of services and dashboards it may import
# besides itself. Lower layers first; nothing imports a layer listed after it, except the collector, which mounts
# the dashboard in single-process mode.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "services.errors": (),
    "services.settings": (),
    SCHEMAS: (),
    "services.analysis": (SCHEMAS,),
    "services.presentation": (SCHEMAS,),
    "services.storage": ("services.analysis", SCHEMAS, "services.errors", "services.settings"),
    # reports: a run's report and the fleet CSV are rendered from the run as served (derive.reports)
    "services.derive": ("services.analysis", SCHEMAS, "services.storage", "services.reports", "services.errors",
                        "services.settings"),
    "services.reports": ("services.analysis", SCHEMAS, "services.presentation"),
    "services.metrics": ("services.analysis", SCHEMAS, "services.derive", "services.storage", "services.settings"),
    "services.collector": (
        "services.analysis", SCHEMAS, "services.storage", "services.derive", "services.reports", "services.metrics",
        "services.presentation", "services.errors", "services.settings", "dashboards.mount",
    ),
    API_CLIENT: (SCHEMAS, "services.errors", "services.settings"),
    "services.simulate": ("services.analysis", SCHEMAS, API_CLIENT, "services.settings"),
    # The CLI's admin commands (migrate, tokens) work on the database of the host they run on, and `serve`
    # prepares the metrics directory before it starts the collector.
    "services.cli": (  # derive: `goodput db prune` stores each run's analyses before deleting its raw rows
        "services.analysis", SCHEMAS, "services.storage", "services.derive", "services.metrics", "services.simulate",
        "services.reports",
        "services.presentation", "services.errors", "services.settings", API_CLIENT, "ingest_client",
    ),
    "dashboards": (SCHEMAS, "services.presentation", "services.errors", "services.settings", API_CLIENT),
}


@dataclass(frozen=True, slots=True)
class Import:
    """One imported name: `from a.b import c` is the target `a.b.c`, `import a.b` the target `a.b`."""

    path: Path
    line: int
    importer: str  # the importing module, e.g. services.analysis.ledger
    target: str
    lazy: bool  # inside a function body: runs only when the function does
    type_only: bool  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def _base_of(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def imports_in(source: str, path: Path, importer: str) -> Iterator[Import]:
    is_package = path.name == "__init__.py"

    def walk(node: ast.AST, lazy: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(path, child.lineno, importer, alias.name, lazy, type_only)
            elif isinstance(child, ast.ImportFrom):
                base = _base_of(child, importer, is_package)
                for alias in child.names:
                    yield Import(path, child.lineno, importer, f"{base}.{alias.name}", lazy, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for branch in child.body:
                    yield from walk(ast.Module(body=[branch], type_ignores=[]), lazy, True)
                for branch in child.orelse:
                    yield from walk(ast.Module(body=[branch], type_ignores=[]), lazy, type_only)
            else:
                inside = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from walk(child, inside, type_only)

    yield from walk(ast.parse(source, filename=str(path)), False, False)


def application_imports() -> list[Import]:
    found: list[Import] = []
    for top in APPLICATION:
        for path in sorted((ROOT / top).rglob("*.py")):
            found.extend(imports_in(path.read_text(encoding="utf-8"), path, module_name(path)))
    return found


IMPORTS = application_imports()


def is_in(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> str | None:
    """The key of MAY_IMPORT that owns a module, or None for modules outside services and dashboards."""
    for layer in MAY_IMPORT:
        if is_in(module, [layer]):
            return layer
    return None


def assert_none(violations: list[str], rule: str) -> None:
    if violations:
        pytest.fail(f"{len(violations)} import(s) break the rule: {rule}\n" + "\n".join(violations), pytrace=False)


def test_schemas_import_only_pydantic_and_the_standard_library() -> None:
    rule = f"{SCHEMAS} is a leaf: it imports only " + ", ".join(sorted(SCHEMAS_MAY_IMPORT))
    violations = [f"{imp}" for imp in IMPORTS
                  if is_in(imp.importer, [SCHEMAS]) and not is_in(imp.target, SCHEMAS_MAY_IMPORT)]
    assert_none(violations, rule)


def test_read_routes_import_only_derive_and_the_documents() -> None:
    rule = (f"{ROUTES} (but {', '.join(ROUTES_EXCEPTIONS)}) import of services and dashboards only "
            + ", ".join(ROUTES_MAY_IMPORT))
    violations = [f"{imp}" for imp in IMPORTS
                  if is_in(imp.importer, [ROUTES]) and imp.importer not in ROUTES_EXCEPTIONS
                  and is_in(imp.target, ["services", "dashboards"]) and not is_in(imp.target, ROUTES_MAY_IMPORT)]
    assert_none(violations, rule)
    assert all(module in MODULES for module in ROUTES_EXCEPTIONS)


def test_analysis_imports_no_io_no_clock_and_no_other_layer() -> None:
    rule = ("services.analysis is pure (no I/O, no clock, no other layer): it imports only "
            + ", ".join(sorted(ANALYSIS_MAY_IMPORT)))
    violations = [f"{imp}" for imp in IMPORTS
                  if is_in(imp.importer, ["services.analysis"]) and not is_in(imp.target, ANALYSIS_MAY_IMPORT)]
    assert_none(violations, rule)


def test_live_hang_detection_reads_runs_only_through_storage() -> None:
    violations = [f"{imp}: {LIVE_JUDGE} judges a LiveState and reads no events" for imp in IMPORTS
                  if is_in(imp.importer, [LIVE_JUDGE]) and is_in(imp.target, LIVE_JUDGE_MAY_NOT_IMPORT)]
    violations += [f"{imp}: only {', '.join(LIVE_STATE_IMPORTERS)} build or read a LiveState" for imp in IMPORTS
                   if imp.target in LIVE_STATES and imp.importer not in LIVE_STATE_IMPORTERS]
    assert_none(violations, "live hang detection has one implementation: services.storage.live reads the state")
    assert all(module in MODULES for module in LIVE_STATE_IMPORTERS)


def test_only_storage_speaks_sql() -> None:
    rule = (f"only {SQL_HOME} imports {', '.join(SQL_LIBRARIES)}; other modules may import only the handles "
            + ", ".join(sorted(SQL_HANDLES)) + " and pass them to storage")
    violations = [f"{imp}" for imp in IMPORTS
                  if is_in(imp.target, SQL_LIBRARIES) and not is_in(imp.importer, [SQL_HOME])
                  and imp.target not in SQL_HANDLES]
    assert_none(violations, rule)


def test_dashboards_cli_and_simulator_reach_the_server_only_through_the_api_client() -> None:
    rule = (f"{', '.join(API_CONSUMERS)} reach the server only through {API_CLIENT}: "
            f"they import no HTTP client ({', '.join(HTTP_CLIENTS)})")
    violations = [f"{imp}" for imp in IMPORTS
                  if is_in(imp.importer, API_CONSUMERS) and is_in(imp.target, HTTP_CLIENTS)]
    assert_none(violations, rule)


def _client_may_import(imp: Import) -> bool:
    if is_in(imp.target, CLIENT_MAY_NOT_IMPORT):
        return False
    root = imp.target.split(".")[0]
    if root in sys.stdlib_module_names or root == CLIENT:
        return True
    if is_in(imp.target, CLIENT_INTEGRATIONS.get(imp.importer, ())):
        return True
    return is_in(imp.target, CLIENT_LAZY_IMPORTS) and (imp.lazy or imp.type_only)


def test_ingest_client_imports_only_the_standard_library() -> None:
    rule = (f"{CLIENT} imports the standard library, {', '.join(CLIENT_LAZY_IMPORTS)} only inside a function or "
            f"for type checking, nothing of {', '.join(CLIENT_MAY_NOT_IMPORT)}; only its framework integrations "
            "import their framework (" + "; ".join(f"{m}: {', '.join(f)}" for m, f in CLIENT_INTEGRATIONS.items())
            + ")")
    violations = [f"{imp}" + (" (at module level)" if not imp.lazy and not imp.type_only else "")
                  for imp in IMPORTS if is_in(imp.importer, [CLIENT]) and not _client_may_import(imp)]
    assert_none(violations, rule)


def _client_part(module: str) -> str | None:
    return next((part for part in CLIENT_PARTS if is_in(module, [part])), None)


def test_each_part_of_ingest_client_imports_only_the_parts_listed_for_it() -> None:
    violations: list[str] = []
    for imp in IMPORTS:
        part = _client_part(imp.importer)
        if part is None or not is_in(imp.target, [CLIENT]) or is_in(imp.target, [part]):
            continue
        if imp.target == CLIENT and part == "ingest_client.integrations":
            continue  # an integration starts the tracker through the public surface, as a user's script does
        if not is_in(imp.target, CLIENT_PARTS[part]):
            violations.append(f"{imp}: {part} may import only {', '.join(CLIENT_PARTS[part]) or 'itself'}")
    assert_none(violations, "the worker never imports the launcher or the tools; each part of ingest_client imports "
                            "only the ones CLIENT_PARTS lists for it")


def test_every_part_of_ingest_client_has_a_rule() -> None:
    children = [p for p in (ROOT / CLIENT).iterdir()
                if (p.is_dir() and p.name != "__pycache__") or (p.suffix == ".py" and p.name != "__init__.py")]
    missing = sorted(f"{CLIENT}.{p.stem}" for p in children if _client_part(f"{CLIENT}.{p.stem}") is None)
    if missing:
        pytest.fail(f"add these to CLIENT_PARTS with what they may import: {', '.join(missing)}", pytrace=False)


def test_services_and_dashboards_import_only_the_layers_listed_for_them() -> None:
    violations: list[str] = []
    for imp in IMPORTS:
        layer = layer_of(imp.importer)
        if layer is None or not is_in(imp.target, ["services", "dashboards"]) or is_in(imp.target, [layer]):
            continue
        if imp.target == "services" or is_in(imp.target, MAY_IMPORT[layer]):
            continue
        violations.append(f"{imp}: {layer} may import only {', '.join(MAY_IMPORT[layer]) or 'itself'}")
    assert_none(violations, "each layer imports only the ones MAY_IMPORT lists for it")


def test_every_package_of_services_has_a_layer_rule() -> None:
    children = [p for p in (ROOT / "services").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")]
    missing = [module_name(p if p.is_file() else p / "__init__.py") for p in children]
    missing = [m for m in missing if layer_of(m) is None]
    if missing:
        pytest.fail(f"add these to MAY_IMPORT with what they may import: {', '.join(sorted(missing))}", pytrace=False)


def test_every_layer_rule_names_modules_that_exist() -> None:
    modules = {module_name(p) for top in APPLICATION for p in (ROOT / top).rglob("*.py")}
    named = {*MAY_IMPORT, *(t for targets in MAY_IMPORT.values() for t in targets), *CLIENT_INTEGRATIONS,
             *CLIENT_PARTS, *(t for targets in CLIENT_PARTS.values() for t in targets)}
    stale = sorted(n for n in named if not any(is_in(m, [n]) for m in modules))
    if stale:
        pytest.fail(f"rules name modules that do not exist (moved, renamed or not written yet): {', '.join(stale)}",
                    pytrace=False)


# --- what a module reaches through others -------------------------------------------------------------------------

MODULES = frozenset(module_name(p) for top in APPLICATION for p in (ROOT / top).rglob("*.py"))


def module_of(target: str) -> str:
    """The module an import loads: `a.b.c` is the module a.b.c, or a.b when c is a name in it; outside the
    application, the top-level package (what the reach rules name)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return parts[0]


def parents(module: str) -> list[str]:
    """The packages Python imports before a module: a.b.c loads a and a.b first."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def eager_graph() -> dict[str, set[str]]:
    """Module -> the modules importing it loads at once (module level: not inside a function, not for type
    checking), parent packages included."""
    graph: dict[str, set[str]] = {m: {p for p in parents(m) if p in MODULES} for m in MODULES}
    for imp in IMPORTS:
        if imp.lazy or imp.type_only:
            continue
        target = module_of(imp.target)
        if target != imp.importer:
            graph[imp.importer].update(p for p in (*parents(target), target) if p in MODULES or p == target)
    return graph


def reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module that importing `start` loads, each with the module that first imported it."""
    seen: dict[str, str] = {start: ""}
    todo = [start]
    while todo:
        here = todo.pop()
        for there in sorted(graph.get(here, ())):
            if there not in seen:
                seen[there] = here
                todo.append(there)
    return seen


def path_to(seen: dict[str, str], module: str) -> str:
    chain = [module]
    while seen[chain[-1]]:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


def test_the_api_client_reaches_no_analysis_no_server_and_no_numpy_or_pandas() -> None:
    seen = reach(eager_graph(), API_CLIENT)
    violations = [path_to(seen, m) for m in sorted(seen) if is_in(m, API_CLIENT_NEVER_REACHES)]
    assert_none(violations, f"importing {API_CLIENT} loads none of {', '.join(API_CLIENT_NEVER_REACHES)}")
    assert SCHEMAS + ".ledger" in seen  # the walk follows the client's imports into the documents


def test_importing_the_api_client_loads_no_analysis_no_server_and_no_numpy_or_pandas() -> None:
    code = f"import sys, {API_CLIENT}; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert API_CLIENT in loaded and "pydantic" in loaded
    found = [m for m in loaded if is_in(m, API_CLIENT_NEVER_REACHES)]
    assert not found, f"importing {API_CLIENT} loaded {', '.join(found)}"


def import_cycles(imports: Iterable[Import], packages: Iterable[str]) -> list[list[str]]:
    """The circles among the modules of `packages` (module-level imports, type-only ones included): each strongly
    connected component of more than one module, sorted."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES if is_in(m, packages)}
    for imp in imports:
        if imp.lazy or imp.importer not in graph:
            continue
        target = module_of(imp.target)
        if target in graph and target != imp.importer:
            graph[imp.importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for there in graph[module]:
            if there not in index:
                connect(there)
                low[module] = min(low[module], low[there])
            elif there in stack:
                low[module] = min(low[module], index[there])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(cycles)


@pytest.mark.parametrize("package", ["services", "ingest_client"])
def test_no_import_circle(package: str) -> None:
    cycles = import_cycles(IMPORTS, [package])
    assert_none([" <-> ".join(c) for c in cycles], f"no import circle among the modules of {package}")


def test_the_circle_finder_finds_the_circle_the_analysis_had_and_only_through_module_level_imports() -> None:
    def edge(importer: str, target: str, *, lazy: bool = False, type_only: bool = False) -> Import:
        return Import(ROOT, 1, f"services.analysis.{importer}", f"services.analysis.{target}", lazy, type_only)

    circle = [edge("attempts", "run_data.RunData"), edge("run_data", "step_blocks.StepBlock"),
              edge("step_blocks", "rank_sketch.RankSketch", type_only=True), edge("rank_sketch", "stragglers"),
              edge("stragglers", "attempts.RunStructure"), edge("ledger", "attempts")]
    assert import_cycles(circle, ["services"]) == [[f"services.analysis.{m}" for m in
                                                    ("attempts", "rank_sketch", "run_data", "step_blocks",
                                                     "stragglers")]]
    lazy = [*circle[:-2], edge("stragglers", "attempts", lazy=True)]
    assert import_cycles(lazy, ["services"]) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import os", [("os", False, False)]),
    ("from . import ledger", [("services.analysis.ledger", False, False)]),
    ("from ..storage.db import make_engine", [("services.storage.db.make_engine", False, False)]),
    ("def f():\n    import torch", [("torch", True, False)]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sqlalchemy import Engine",
     [("typing.TYPE_CHECKING", False, False), ("sqlalchemy.Engine", False, True)]),
    ("try:\n    import httpx\nexcept ImportError:\n    httpx = None", [("httpx", False, False)]),
])
def test_the_reader_resolves_relative_lazy_and_type_only_imports(
        source: str, expected: list[tuple[str, bool, bool]]) -> None:
    path = ROOT / "services" / "analysis" / "views.py"
    found = [(i.target, i.lazy, i.type_only) for i in imports_in(source, path, module_name(path))]
    assert found == expected


def test_the_reader_sees_the_imports_the_rules_are_about() -> None:
    targets = {imp.target.split(".")[0] for imp in IMPORTS}
    assert {"numpy", "pandas", "sqlalchemy", "fastapi", "dash"} <= targets
    assert any(is_in(imp.importer, ["services.analysis"]) for imp in IMPORTS)
