"""The package's rooms import only the rooms below them (docs/architecture.md): no circle, no arrow upwards."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lookahead"

# room -> the rooms it may import (docs/architecture.md, "Rooms")
ALLOWED = {
    "_checks": set(), "_lazy": set(), "_store": set(), "_jit": set(), "arguments": set(), "models": set(),
    "threads": set(), "demo_article": set(),
    "index": {"_checks", "_jit"},
    "verify": {"index", "_jit"},
    "model": {"_checks", "_store", "_jit", "verify"},
    "decode": {"_checks", "_store", "_jit", "threads", "index", "verify", "model"},
    "_validate": {"_checks", "model"},
    "generate": {"_checks", "_jit", "_validate", "index", "verify", "model", "decode"},
    "_warm": {"_jit", "generate", "models", "serve"},
    "plugin": {"generate", "decode"},
    "demo": {"generate", "models", "threads", "demo_article"},
    "job": {"_checks", "_lazy", "arguments", "generate", "index", "models", "threads"},
    "bench": {"_checks", "_lazy", "arguments", "index", "verify", "model", "decode", "generate", "models", "threads"},
    "serve": {"_checks", "_jit", "arguments", "index", "verify", "model", "decode", "models"},
    "cli": {"_jit", "arguments", "demo", "job", "bench", "serve", "models"},
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
