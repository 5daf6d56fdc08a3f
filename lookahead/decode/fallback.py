"""What `lookahead.generate` runs for a model whose layers it cannot yet decode exactly with drafts (recurrent layers
it does not follow, a layer kind it does not know, a cache class of the model's own): `model.generate`'s own
decoding with the same arguments, so the call still gives what `model.generate` gives. It is said, never silent: a
`FallbackWarning` names the reason, and the call's `GenerationStats.fallback` holds it (one forward per token: no
speedup). Options asked for by name that lookahead would refuse on a model it follows (a tree over recurrent layers,
...) still raise; the server refuses such a model when it starts (`serve.engine.check_servable`).

And what it runs for a batch whose rows cannot share one cache on the model (compressed attention, ALiBi or local
windows built from cache slots, recurrent states beside a window cut by slot): each row alone, its padding dropped,
one after another (`one_row_at_a_time`): each row's tokens are what `model.generate` gives that row alone, drafted as
a batch of one; said by a `RowsApartWarning` and `GenerationStats.rows_apart`. The server steps each such request
in a batch of its own (`serve.engine.Batch`).
"""
from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np
import torch

from ..model.static import prompt_sources
from .loop import token_ids


class FallbackWarning(UserWarning):
    """`lookahead.generate` ran `model.generate`'s own decoding: no drafts were verified (`GenerationStats.fallback`
    says why)."""


class RowsApartWarning(UserWarning):
    """`lookahead.generate` ran a batch's rows one after another, each alone (`GenerationStats.rows_apart` says
    why): each row drafted and exact, the batch not verified in shared forwards."""


def one_row_at_a_time(run_row, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings, reason: str,
                      pad: int) -> torch.Tensor:
    """A left-padded batch input_ids [b, P] (`attention_mask`) generated a row at a time: `run_row(ids [1, L],
    documents)` generates one row's prompt without its padding (with its documents): (its output [1, L + new], its
    `GenerationStats`). Returns [b, P + longest new] as `model.generate` lays a batch out: each row's padded prompt,
    its new tokens, then `pad`; `settings.stats` holds the rows' counters together."""
    warnings.warn(f"lookahead: {reason}, so the batch's {len(input_ids)} rows ran one after another, each alone (its "
                  f"tokens exact, its drafts verified as a batch of one; GenerationStats.rows_apart holds this "
                  f"reason)", RowsApartWarning, stacklevel=3)
    documents, total = settings.documents, settings.stats
    news = []
    for i, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
        docs = None if documents is None else list(documents[i if len(documents) > 1 else 0])
        out, stats = run_row(ids[mask.bool()][None], docs)
        news.append(out[0, int(mask.sum()):])
        total.merge(stats)
    total.rows_apart = reason
    longest = max(len(new) for new in news)
    out = input_ids.new_full((len(input_ids), input_ids.shape[1] + longest), pad)
    out[:, :input_ids.shape[1]] = input_ids
    for i, new in enumerate(news):
        out[i, input_ids.shape[1]:input_ids.shape[1] + len(new)] = new
    return out


def plain_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, kwargs: dict, settings, reason: str):
    """`model.generate(input_ids, attention_mask=..., **kwargs)` for a lookahead call (`settings`: its streamer,
    generator, memory and stats) that cannot draft on this model because of `reason`; its output, with the stats
    filled as lookahead's loop fills them (each row one forward per new token)."""
    warnings.warn(f"lookahead: {reason}. Ran model.generate's own decoding instead: the same tokens, one forward per "
                  f"token, no speedup (GenerationStats.fallback holds this reason)", FallbackWarning, stacklevel=3)
    stats = settings.stats
    stats.fallback = reason
    if settings.streamer is not None:
        kwargs["streamer"] = settings.streamer
    if settings.eos == ():  # eos_token_id=[]: no token ends a row
        config = kwargs.get("generation_config") or model.generation_config
        kwargs["generation_config"] = config.__class__.from_dict({**config.to_dict(), "eos_token_id": None})
    start = time.perf_counter()
    with _seeded(settings.generator, input_ids.device):
        out = model.generate(input_ids, attention_mask=attention_mask, **kwargs)
    stats.seconds["total"] = stats.seconds.get("total", 0.0) + time.perf_counter() - start
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    new = sequences[:, input_ids.shape[1]:].cpu().numpy()
    eos = _eos(settings.eos, kwargs.get("generation_config") or model.generation_config, kwargs)
    counts = [_length(row, eos) for row in new]
    stats.new_tokens_by_row, stats.forwards_by_row = counts, list(counts)
    stats.new_tokens = stats.row_forwards = sum(counts)
    stats.forward_passes = max(counts, default=0)
    if settings.memory is not None:
        for prompt, row, n in zip(prompt_sources(input_ids, attention_mask), new, counts):
            settings.memory.add_tokens(np.concatenate([prompt.cpu().numpy(), row[:n]]))
    if not isinstance(out, torch.Tensor):
        out["lookahead_stats"] = stats
    return out


@contextlib.contextmanager
def _seeded(generator, device: torch.device):
    """Within: torch's global generator (the one `model.generate` samples from) seeded from lookahead's `generator`
    (an int seed or a torch.Generator's state), restored on exit; nothing when generator is None."""
    if generator is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        if isinstance(generator, torch.Generator):
            if generator.device.type == "cuda":
                torch.cuda.set_rng_state(generator.get_state(), generator.device)
            else:
                torch.set_rng_state(generator.get_state())
        else:
            torch.manual_seed(int(generator))
        yield


def _eos(override, config, kwargs: dict) -> set:
    """The ids that end a row: lookahead's eos_token_id, else the one passed, else the generation config's."""
    ids = override if override is not None else kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    return set(token_ids(ids))


def _length(row: np.ndarray, eos: set) -> int:
    """New tokens of a generated row: up to and with its first eos (the rest is padding), else all of them."""
    for i, token in enumerate(row):
        if int(token) in eos:
            return i + 1
    return len(row)
