"""Structure of the package: layers, no import cycles, small modules (pure AST reads, no
imports)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "medray"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The medray module an imported name lives in (`medray.a.b.func` -> `medray.a.b`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every medray module `module` imports, at the top or inside a function: a deferred
    import still ties the two modules together."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for name in names:
            target = _resolve(name, known)
            # `from medray.x import y` imports medray.x's package __init__ too, but that is
            # Python's loading order, not a dependency the code chose: count the module.
            if target and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_deferred_imports():
    graph = import_graph()
    assert "medray.io" in graph["medray.train.trainer"]  # imported inside a function


def test_no_import_cycle_in_medray():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The package's layers, bottom first: a room imports only rooms on its own level or below
# (docs/architecture.md draws the same order). Rooms are the top-level packages and the
# base modules; `medray.serve_app` is the Serve app's old import path, kept for users'
# Serve YAML files, and `medray.__main__` is `python -m medray`.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("medray", "config", "io", "text", "cluster", "console", "tracking"),
    ("data",),
    ("prompts",),
    ("models",),
    ("engines",),
    ("train", "eval", "serve", "serve_app"),
    ("tune", "demo"),
    ("cli", "__main__"),
)
LEVEL = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def room(module: str) -> str:
    """The room a module lives in: `medray.eval.metrics.mcq` -> `eval`, `medray` -> `medray`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) != room(module))
    return rooms


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """"a -> b" for every import of a module in a higher layer than the importer's."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  for target in targets if LEVEL[room(target)] > LEVEL[room(module)])


def test_layer_check_finds_an_upward_import():
    graph = {"medray.data.render": {"medray.eval.mcq"}, "medray.eval.mcq": {"medray.data.schema"},
             "medray.data.schema": set()}
    assert layer_violations(graph) == ["medray.data.render -> medray.eval.mcq"]
    assert find_cycle(room_graph({"medray.train.a": {"medray.eval.b"},
                                  "medray.eval.b": {"medray.train.c"}})) is not None


def test_every_room_has_a_layer():
    missing = sorted({room(m) for m in import_graph()} - set(LEVEL))
    assert not missing, f"rooms without a layer (add them to LAYERS): {missing}"


def test_no_room_imports_a_higher_layer():
    """Deferred (function-level) imports count: they tie the rooms together all the same."""
    bad = layer_violations(import_graph())
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_rooms_form_no_cycle():
    """Peers on one level (train, eval, serve; tune, demo) may import each other one way."""
    cycle = find_cycle(room_graph(import_graph()))
    assert cycle is None, "rooms import each other: " + " -> ".join(cycle)


RAY_PRIVATE = re.compile(r"ray\.llm\._internal|ray\._private")
RAY_ADAPTER = "medray.serve.ray_internal"


def test_ray_private_apis_are_used_in_one_module():
    """Ray's private modules move between releases: one adapter uses them, and it names the
    Ray version it was checked against, the one pyproject.toml pins."""
    users = sorted(name for name, path in _modules().items()
                   if RAY_PRIVATE.search(path.read_text()))
    assert users == [RAY_ADAPTER], f"Ray's private APIs used outside {RAY_ADAPTER}: {users}"
    checked = re.search(r'RAY_VERSION_CHECKED = "([^"]+)"', _modules()[RAY_ADAPTER].read_text())
    pinned = re.search(r'"ray\[[^\]]*\]==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert checked and pinned and checked.group(1) == pinned.group(1), (
        f"{RAY_ADAPTER} was checked against Ray {checked and checked.group(1)}; "
        f"pyproject.toml pins {pinned and pinned.group(1)}: re-check it")


def test_every_module_is_small():
    lines = {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    big = sorted(f"{p.relative_to(ROOT)}: {n} lines" for p, n in lines.items() if n > MAX_LINES)
    assert not big, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(big)


# Entry points that may join Ray: the command line, the Ray helper itself, and the demo
# (a program of its own: its Ray has a dashboard and hosts its Serve apps).
RAY_ENTRY_POINTS = ("medray.cli", "medray.cluster", "medray.demo")


def test_ray_is_joined_only_at_entry_points():
    """Library code runs on the Ray its entry point joined (cluster.require_connected),
    so the entry point's resource floor applies; it never calls ray.init or connect."""
    offenders = []
    for name, path in _modules().items():
        if name.startswith(RAY_ENTRY_POINTS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "medray.cluster" and any(
                    alias.name == "connect" for alias in node.names):
                offenders.append(f"{name}:{node.lineno} imports connect")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "init" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "ray"):
                offenders.append(f"{name}:{node.lineno} calls ray.init")
    assert not offenders, "Ray joined outside an entry point:\n" + "\n".join(offenders)
