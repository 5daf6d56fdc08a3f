"""Names a package imports on first use (PEP 562), so that importing it loads nothing heavy: one `lazy` for the
package itself, `job` and `bench`, whose parsers must not load torch."""
import importlib
import sys


def lazy(package: str, sources: dict) -> tuple:
    """(`__getattr__`, `__dir__`) for the module `package`: each name of `sources` (name -> the module defining it,
    relative to the package) is imported when first read, then kept in the module.

    Example:
        >>> __getattr__, __dir__ = lazy(__name__, {"run": ".driver"})
    """

    def __getattr__(name: str):
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(sources))

    return __getattr__, __dir__
