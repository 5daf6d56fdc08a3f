"""Code-edit traces from the edit history of a git repository: each commit's old file is the prompt, its new file the
output (what a model asked to "return the whole edited file" would write). Works on any machine with git.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np


def git_traces(repo=".", tokenizer=None, max_commits: int = 200, max_bytes: int = 64_000,
               max_traces: int | None = None) -> list:
    """``(prompt_ids, output_ids)`` for every text file modified by the last ``max_commits`` non-merge commits.

    Args:
        repo: a folder inside the repository.
        tokenizer: ``encode(text) -> ids`` (default: UTF-8 bytes, see ``traces_io.load_tokenizer``).
        max_commits: commits to read, newest first.
        max_bytes: files larger than this (before or after) are skipped; so are binary files, files that are not
            UTF-8 and edits that leave a file unchanged.
        max_traces: stop after this many traces (None: no limit).
    Returns:
        a list of int64 ``(prompt_ids, output_ids)`` pairs, newest edit first, without duplicates.
    Raises:
        ValueError: ``repo`` is not in a git repository, or git is missing.

    Example::

        traces = git_traces(".", load_tokenizer("../shared/data/tokenizers/gpt2"), max_commits=50)
    """
    from .traces_io import ByteTokenizer

    tokenizer = tokenizer or ByteTokenizer()
    pairs, seen = [], set()
    for old, new in _modified_blobs(Path(repo), max_commits):
        if (old, new) not in seen:
            seen.add((old, new))
            pairs.append((old, new))
    texts = _read_blobs(Path(repo), [sha for pair in pairs for sha in pair], max_bytes)
    traces = []
    for old, new in pairs:
        before, after = texts.get(old), texts.get(new)
        if before is None or after is None or before == after or not after:
            continue
        traces.append((np.asarray(tokenizer.encode(before), np.int64), np.asarray(tokenizer.encode(after), np.int64)))
        if max_traces is not None and len(traces) >= max_traces:
            break
    return traces


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=False)
    except FileNotFoundError:
        raise ValueError("git is not installed: cannot build traces from a repository's history") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(f"{repo}: git {args[0]} failed: {message[0] if message else done.returncode}")
    return done.stdout


def _modified_blobs(repo: Path, max_commits: int) -> list:
    """(old blob, new blob) of each file modified in place by the recent non-merge commits, newest first."""
    if not repo.is_dir():
        raise ValueError(f"{repo}: not a folder")
    try:
        _git(repo, "rev-parse", "--git-dir")
    except ValueError:
        raise ValueError(f"{repo}: not a git repository") from None
    log = _git(repo, "log", "--no-merges", f"--max-count={max_commits}", "--format=%H").decode().split()
    blobs = []
    for commit in log:
        raw = _git(repo, "diff-tree", "-r", "--no-commit-id", "--diff-filter=M", "--raw", commit).decode()
        for line in raw.splitlines():
            meta = line.split("\t", 1)[0].split()  # :100644 100644 <old> <new> M
            if len(meta) >= 5 and meta[0].startswith(":100") and meta[1].startswith("100"):
                blobs.append((meta[2], meta[3]))
    return blobs


def _read_blobs(repo: Path, shas: list, max_bytes: int) -> dict:
    """Text of each blob no larger than max_bytes that is UTF-8 without NUL bytes, in one `git cat-file` call."""
    if not shas:
        return {}
    out = _git(repo, "cat-file", "--batch", stdin="\n".join(shas).encode() + b"\n")
    texts, pos = {}, 0
    while pos < len(out):
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        if len(header) < 3:  # "<sha> missing"
            pos = end + 1
            continue
        size = int(header[2])
        body = out[end + 1:end + 1 + size]
        pos = end + 1 + size + 1
        if size <= max_bytes and b"\0" not in body:
            try:
                texts[header[0].decode()] = body.decode("utf-8")
            except UnicodeDecodeError:
                pass
    return texts
