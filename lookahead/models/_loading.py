"""What loading a model or tokenizer through transformers shares, whatever the source (a folder, a hub id, a GGUF
file): transformers' own progress bars kept quiet, and an error's first line for a one-line message."""
from __future__ import annotations

import contextlib


def quiet_from_pretrained(auto: str, name: str, **kwargs):
    """``transformers.<auto>.from_pretrained(name, **kwargs)`` without transformers' progress bars (a "Loading
    weights" bar per load clutters the job's own output)."""
    import transformers

    with no_progress_bars():
        return getattr(transformers, auto).from_pretrained(name, **kwargs)


@contextlib.contextmanager
def no_progress_bars():
    """Inside the block transformers shows no progress bars; their state is restored after."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def first_line(error: Exception) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0].rstrip(" :") if text else type(error).__name__
