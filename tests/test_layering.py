"""The package's shape as its architecture draws it: imports point down the layers, modules import without
cycles, plugins use the public API only, no module grows into a god file and no function past a screen.

Imports are read from the source (ast). For the layers, every one of them: a lazy import inside a
function is a dependency all the same. For cycles, the module-level ones: those are what makes
importing a module fail; a lazy import inside a function runs after both modules are loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tessera_rw"
# The layer table: algebra → rules → lower → codegen → tune → the top level (API, CLI)
LAYERS = {"support": 0, "algebra": 1, "rules": 2, "lower": 3, "codegen": 4, "tune": 5}
TOP = 6
PUBLIC_MODULES = {"tessera_rw", "tessera_rw.op", "tessera_rw.plugin", "tessera_rw.numerics", "tessera_rw.graph"}
MAX_LINES = 400          # "where a file grows past ~400 lines, it is two concepts"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def imports(path: Path, *, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for each tessera_rw import in the file; module_level_only skips those
    inside functions and under `if TYPE_CHECKING:` (the ones that run while the module imports)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    nodes = _module_level(tree.body) if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                found.append((node.lineno, node.module or ""))
    if not module_level_only:      # importlib.import_module("tessera_rw...") with a literal (or f-string) target
        found += [(node.lineno, _literal_prefix(node.args[0])) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) ==
                  "import_module" and node.args and _literal_prefix(node.args[0])]
    return [(line, name) for line, name in found if name.split(".")[0] == "tessera_rw"]


def _literal_prefix(arg: ast.expr) -> str:
    """The module an import_module call names: a string literal, or an f-string's leading text up to
    its last dot ("tessera_rw.codegen.templates.{module}" -> tessera_rw.codegen.templates)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rpartition(".")[0]
    return ""


def _module_level(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody)


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_layer_table_covers_every_package():
    # every folder of modules, a namespace package (no __init__.py) as much as any
    packages = {p.parent.relative_to(PACKAGE).parts[0] for p in SOURCES if p.parent != PACKAGE}
    assert packages - {"cli"} <= set(LAYERS), "a new package needs a row in LAYERS"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_layers(path):
    here = layer(module_name(path))
    upward = [f"line {line}: {name} (layer {layer(name)})" for line, name in imports(path) if layer(name) > here]
    assert not upward, f"{module_name(path)} (layer {here}) imports up: {upward}"


def test_modules_import_without_cycles():
    graph = {module_name(p): set() for p in SOURCES}
    for path in SOURCES:
        for _, name in imports(path, module_level_only=True):
            # `from tessera_rw.x import y` may name a module y or a symbol of x: keep whichever exists
            target = name if name in graph else name.rpartition(".")[0]
            if target in graph and target != module_name(path):
                graph[module_name(path)].add(target)
    # a package's __init__ importing its own modules is how packages are built; not a cycle
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(t):] + [m, t]))
            if t not in state:
                visit(t, trail + [m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])


PLUGIN_SOURCES = sorted(p for p in (ROOT / "plugins").rglob("*.py") if "build" not in p.relative_to(ROOT).parts)


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_use_the_public_api_only(path):
    private = [f"line {line}: {name}" for line, name in imports(path) if name not in PUBLIC_MODULES]
    assert not private, f"{path.name} reaches past the public API: {private}"


# the package, and the tests, benchmarks and plugins beside it
ALL_SOURCES = SOURCES + sorted(p for folder in ("tests", "bench") for p in (ROOT / folder).rglob("*.py")) + PLUGIN_SOURCES


@pytest.mark.parametrize("path", ALL_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_a_god_file(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module_name(path)} has {lines} lines: split it along the concept it mixes"


MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_outgrows_a_screen(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module_name(path)}: split {', '.join(long)} into helpers named for what they do"
