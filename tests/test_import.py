"""Importing lookahead: the index without torch, and the public names whatever was imported first."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_the_index_and_memory_import_without_torch_or_transformers():
    """`import lookahead.index` needs numpy and numba only (torch and transformers take seconds to import)."""
    run_python("import sys, lookahead.index, lookahead.index.memory\n"
               "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
               "assert not heavy, heavy[:5]")


@pytest.mark.parametrize("first", ["lookahead.plugin", "lookahead.generate", "lookahead.index"])
def test_public_names_are_the_functions_whatever_was_imported_first(first):
    """`generate` and `plugin` are also submodule names: importing the submodule first must not hide the function."""
    run_python(f"import {first}\nimport lookahead\nfrom lookahead import generate, plugin\n"
               "assert callable(generate) and generate.__module__ == 'lookahead.generate'\n"
               "assert callable(plugin) and lookahead.plugin is plugin and lookahead.generate is generate\n"
               "assert all(getattr(lookahead, name) for name in lookahead.__all__)\n"
               "assert set(lookahead.__all__) <= set(dir(lookahead))")


def test_unknown_names_raise_attribute_error():
    import lookahead

    with pytest.raises(AttributeError, match="module 'lookahead' has no attribute 'generat'"):
        lookahead.generat  # noqa: B018
