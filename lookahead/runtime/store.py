"""Small measurements kept on disk between processes, as numba keeps its compiled kernels: a new process reuses what
an earlier one measured on this machine (the verification cost curve of `draft_cost="auto"`, the row counts at
which packed linear weights are faster) instead of timing forwards again.

A value is stored under a kind and a key (JSON) that names everything it depends on (the layers' shapes or the
model's config, device, CPU, dtype, threads, torch's version, `FORMAT`). The file holds the key itself, and a value
is returned only when the whole key read back equals the one asked for: a value measured for another model, thread
count or machine is never used (at worst it is measured again). The folder is ``$XDG_CACHE_HOME/lookahead``
(``~/.cache/lookahead`` without it); delete it to measure again. An unreadable or unwritable folder only means
measuring again; ``Store(None)`` keeps nothing.

Example::

    store = Store.default()
    rows = store.get("linear-rows", key)       # None the first time
    if rows is None:
        rows = measure()
        store.put("linear-rows", key, rows)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
FORMAT = 1  # bumped when what a stored value means changes


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/lookahead``, else ``~/.cache/lookahead``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "lookahead"


def machine() -> dict:
    """What a timing depends on besides the caller's key: the CPU, and the format of stored values."""
    return {"cpu": _cpu_name(), "format": FORMAT}


class Store:
    """JSON values in a folder, one file per (kind, key); ``Store(None)`` keeps nothing.

    Args:
        folder: where the files go (made on the first `put`), or None.
    """

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = None if folder is None else Path(folder)

    @classmethod
    def default(cls) -> "Store":
        """The store in `cache_folder` (read from the environment now, not at import)."""
        return cls(cache_folder())

    def get(self, kind: str, key: dict):
        """The value stored under exactly (`kind`, `key`), or None (nothing stored, another key, an unreadable file)."""
        if self.folder is None:
            return None
        path = self._path(kind, key)
        try:
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
            return stored["value"] if stored.get("key") == key else None
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            logger.info("lookahead: ignoring %s: %s", path, error)
            return None

    def put(self, kind: str, key: dict, value) -> None:
        """Store `value` under (`kind`, `key`), atomically (a reader sees the old file or the new one); a failure is
        logged, not raised."""
        if self.folder is None:
            return
        path = self._path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
                json.dump({"key": key, "value": value}, f)
            os.replace(f.name, path)
        except OSError as error:
            logger.info("lookahead: could not keep %s in %s: %s", kind, self.folder, error)

    def _path(self, kind: str, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return self.folder / kind / f"{digest}.json"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()
