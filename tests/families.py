"""Tiny random models of every decoder-only architecture the installed transformers has, found from its auto mappings
(`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) and built from each config class's own fields, so that a new transformers
release brings its new architectures in. `python tests/families.py` prints the support table (family x call).

A config is shrunk by field name (hidden 64, 2 layers, 4 heads, ...; a sliding window, an attention chunk or a local
window of 16 tokens where the architecture has one; position limits of 512); a few architectures name their sizes
their own way (`OVERRIDES`). What cannot be built tiny offline, or is no decoder-only text model, is skipped with
its reason (`skip_reason`).
"""
from __future__ import annotations

import dataclasses
import sys
import weakref

import torch

VOCAB = 128
WINDOW = 16  # the sliding window, attention chunk or local window of a tiny model: smaller than a call
POSITIONS = 512
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 2, 4, 2, 16

# field name -> its tiny value, for every config class that has the field
SIZES = {
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "num_hidden_layers": LAYERS,
    "n_layer": LAYERS, "num_layers": LAYERS, "n_layers": LAYERS, "num_attention_heads": HEADS, "n_head": HEADS,
    "n_heads": HEADS, "num_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM, "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "ffn_hidden_size": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "shared_intermediate_size": 32,
    "shared_experts_intermediate_size": 32, "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4,
    "moe_num_experts": 4, "num_experts_per_tok": 2, "moe_topk": 2, "moe_k": 2, "top_k_experts": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 24, "max_position_embeddings": POSITIONS, "n_positions": POSITIONS, "max_seq_len": POSITIONS,
    "max_sequence_length": POSITIONS, "n_ctx": POSITIONS, "sliding_window": WINDOW, "sliding_window_size": WINDOW,
    "attention_chunk_size": WINDOW, "window_size": WINDOW, "local_attention_window_len": WINDOW,
    "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_heads": 8, "mamba_d_head": 16,
    "mamba_n_groups": 1, "mamba_chunk_size": 16, "state_size": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_head_dim": 16, "linear_num_heads": 4, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8,
    "vocab_size_per_layer_input": VOCAB, "attention_window_size": WINDOW, "num_mtp_layers": 0,
    "num_nextn_predict_layers": 0, "hidden_size_per_layer_input": 8, "embedding_size": HIDDEN,
    "swa_num_attention_heads": HEADS, "swa_num_key_value_heads": KV_HEADS, "swa_head_dim": HEAD_DIM,
    "kv_channels": HEAD_DIM, "attention_hidden_size": HIDDEN, "decoder_sparse_step": 1, "conv_L_cache": 3,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# what a few architectures need besides (their own names for sizes, a variant worth its own row)
OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "falcon": {"new_decoder_architecture": False},
    "bamba": {"attn_layer_indices": [1]},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    "falcon_h1": {"mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16},
    "zamba": {"layers_block_type": ["mamba", "hybrid", "hybrid"], "num_hidden_layers": 3, "attention_hidden_size": 2 * HIDDEN},  # a shared block tied
    # between two hybrid layers
    "zamba2": {"layers_block_type": ["mamba", "hybrid"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "kv_n_heads": KV_HEADS, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    "mamba2": {"num_heads": 8, "head_dim": 16},
    "zaya": {"num_experts_per_tok": 1},
    "xlstm": {"qk_dim_factor": 1.0},  # transformers 5.24 sizes its cached states by the value head size: a smaller
    # query-key head fails its own generate ("matC_old has wrong shape")
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1,  # one layer each: input, looped, output
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 2, "hc_lowrank": 16},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "use_mamba_kernels": False},
}
VARIANTS = {  # variant name -> (model type, extra fields): a feature the default config leaves off
    "falcon_alibi": ("falcon", {"alibi": True, "new_decoder_architecture": False}),
    "qwen2_window": ("qwen2", {"use_sliding_window": True, "max_window_layers": 1}),
    "mistral_no_window": ("mistral", {"sliding_window": None}),
}
MULTIMODAL = ("vision_config", "audio_config", "vq_config", "patcher_config", "text_encoder", "audio_encoder")
MAX_PARAMETERS = 3_000_000  # bigger than this is no tiny model: skipped


def causal_types() -> dict:
    """model type -> its causal LM class name, from transformers' auto mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def families() -> list:
    """Every (name, model type, extra fields) the test walks: each causal model type, then the `VARIANTS`."""
    rows = [(t, t, {}) for t in causal_types()]
    return rows + [(name, t, extra) for name, (t, extra) in VARIANTS.items() if t in causal_types()]


def config_fields(model_type: str) -> dict:
    """The config class's fields and their defaults."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}


def static_skip(model_type: str) -> str | None:
    """Why a model type is no decoder-only text model (before building it), or None."""
    fields, cls = config_fields(model_type), causal_types()[model_type]
    if any(name in fields for name in MULTIMODAL) or cls.endswith("ForConditionalGeneration"):
        return "multimodal (a vision, audio or image-token model)"
    if fields.get("is_encoder_decoder") is True or "decoder_layers" in fields or "encoder_layers" in fields:
        return "encoder-decoder (its causal LM class is the decoder alone)"
    if "add_cross_attention" in fields and "is_decoder" in fields:
        return "an encoder run as a decoder (is_decoder=True), not a decoder-only LM"
    if "text_config" in fields:
        return "a composite config (text_config): the text model is its own model type"
    return None


def tiny_config(model_type: str, extra: dict | None = None):
    """The tiny config of a model type: `SIZES` for the fields it has, then `OVERRIDES`, then `extra`."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = config_fields(model_type)
    kwargs = {k: v for k, v in SIZES.items() if k in fields}
    if "kv_lora_rank" in fields or "qk_rope_head_dim" in fields:  # multi-head latent attention: head_dim is its
        kwargs["head_dim"] = kwargs.get("qk_rope_head_dim", HEAD_DIM)  # rotary part, a key/value head per query
        # head (as real MLA configs have)
        kwargs["num_key_value_heads"] = HEADS
    if "rotary_dim" in fields:
        kwargs["rotary_dim"] = HEAD_DIM // 2
    if "sliding_window" in fields and fields["sliding_window"] is None and "use_sliding_window" not in fields:
        kwargs["sliding_window"] = None  # off unless the architecture turns it on by default
    kwargs.update(OVERRIDES.get(model_type, {}))
    kwargs.update(extra or {})
    config = CONFIG_MAPPING[model_type](**kwargs)
    _mix_layer_types(config, model_type)
    _rope_per_kind(config, model_type)
    config.initializer_range = 0.3  # peaked logits: greedy choices are no near-ties
    return config


def _mix_layer_types(config, model_type: str) -> None:
    """Where the full-size config mixes layer kinds (sliding and full, linear and full, ...) but two layers got one
    kind only, give the tiny model one layer of each kind (as many layers as kinds)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kinds = getattr(config, "layer_types", None)
    if not isinstance(kinds, list):
        return
    try:
        full = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 (a config that needs arguments: keep the tiny one's kinds)
        return
    everything = list(dict.fromkeys(getattr(full, "layer_types", None) or []))
    if len(set(kinds)) < len(everything):
        config.layer_types = everything
        config.num_hidden_layers = len(everything)


def _rope_per_kind(config, model_type: str) -> None:
    """Where rotary parameters are kept per layer kind (Gemma 3 style) but a kind the tiny model has got none (a kind
    `_mix_layer_types` added, or a text config whose defaults leave them to its composite parent), give it the full
    config's parameters for that kind, or the default rotary embedding."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    rope, kinds = getattr(config, "rope_parameters", None), getattr(config, "layer_types", None)
    if not isinstance(rope, dict) or not isinstance(kinds, list) or "rope_type" in rope:
        return
    try:
        full = getattr(CONFIG_MAPPING[model_type](), "rope_parameters", None) or {}
    except Exception:  # noqa: BLE001 (a config that needs arguments)
        full = {}
    for kind in dict.fromkeys(kinds):
        if kind not in rope:
            rope[kind] = dict(full.get(kind) or {"rope_type": "default", "rope_theta": 10000.0})


def build(model_type: str, extra: dict | None = None):
    """A tiny random fp32 model of the type (eval mode), or raise with why it cannot be built."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        raise ValueError(f"{n} parameters after shrinking: no tiny model")
    return model


def prompt(length: int = 40, span: int = 12, seed: int = 0) -> torch.Tensor:
    """[1, length] random ids (from 3 on) in which one span appears twice, so that drafts are accepted."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (length,), generator=g)
    ids[-span:] = ids[1:span + 1]
    return ids[None]


NEW = 40  # new tokens per call
CALLS = {  # call name -> lookahead.generate's keyword arguments
    "default": {},
    "suffix_tree": {"lookup": "suffix", "draft": "tree"},
    "static": {"cache_implementation": "static"},
    "recycle_tree": {"lookup": "suffix+recycle", "draft": "tree"},
    "batch": {},
    "sampling": {"do_sample": True, "top_k": 1, "generator": 0},
}


# expected refusals, keyed by a layer kind or a feature (not by model name): (feature, calls, message pattern)
REFUSALS = [
    ("recurrent", ("suffix_tree", "recycle_tree"), r"draft='tree' is not supported for .*: its recurrent layers"),
    ("recurrent state held elsewhere", ("static",), r"cache_implementation='static' is not supported for .*: (its "
                                                   r"recurrent blocks keep their states on the modules|its recurrent "
                                                   r"states live in a cache of its own|its layers keep recurrent "
                                                   r"states beside a sliding window|its blocks keep their states "
                                                   r"in the state its forward takes)"),
    ("window its masks ignore", ("static",), r"names a window of \d+ tokens that its forward's attention masks do "
                                             r"not apply"),
    ("compressed", ("suffix_tree", "recycle_tree"), r"draft='tree' is not supported for .*: its compressed attention"),
    ("compressed", ("static",), r"cache_implementation='static' is not supported for .*: its compressed attention"),
]
# features whose batch runs a row at a time, each alone and exact, said by a RowsApartWarning
# (`lookahead.decode.fallback.one_row_at_a_time`): (feature, the warning's reason pattern)
ROWS_APART = [
    ("recurrent window by slot", r"layers that keep recurrent states cut their sliding window by cache slot"),
    ("ALiBi from slots", r"builds its ALiBi biases from cache slots"),
    ("compressed", r"compressed attention layers count their entries once for every row"),
]
# features whose every call runs model.generate's own decoding, said by a FallbackWarning (`lookahead.decode.fallback`):
# (feature, the warning's reason pattern)
FALLBACKS = [
    ("no KV cache", r"keeps no KV cache that lookahead can roll back"),
    ("unfollowed recurrent", r"(is a state-space model: every layer keeps a recurrent state|has recurrent "
                             r"layers \(\d+ of \d+: .*\)) that lookahead cannot take back"),
    ("unknown layer kind", r"has layers of a kind lookahead does not know"),
    ("own cache class", r"keeps its state in a cache of its own"),
]
KNOWN_FAILURES = {  # (family, call) -> why it fails for now: xfail, not strict
    ("xlnet", "batch"): "the fallback runs transformers' own generate, whose left-padded batch differs from the short "
                        "row alone",
}
_REFERENCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {prompt: greedy tokens}


def features(model) -> set:
    """The model's features that `REFUSALS` and the window xfail are keyed by, from its layers and forward."""
    from lookahead.model.cache import FOLLOWED_CACHES
    from lookahead.model.facts import ModelFacts, forward_parameters
    from lookahead.model.griffin import griffin_blocks
    from lookahead.model.recurrent import windowed_state_layers
    from lookahead.model.layers import COMPRESSED, KNOWN, NONE, RECURRENT, LayerKinds, check_windows_in_masks

    from lookahead.model.rwkv import is_rwkv

    found, params = set(), forward_parameters(model)
    if not ({"cache", "past_key_values"} & params or ("state" in params and is_rwkv(model))):  # RWKV's `state`
        return {"no KV cache"}
    facts = ModelFacts.of(model)
    kinds = [layer.kind for layer in facts.layers if layer.kind != NONE]
    own = facts.own_cache if facts.own_cache not in FOLLOWED_CACHES else None  # MiniMax's is followed
    if RECURRENT in kinds and not own:  # a cache of its own is refused for that
        found.add("unfollowed recurrent" if facts.recurrent else "recurrent")
        if not facts.recurrent and (griffin_blocks(model) or facts.own_cache or windowed_state_layers(model)
                                    or facts.kv == "state"):
            found.add("recurrent state held elsewhere")  # on the modules, in a cache of its own, beside a window,
            # in RWKV's `state`
        if not facts.recurrent and windowed_state_layers(model):
            found.add("recurrent window by slot")
    if any(kind not in KNOWN for kind in kinds):
        found.add("unknown layer kind")
    if COMPRESSED in kinds:
        found.add("compressed")
    if own:
        found.add("own cache class")
    if facts.alibi:
        found.add("ALiBi")
    if facts.alibi == "slots":
        found.add("ALiBi from slots")
    try:
        check_windows_in_masks(model, LayerKinds.of(model.config))
    except ValueError:
        found.add("window its masks ignore")
    return found


def expected(model, call: str, name: str | None = None) -> tuple:
    """What a call must give: ("refused", pattern), ("fallback", pattern) where model.generate's own decoding runs
    instead (its tokens, the warning's reason matching pattern), ("rows apart", pattern) where a batch's rows run
    one at a time (each row's tokens, the warning's reason matching pattern), ("xfail", reason) for a `KNOWN_FAILURES` cell of
    the family `name`, or ("equal", None)."""
    found = features(model)
    for feature, calls, pattern in REFUSALS:
        if feature in found and (calls is None or call in calls):
            return "refused", pattern
    if (name, call) in KNOWN_FAILURES:
        return "xfail", KNOWN_FAILURES[name, call]
    for feature, pattern in ROWS_APART if call == "batch" else ():
        if feature in found:
            return "rows apart", pattern
    for feature, pattern in FALLBACKS:
        if feature in found:
            return "fallback", pattern
    return "equal", None


def reference(model, ids: torch.Tensor, new: int = NEW) -> torch.Tensor:
    """model.generate's greedy new tokens after `ids` [1, L] (no padding), kept per model and prompt."""
    known = _REFERENCES.setdefault(model, {})
    key = (tuple(ids[0].tolist()), new)
    if key not in known:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             min_new_tokens=new)
        known[key] = out[0, ids.shape[1]:]
    return known[key]


def padded_batch() -> tuple:
    """(input_ids, attention_mask) [2, 40]: the prompt, and a shorter one left-padded with 10 zeros."""
    long, short = prompt(40, seed=0)[0], prompt(30, span=10, seed=1)[0]
    ids = torch.stack([long, torch.cat([torch.zeros(10, dtype=torch.long), short])])
    mask = (torch.arange(40)[None, :] >= torch.tensor([[0], [10]])).long()
    return ids, mask


def outcome(model, call: str, new: int = NEW) -> tuple:
    """("equal" | "fallback" | "rows apart" | "wrong" | "refused" | "crash", detail) of one call against
    `model.generate`; "refused" only for a ValueError or TypeError raised before the model's first forward;
    "fallback" for model.generate's tokens with a FallbackWarning, "rows apart" for each row's tokens with a
    RowsApartWarning (its reason the detail)."""
    import warnings

    import lookahead
    from lookahead.decode.fallback import FallbackWarning, RowsApartWarning

    kwargs = dict(CALLS[call], max_new_tokens=new, min_new_tokens=new)
    forwards = []
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    caught = warnings.catch_warnings(record=True)
    said = caught.__enter__()
    warnings.simplefilter("always", FallbackWarning)
    try:
        if call == "batch":
            ids, mask = padded_batch()
            out = lookahead.generate(model, ids, attention_mask=mask, **kwargs)
            rows = [ids[0:1], ids[1:2, 10:]]
        else:
            ids = prompt()
            out = lookahead.generate(model, ids, **kwargs)
            rows = [ids]
    except Exception as error:  # noqa: BLE001 (what the table reports)
        if isinstance(error, (ValueError, TypeError)) and not forwards:  # refused before any forward
            return "refused", str(error)
        return "crash", f"{type(error).__name__}: {str(error)[:160]}"
    finally:
        hook.remove()
        caught.__exit__(None, None, None)
    for i, row in enumerate(rows):
        want, got = reference(model, row, new), out[i, ids.shape[1]:]
        if not torch.equal(want, got):
            first = int((want != got).nonzero()[0]) if len(want) == len(got) else -1
            return "wrong", f"row {i} differs from token {first}"
    fell = [str(w.message) for w in said if issubclass(w.category, FallbackWarning)]
    apart = [str(w.message) for w in said if issubclass(w.category, RowsApartWarning)]
    return ("fallback", fell[0]) if fell else ("rows apart", apart[0]) if apart else ("equal", "")


def tiny_model(name: str):
    """The tiny model of a family name (`families`), ready to compare (no eos: every call runs its tokens), or raise
    with why it cannot be built."""
    t, extra = next((t, extra) for n, t, extra in families() if n == name)
    model = build(t, extra)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


SHORT = [  # message pattern -> the short reason the table shows
    (r"must accept a KV cache|keeps no KV cache", "no KV cache"), (r"state-space", "recurrent, not followed"),
    (r"has recurrent layers", "recurrent, not followed"), (r"draft='tree' is not supported .* recurrent", "recurrent"),
    (r"static' is not supported .*(on the modules|a cache of its own|beside a sliding window|the state its forward)",
     "recurrent state held elsewhere"),
    (r"static' is not supported .* recurrent", "recurrent"),
    (r"cache of its own", "own cache"), (r"does not know", "unknown layer kind"), (r"ALiBi", "ALiBi"),
    (r"recurrent states cut their sliding window", "recurrent window by slot"),
    (r"masks do not apply", "window its masks ignore"), (r"compressed attention", "compressed"),
]


def cell(kind: str, detail: str, want: tuple) -> str:
    """A table cell: equal, refused (short reason), fallback (short reason: model.generate ran), rows apart (short
    reason: each row alone, its tokens), xfail (a `KNOWN_FAILURES` cell), crash or wrong."""
    import re

    if kind in ("refused", "fallback", "rows apart"):
        reason = next((short for pattern, short in SHORT if re.search(pattern, detail)), detail[:40])
        kind = f"{kind} ({reason})"
    if want[0] == "xfail" and not kind == "equal":
        return f"xfail (known): {kind}"
    return kind


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's lookahead, not an installed one
    import lookahead  # noqa: F401

    names = [name for name, _, _ in families() if not sys.argv[1:] or name in sys.argv[1:]]
    print("| family | " + " | ".join(CALLS) + " |\n|" + " --- |" * (len(CALLS) + 1), flush=True)
    skipped = []
    for name in names:
        why = static_skip(dict((n, t) for n, t, _ in families())[name])
        try:
            model = None if why else tiny_model(name)
        except Exception as error:  # noqa: BLE001
            why = f"cannot be built tiny offline ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
        try:
            why or reference(model, prompt())
        except Exception as error:  # noqa: BLE001
            why = f"transformers' own generate fails ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
        if why:
            skipped.append(f"{name}: {why}")
            continue
        cells = [cell(*outcome(model, call), expected(model, call, name)) for call in CALLS]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("\nskipped:\n" + "\n".join(skipped))
