"""The package's rooms import only the rooms below them (docs/architecture.md): no circle, no arrow upwards."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lookahead"

# room -> the rooms it may import (docs/architecture.md, "Rooms")
ALLOWED = {
    "_checks": set(), "_lazy": set(), "runtime": set(), "arguments": set(), "models": {"runtime"},
    "index": {"_checks", "runtime"},
    "verify": {"index", "runtime"},
    "model": {"_checks", "runtime", "verify"},
    "decode": {"_checks", "runtime", "index", "verify", "model"},
    "_validate": {"_checks", "model"},
    "generate": {"_checks", "runtime", "_validate", "index", "verify", "model", "decode"},
    "warm": {"_checks", "runtime", "generate", "models", "serve", "decode"},
    "plugin": {"generate", "decode"},
    "demo": {"generate", "models", "runtime"},
    "job": {"_checks", "_lazy", "arguments", "generate", "index", "models", "runtime"},
    "bench": {"_checks", "_lazy", "arguments", "index", "verify", "model", "decode", "generate", "models", "runtime"},
    "serve": {"_checks", "runtime", "arguments", "index", "verify", "model", "decode", "models"},
    "cli": {"runtime", "arguments", "demo", "job", "bench", "serve", "models", "warm"},
    "__main__": {"cli"},
    "__init__": {"_lazy"},  # imports its public names lazily, by name (`_SOURCES`, `_lazy.lazy`)
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set:
    """The rooms of lookahead that the module at `path` imports (at any depth of the file)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            names = [".".join(base + [node.module])] if node.module else [".".join(base + [a.name]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        rooms |= {_room(n) for n in names if n.startswith("lookahead.")}
    return rooms


def test_every_room_imports_only_the_rooms_below_it():
    """Each module's imports of other rooms are among its room's allowed ones; every room is listed."""
    for path in sorted(PACKAGE.rglob("*.py")):
        room = _room(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        assert room in ALLOWED, f"{path.relative_to(PACKAGE.parent)}: room {room!r} is not in docs/architecture.md"
        wrong = _imports(path) - ALLOWED[room] - {room}
        assert not wrong, f"{path.relative_to(PACKAGE.parent)} ({room}) imports {sorted(wrong)}"


def test_the_allowed_imports_have_no_circle():
    """The allowed arrows form layers: following them never comes back to where it started."""
    def below(room, seen=()):
        assert room not in seen, f"circle: {' -> '.join(seen + (room,))}"
        for lower in ALLOWED[room]:
            below(lower, seen + (room,))

    for room in ALLOWED:
        below(room)


def _module_imports() -> dict:
    """module -> the lookahead modules it imports, at any depth of its file (a name imported from a package counts
    as that submodule where there is one)."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)] = path
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in paths else module for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def test_no_module_imports_itself_through_others():
    """Within rooms too, following imports never comes back to the module it started from."""
    graph = _module_imports()
    done: set = set()

    def visit(module, path):
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + (module,))}"
        if module in done:
            return
        for other in sorted(graph[module]):
            visit(other, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_the_top_of_the_package_holds_at_most_ten_modules():
    """The package's top level stays a screen: entry points and a few helpers; everything else lives in a room."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
