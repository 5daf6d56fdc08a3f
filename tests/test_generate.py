"""Losslessness: greedy lookahead.generate equals model.generate(do_sample=False) token for token."""
import pytest
import torch

from lookahead import generate
from models import CONFIGS, repeated_prompt, tiny_model


def left_padded(lengths, seed=0, pad=0):
    """A left-padded batch of repeated-span prompts of the given lengths, with its attention mask."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = repeated_prompt(seed + i, n)
        mask[i, width - n:] = 1
    return ids, mask


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return tiny_model(request.param)


@pytest.mark.parametrize("repeat", [True, False])
def test_batch_of_one_matches_greedy(model, repeat):
    """One prompt, with and without a repeated span, gives greedy's exact tokens."""
    ids = repeated_prompt(1, 48) if repeat else torch.randint(3, 96, (48,), generator=torch.Generator().manual_seed(5))
    ids = ids[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=64)
    out, stats = generate(model, ids, max_new_tokens=64, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.new_tokens == expected.shape[1] - ids.shape[1]
    assert stats.forward_passes <= stats.new_tokens


@pytest.mark.parametrize("lengths", [[30, 17, 41], [9, 40, 23, 31, 12, 44, 28, 35]])
def test_left_padded_batches_match_batched_greedy_and_rows_alone(model, lengths):
    """Rows that accept different numbers of drafts and end at different times equal each row run alone."""
    ids, mask = left_padded(lengths)
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=40)
    assert torch.equal(out, expected)
    for i, n in enumerate(lengths):
        alone = generate(model, ids[i:i + 1, -n:], max_new_tokens=40)
        produced = alone.shape[1] - n
        assert torch.equal(out[i, ids.shape[1]:ids.shape[1] + produced], alone[0, n:])


def test_drafts_are_accepted_on_a_looping_model():
    """The multi-token path is exercised: a model that repeats itself accepts many drafts."""
    model = tiny_model("gpt_neox")
    ids = repeated_prompt(0, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=120)
    out, stats = generate(model, ids, max_new_tokens=120, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.accepted_tokens > 20 and stats.tokens_per_forward > 1.5


def test_lookup_none_is_plain_decoding():
    model = tiny_model("llama")
    ids = repeated_prompt(2, 30)[None]
    out, stats = generate(model, ids, lookup="none", max_new_tokens=20, return_stats=True)
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=20))
    assert stats.forward_passes == 20 and stats.draft_tokens == 0 and stats.tokens_per_forward == 1.0


def test_eos_reached_inside_an_accepted_draft():
    """Whichever generated token is the eos, output stops exactly there, as plain greedy does."""
    model = tiny_model("gpt_neox")
    ids = repeated_prompt(0, 40)[None]
    full, stats = generate(model, ids, max_new_tokens=120, eos_token_id=[], return_stats=True)
    assert stats.accepted_tokens > 20
    for eos in sorted(set(full[0, 40:].tolist()))[:12]:
        expected = model.generate(ids, do_sample=False, max_new_tokens=120, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(generate(model, ids, max_new_tokens=120, eos_token_id=eos, pad_token_id=0), expected)


def test_eos_list_and_padding_of_finished_rows():
    """Rows that hit one of several eos ids are padded with pad_token_id, as in model.generate."""
    model = tiny_model("gpt_neox")
    ids, mask = left_padded([40, 22, 31])
    full = generate(model, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=[])
    eos = [int(full[0, 45]), int(full[1, 50])]
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, eos_token_id=eos,
                              pad_token_id=0)
    assert torch.equal(generate(model, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=eos,
                                pad_token_id=0), expected)


def test_each_row_counts_the_forwards_it_took_part_in():
    """`forwards_by_row`: a row took part in every forward until it finished; plain decoding takes one per token."""
    model = tiny_model("gpt_neox")
    ids, mask = left_padded([40, 22, 31])
    full = generate(model, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=[])
    first = [{t: row.index(t) for t in reversed(row)} for row in full[:, 40:].tolist()]
    eos = next(t for t in range(96) if min(f.get(t, 60) for f in first) >= 15 and any(t in f for f in first))
    for lookup in ("none", "ngram"):
        _, stats = generate(model, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=eos, lookup=lookup,
                            return_stats=True)
        assert min(stats.new_tokens_by_row) < 60 and max(stats.forwards_by_row) == stats.forward_passes
        if lookup == "none":
            assert stats.forwards_by_row == stats.new_tokens_by_row
        else:
            assert all(f < n for f, n in zip(stats.forwards_by_row, stats.new_tokens_by_row))


def test_max_new_tokens_reached_inside_a_draft():
    """Every length limit cuts the output at exactly max_new_tokens."""
    model = tiny_model("gpt_neox")
    ids = repeated_prompt(0, 40)[None]
    full = generate(model, ids, max_new_tokens=100, eos_token_id=[])
    for n in range(1, 100, 7):
        out = generate(model, ids, max_new_tokens=n, eos_token_id=[])
        assert torch.equal(out, full[:, :40 + n])


def test_pretrained_stories_model_matches_greedy(stories_model):
    """The real pretrained Llama: a story, then the story again as a prompt to copy from."""
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=80)
    prompt = torch.cat([story, story[:, 1:30]], dim=1)
    expected = stories_model.generate(prompt, do_sample=False, max_new_tokens=120)
    out, stats = generate(stories_model, prompt, max_new_tokens=120, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.tokens_per_forward > 1.5
    batch = torch.cat([prompt, torch.cat([torch.zeros(1, 20, dtype=torch.long), prompt[:, 20:]], 1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    expected = stories_model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=60,
                                      pad_token_id=0)
    assert torch.equal(generate(stories_model, batch, attention_mask=mask, max_new_tokens=60, pad_token_id=0),
                       expected)


def test_loads_with_from_pretrained(tmp_path):
    """A model saved and reloaded with from_pretrained decodes identically."""
    from transformers import AutoModelForCausalLM

    tiny_model("qwen2").save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = repeated_prompt(3, 36)[None]
    assert torch.equal(generate(model, ids, max_new_tokens=30), model.generate(ids, do_sample=False,
                                                                                max_new_tokens=30))


def test_every_entry_point_takes_its_option_defaults_from_one_place():
    """`decode.settings.OPTIONS` is where lookahead's option defaults are written: `generate`, `custom_generate`,
    the checked `Settings`, `lookahead serve`'s per-request `Drafting` and the index constructors agree with it."""
    import dataclasses
    import inspect

    from lookahead import custom_generate
    from lookahead.decode.settings import OPTIONS, make_settings
    from lookahead.index import NgramIndex
    from lookahead.serve.row import Drafting

    for function in (generate, custom_generate):
        parameters = inspect.signature(function).parameters
        assert {k: parameters[k].default for k in OPTIONS if k in parameters} == \
            {k: v for k, v in OPTIONS.items() if k in parameters}, function.__name__
    settings = make_settings()
    assert {k: getattr(settings, k) for k in OPTIONS if k != "tokenizer"} == \
        {k: v for k, v in OPTIONS.items() if k != "tokenizer"}
    served = {f.name: f.default for f in dataclasses.fields(Drafting)}
    assert {k: served[k] for k in ("lookup", "draft", "max_ngram", "min_ngram")} == \
        {k: OPTIONS[k] for k in ("lookup", "draft", "max_ngram", "min_ngram")}
    index = NgramIndex()
    assert (index.max_ngram, index.min_ngram) == (OPTIONS["max_ngram"], OPTIONS["min_ngram"])
