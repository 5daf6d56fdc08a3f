"""The random-weight Llama layouts the wall-clock harnesses time (`e2e.random_model`), by name; plain data, so that
`lookahead bench e2e --help` lists them without loading torch."""

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "gpt2-small": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=12),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8),  # Llama-3.2-1B's layout: about 1.2B parameters with a 50k vocabulary
}
