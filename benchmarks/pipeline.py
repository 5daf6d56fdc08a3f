"""Summarization pipeline: wall clock of the lookahead plugin against the plain pipeline, same summaries.

The model is a random-weight BART of bart-base shape (6 + 6 layers, d_model 768, vocabulary 50265) reading CNN/DM
articles (FRANK, GPT-2 tokens); its decoder is forced to replay the summary BART wrote for each article, so the
forwards are real and the acceptance pattern is that of the real summaries. Plain and lookahead runs alternate
article by article (the machine's load hits both alike) and must produce the same text.

    python benchmarks/pipeline.py --limit 10
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from traces import DEFAULT_DATA_DIR, summarization_texts

import lookahead
from lookahead.plugin import Summarization

EOS = 50256  # GPT-2's <|endoftext|>, never inside the texts


class ForcedSummary:
    """Logits processor forcing the decoder to write `summary` (token ids), then eos (batch of one)."""

    def __init__(self, summary):
        self.summary = list(summary)

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -1e4)
        n = input_ids.shape[1] - 1  # tokens written after the decoder start token
        forced[:, self.summary[n] if n < len(self.summary) else EOS] = 0.0
        return forced


def bart_base():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                        max_position_embeddings=1024, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
                        decoder_start_token_id=EOS, forced_bos_token_id=None, forced_eos_token_id=None)
    torch.manual_seed(0)
    return BartForConditionalGeneration(config).eval()


def run(pipe, article: str, summary_ids, counter: list) -> tuple:
    """(summary text, seconds, decoder forwards) of one pipeline call."""
    from transformers import LogitsProcessorList

    counter[0] = 0
    t0 = time.perf_counter()
    text = pipe(article, max_new_tokens=len(summary_ids) + 1,
                logits_processor=LogitsProcessorList([ForcedSummary(summary_ids)]))[0]["summary_text"]
    return text, time.perf_counter() - t0, counter[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-ngram", type=int, default=4)
    parser.add_argument("--draft-costs", nargs="+", default=["default", "0"],
                        help="lookahead runs: draft_cost values ('default' leaves it to lookahead)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.data_dir / "tokenizers" / "gpt2")
    model = bart_base()
    counter = [0]
    model.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))  # decoder forwards
    pipes = {"plain": Summarization(model, tok, custom_generate=None)}
    for cost in args.draft_costs:
        options = {} if cost == "default" else {"draft_cost": float(cost)}
        pipes[f"lookahead draft_cost={cost}"] = lookahead.pipeline("summarization", model=model, tokenizer=tok,
                                                                   max_ngram=args.max_ngram, **options)
    totals = {name: [0.0, 0] for name in pipes}
    texts = summarization_texts(args.data_dir, limit=args.limit + 1)
    tokens = 0
    for i, ((prompt,), summary) in enumerate(texts):
        article, summary_ids = prompt.removesuffix("\n\nSummary:\n"), tok(summary)["input_ids"]
        results = {name: run(pipe, article, summary_ids, counter) for name, pipe in pipes.items()}
        assert len({text for text, _, _ in results.values()}) == 1, f"article {i}: summaries differ"
        if i == 0:
            continue  # warm-up
        tokens += len(summary_ids) + 1
        for name, (_, seconds, forwards) in results.items():
            totals[name][0] += seconds
            totals[name][1] += forwards
    _report(totals, len(texts) - 1, tokens)


def _report(totals: dict, n: int, tokens: int) -> None:
    print(f"articles: {n}, summary tokens per article: {tokens / n:.0f} (identical text from every pipeline)\n")
    print("| pipeline | seconds per article | decoder forwards per article | tokens per forward | speedup |")
    print("|---|---|---|---|---|")
    for name, (seconds, forwards) in totals.items():
        print(f"| {name} | {seconds / n:.3f} | {forwards / n:.1f} | {tokens / forwards:.2f} | "
              f"{totals['plain'][0] / seconds:.2f}x |")


if __name__ == "__main__":
    main()
