"""Tiny random-weight causal LMs of several architectures, built from small configs."""
import torch
import transformers as T

VOCAB = 96
_COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=512, **_COMMON)

CONFIGS = {
    "llama": lambda: T.LlamaConfig(num_key_value_heads=2, **_DECODER),
    "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=512, **_COMMON),
    "qwen2": lambda: T.Qwen2Config(num_key_value_heads=2, **_DECODER),
    "mistral": lambda: T.MistralConfig(num_key_value_heads=2, sliding_window=None, **_DECODER),
    "gpt_neox": lambda: T.GPTNeoXConfig(**_DECODER),
    "phi3": lambda: T.Phi3Config(num_key_value_heads=2, **_DECODER),
    "gemma": lambda: T.GemmaConfig(num_key_value_heads=1, head_dim=8, **_DECODER),
}


def tiny_model(arch: str, seed: int = 0, std: float = 0.3):
    """A random causal LM whose logits are peaked (large init std), so greedy choices are not near-ties."""
    config = CONFIGS[arch]()
    config.initializer_range = std
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config)
    return model.eval()


def repeated_prompt(seed: int, length: int, span: int = 12) -> torch.Tensor:
    """Random ids in which one span appears twice, so the index has something to copy."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (length,), generator=g)
    if length >= 2 * span + 2:
        ids[-span:] = ids[1:span + 1]
    return ids
