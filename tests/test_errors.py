"""Every bad argument to generate() gets an error that names it and says what was expected."""
import pytest
import torch
import transformers as T

from lookahead import generate
from models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


IDS = torch.tensor([[5, 6, 7, 8]])


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((torch.zeros(1, 0, dtype=torch.long),), {}, ValueError, r"input_ids must not be empty, got shape \(1, 0\)"),
        ((torch.tensor([[1.0, 2.0]]),), {}, TypeError, "input_ids must hold integers .* got dtype torch.float32"),
        (("hello",), {}, TypeError, "input_ids must be a LongTensor or a nested list of ints, got str"),
        ((torch.tensor([[5, 96]]),), {}, ValueError, r"input_ids must lie in \[0, 96\) .* from 5 to 96"),
        ((torch.tensor([[-1, 5]]),), {}, ValueError, r"input_ids must lie in \[0, 96\)"),
        ((torch.zeros(1, 2, 3, dtype=torch.long),), {}, ValueError, r"input_ids must have shape \[batch, length\]"),
        ((IDS,), {"attention_mask": torch.ones(1, 3, dtype=torch.long)}, ValueError,
         r"attention_mask must have the shape of input_ids \(1, 4\), got \(1, 3\)"),
        ((IDS,), {"attention_mask": torch.zeros(1, 4, dtype=torch.long)}, ValueError, "a row with no token"),
        ((IDS,), {"attention_mask": torch.full((1, 4), 2)}, ValueError, "attention_mask must hold only 0 and 1"),
        ((IDS,), {"max_ngram": 0}, ValueError, "max_ngram must be >= 1, got 0"),
        ((IDS,), {"max_ngram": 2, "min_ngram": 3}, ValueError, "min_ngram must be <= max_ngram"),
        ((IDS,), {"num_draft_tokens": -1}, ValueError, "num_draft_tokens must be >= 0, got -1"),
        ((IDS,), {"num_draft_tokens": 2.0}, TypeError, "num_draft_tokens must be an int, got float"),
        ((IDS,), {"draft_cost": -1}, ValueError, "draft_cost must be a number >= 0, a pair of them, a CostCurve, 'auto' or None, got -1"),
        ((IDS,), {"max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1, got 0"),
        ((IDS,), {"lookup": "bogus"}, ValueError,
         "lookup must be one of 'ngram', 'suffix', 'recycle', 'suffix\\+recycle', 'none', got 'bogus'"),
        ((IDS,), {"max_new_tokens": 600}, ValueError,
         "max_new_tokens=600 with a prompt of 4 tokens exceeds the model's position limit of 512"),
        ((IDS,), {"eos_token_id": "x"}, TypeError, "eos_token_id must be an int or a list of ints"),
        ((IDS,), {"pad_token_id": 1.5}, TypeError, "pad_token_id must be an int"),
        ((IDS,), {"pad_token_id": -1}, ValueError, "pad_token_id must be >= 0, got -1"),
        ((IDS,), {"pad_token_id": 10**6}, ValueError, "pad_token_id must be <= 95, got 1000000"),
        ((IDS,), {"generator": 2**70}, ValueError, "generator must be <= 18446744073709551615"),
        ((IDS,), {"num_draft_tokens": 10**6}, ValueError, "num_draft_tokens must be <= 1024, got 1000000"),
        ((IDS,), {"max_draft_nodes": 10**6}, ValueError, "max_draft_nodes must be <= 1024, got 1000000"),
        ((IDS,), {"max_ngram": 3 * 10**6}, ValueError, "max_ngram must be <= 64, got 3000000"),
        ((IDS,), {"memory": 1000}, TypeError, "memory must be a lookahead.Memory, got int"),
        ((IDS,), {"draft": "tree"}, ValueError, "draft='tree' needs lookup='suffix'"),
    ],
)
def test_bad_arguments(model, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        generate(model, *args, **kwargs)


def test_rejects_a_model_without_lm_head():
    config = T.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2)
    with pytest.raises(TypeError, match="causal language model with an LM head .* got LlamaModel"):
        generate(T.LlamaModel(config), IDS)


def test_rejects_something_that_is_not_a_model():
    with pytest.raises(TypeError, match="must be a transformers PreTrainedModel .* got Linear"):
        generate(torch.nn.Linear(2, 2), IDS)


class _NoCacheLM(T.PreTrainedModel, T.GenerationMixin):
    """A language model whose forward takes no KV cache."""

    config_class = T.LlamaConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, 8)
        self.lm_head = torch.nn.Linear(8, config.vocab_size)

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None):
        return self.lm_head(self.embed(input_ids))


def test_rejects_a_model_that_cannot_use_a_cache():
    model = _NoCacheLM(T.LlamaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=1))
    with pytest.raises(TypeError, match=r"must accept a KV cache \(cache= or past_key_values=\) and use_cache .* "
                                        r"_NoCacheLM does not"):
        generate(model, IDS)


def test_a_forward_replaced_on_the_model_is_checked_anew(model):
    """What a model's forward takes is kept per forward function: a forward set on the instance after a call that
    succeeded (a wrapper taking no cache) is refused, and the class's own is accepted again once it is removed."""
    ids = torch.tensor([[0, 5, 6, 7]])
    expected = generate(model, ids, max_new_tokens=4)
    model.forward = lambda input_ids, attention_mask=None: type(model).forward(model, input_ids, attention_mask)
    try:
        with pytest.raises(TypeError, match=r"must accept a KV cache \(cache= or past_key_values=\)"):
            generate(model, ids, max_new_tokens=4)
    finally:
        del model.forward
    assert torch.equal(generate(model, ids, max_new_tokens=4), expected)


@pytest.mark.parametrize("mask", [torch.tensor([[False, True, True, True]]), torch.tensor([[0.0, 1.0, 1.0, 1.0]])])
def test_bool_and_float_attention_masks_are_accepted(model, mask):
    """A bool or float mask means what transformers takes it to mean."""
    ids = torch.tensor([[0, 5, 6, 7]])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8)
    assert torch.equal(generate(model, ids, attention_mask=mask, max_new_tokens=8), expected)


def test_a_right_padded_attention_mask_is_refused(model):
    """Padding after a row's tokens would shift its positions: refused, naming attention_mask, not other text."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r"attention_mask must pad on the left .* row 1: pad on the left"):
        generate(model, torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]]), attention_mask=mask, max_new_tokens=4)


def test_a_right_padded_mask_through_custom_generate_is_refused(model):
    """The same check where transformers calls the loop itself (`custom_generate`), before any forward."""
    import lookahead

    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match="attention_mask must pad on the left"):
            model.generate(torch.tensor([[5, 6, 7, 8]]), attention_mask=torch.tensor([[1, 1, 1, 0]]),
                           custom_generate=lookahead.custom_generate, max_new_tokens=4)
    finally:
        hook.remove()
    assert not calls


def test_a_model_on_the_meta_device_is_refused():
    """Weights without data (built under `init_empty_weights`) get a clear error, not a torch traceback."""
    with torch.device("meta"):
        meta = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="model has weights on the 'meta' device .* load LlamaForCausalLM's weights"):
        generate(meta, IDS)


def test_a_model_taking_use_cache_through_its_keywords_is_accepted():
    """GraniteMoE's forward takes `use_cache` through **kwargs, as transformers generates with it: accepted, and its
    greedy output is transformers'."""
    config = T.GraniteMoeConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2, max_position_embeddings=512)
    config.initializer_range = 0.3
    torch.manual_seed(0)
    granite = T.GraniteMoeForCausalLM(config).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7]])
    expected = granite.generate(ids, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(generate(granite, ids, max_new_tokens=12, min_new_tokens=12), expected)
