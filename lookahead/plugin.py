"""lookahead as a drop-in for `model.generate` and for pipelines.

    model.generate(input_ids, custom_generate=lookahead.custom_generate, max_ngram=4, max_new_tokens=128)
    pipe = transformers.pipeline("text-generation", model=m, tokenizer=tok, custom_generate=lookahead.custom_generate)
    pipe = lookahead.pipeline("summarization", model=bart, tokenizer=tok)       # the same, as a helper

transformers calls a callable `custom_generate` as the decoding loop after preparing everything else (generation
config, logits processors, stopping criteria, encoder outputs), so every other argument keeps its meaning.
"""
from __future__ import annotations

import functools

from .generate import decode
from .decode.settings import OPTIONS, make_settings


def custom_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, *,
                    lookup=OPTIONS["lookup"], max_ngram=OPTIONS["max_ngram"], min_ngram=OPTIONS["min_ngram"],
                    num_draft_tokens=None, draft_cost=None, draft=OPTIONS["draft"],
                    max_draft_nodes=None, memory=None, documents=None, tokenizer=None, generator=None, streamer=None,
                    inputs_tensor=None, **model_kwargs):
    """The lookahead decoding loop in the form `model.generate(custom_generate=...)` calls.

    Lookahead's own options (`lookup`, `max_ngram`, `min_ngram`, `num_draft_tokens`, `draft_cost`, `draft`,
    `max_draft_nodes`, `memory`, `documents`, `generator`; see `lookahead.generate`) are passed to `model.generate`
    next to the usual ones. transformers hands a custom loop neither `tokenizer=` nor `streamer=` nor
    `assistant_model=` (it keeps them for its own loops; pinned by tests/test_plugin.py): bind the first two with
    `lookahead.plugin(tokenizer=tok, streamer=s)`. With return_dict_in_generate=True the output has
    `lookahead_stats`.

    Returns:
        What `model.generate` returns: sequences [B, L + new], or its output class with return_dict_in_generate.

    Raises:
        ValueError: an argument lookahead cannot honour (num_beams > 1, ...), named in the message.

    Example:
        >>> model.generate(ids, custom_generate=lookahead.custom_generate, max_ngram=3, max_new_tokens=64)
    """
    settings = make_settings(lookup=lookup, max_ngram=max_ngram, min_ngram=min_ngram, num_draft_tokens=num_draft_tokens,
                             draft_cost=draft_cost, draft=draft, max_draft_nodes=max_draft_nodes, memory=memory,
                             documents=documents, tokenizer=tokenizer, generator=generator, streamer=streamer)
    return decode(model, input_ids, logits_processor, stopping_criteria, generation_config, lookahead=settings,
                  inputs_tensor=inputs_tensor, **model_kwargs)


def plugin(**options):
    """`custom_generate` with lookahead options bound (those transformers would not pass on: `tokenizer`, `streamer`).

    Raises:
        TypeError, ValueError: an unknown option or a bad value, named (here, not at the first generate call).

    Example:
        >>> model.generate(ids, custom_generate=lookahead.plugin(tokenizer=tok, documents=passages))
    """
    make_settings(**options)  # fail here, not at the first generate call
    return functools.partial(custom_generate, **options)


def pipeline(task: str, model=None, tokenizer=None, **kwargs):
    """A transformers pipeline whose generation runs through lookahead: one line instead of `pipeline(...)`.

    Generation and lookahead options (`max_new_tokens`, `max_ngram`, ...) go in `kwargs` or in each call, as with
    any pipeline. transformers 5 removed the "summarization" task; for it this returns a `Summarization` pipeline.

    Example:
        >>> summarize = lookahead.pipeline("summarization", model=bart, tokenizer=tok)
        >>> summarize(article, max_new_tokens=60)[0]["summary_text"]
    """
    from transformers import pipeline as hf_pipeline
    from transformers.pipelines import SUPPORTED_TASKS

    kwargs.setdefault("custom_generate", plugin(tokenizer=tokenizer) if hasattr(tokenizer, "decode") else
                      custom_generate)
    if task == "summarization" and task not in SUPPORTED_TASKS:
        return Summarization(model, tokenizer, **kwargs)
    return hf_pipeline(task, model=model, tokenizer=tokenizer, **kwargs)


class Summarization:
    """transformers 4's `pipeline("summarization")` for transformers 5: text in, `[{"summary_text": ...}]` out.

    Each text is encoded (truncated to the model's input limit), generated from and decoded, one at a time, as the
    transformers pipeline does by default. Keyword arguments of the constructor and of each call go to
    `model.generate`; `custom_generate=None` gives the plain transformers loop (the baseline).

    Example:
        >>> Summarization(bart, tok, custom_generate=lookahead.custom_generate)(article, max_new_tokens=60)
    """

    def __init__(self, model, tokenizer, **generate_kwargs):
        self.model, self.tokenizer, self.generate_kwargs = model, tokenizer, generate_kwargs
        limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
        self.max_input = min(n for n in limits + [1 << 20] if isinstance(n, int) and n > 0)

    def __call__(self, texts, **generate_kwargs) -> list:
        texts = [texts] if isinstance(texts, str) else list(texts)
        kwargs = {**self.generate_kwargs, **generate_kwargs}
        if kwargs.get("custom_generate", 0) is None:
            kwargs.pop("custom_generate")
        return [{"summary_text": self._one(text, kwargs)} for text in texts]

    def _one(self, text: str, kwargs: dict) -> str:
        enc = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=self.max_input)
        out = self.model.generate(**enc.to(self.model.device), **kwargs)
        return self.tokenizer.decode(out[0], skip_special_tokens=True)
