"""The JSONL job (`lookahead.job.run`) against a plain `model.generate` loop over the same file, and the Ray
engine's overhead on one machine.

Summarization and code-edit traces (`traces.py`, ../shared/data; nothing is copied into the repo) are written out as
JSONL lines of token ids ({"id", "input_ids"}). A random-weight Llama of a `lookahead.bench.e2e.SHAPES` shape is
forced to replay the recorded outputs (`lookahead.bench.ForcedReplay` as the logits processor of every method), so
the forwards are real, every method writes the same tokens (checked: `mismatches`) and acceptance is that of the
model that wrote the traces. The loop and the job read the same file, group lines by prompt length the same way,
left-pad, and append + flush one JSON line per input line.

    python benchmarks/batch_job.py --datasets summarization    # gpt2-small shape, 8 lines, Ray with 2 workers
    python benchmarks/batch_job.py --datasets code-edit --ray-workers 0
    python benchmarks/batch_job.py --shape tiny --lines 24 --rounds 3
"""
from __future__ import annotations

import argparse
import functools
import io
import json
import tempfile
import time
from pathlib import Path

import torch

from traces import DEFAULT_DATA_DIR, load_traces, load_tokenizer

from lookahead.runtime import jit as _jit
from lookahead.bench import ForcedReplay
from lookahead.bench.e2e import SHAPES, free_id, random_model
from lookahead.bench.forced import distinct_prompts
from lookahead.job import run

VOCAB = 50257  # GPT-2's, the traces' tokenizer


def make_model(shape: str, vocab_size: int, eos: int, data_dir: str):
    """(random-weight Llama, GPT-2 tokenizer): the job's model factory (module level, so Ray can ship it)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=load_tokenizer(Path(data_dir))._tokenizer)
    return random_model(shape, vocab_size, eos=eos), tokenizer


def prepare(name: str, lines: int, max_prompt: int, max_new: int, data_dir: Path, folder: Path) -> tuple:
    """(JSONL path, traces): the first `lines` traces with a prompt of at most `max_prompt` tokens, outputs cut."""
    traces = [(p, o[:max_new]) for p, o in distinct_prompts(load_traces(name, data_dir)) if len(p) <= max_prompt]
    traces = traces[:lines]
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": i, "input_ids": p.tolist()}) + "\n" for i, (p, _) in enumerate(traces)))
    return path, traces


def hf_loop(path: Path, out: Path, model, tokenizer, forced, max_new: int, batch_size: int, pad: int) -> dict:
    """A plain loop: read the JSONL, batch by length, left-pad, `model.generate`, append + flush JSON lines."""
    from transformers import LogitsProcessorList

    rows = sorted((json.loads(line) for line in open(path)), key=lambda r: -len(r["input_ids"]))
    start, tokens = time.perf_counter(), 0
    with open(out, "a") as f, torch.inference_mode():
        for i in range(0, len(rows), batch_size):
            batch = rows[i:i + batch_size]
            width = max(len(r["input_ids"]) for r in batch)
            ids = torch.tensor([[pad] * (width - len(r["input_ids"])) + r["input_ids"] for r in batch])
            seq = model.generate(ids, attention_mask=(ids != pad).long(), do_sample=False, max_new_tokens=max_new,
                                 logits_processor=LogitsProcessorList([forced]), pad_token_id=pad)
            for r, new in zip(batch, seq[:, width:].tolist()):
                new = new[: new.index(pad) + 1] if pad in new else new
                tokens += len(new)
                f.write(json.dumps({"id": r["id"], "text": tokenizer.decode(new, skip_special_tokens=True),
                                    "output_ids": new}) + "\n")
            f.flush()
    # one token per unfinished row and forward, by definition of plain decoding
    return dict(seconds=time.perf_counter() - start, lines=len(rows), tokens=tokens, tokens_per_forward=1.0)


class FirstLine(io.StringIO):
    """An echo stream that notes when the first line was written (Ray: when the first replica was up)."""

    first = None

    def write(self, text):
        self.first = self.first or time.perf_counter()
        return super().write(text)


def job(path: Path, out: Path, factory, forced, max_new: int, batch_size: int, lookup: str, engine: str = "local",
        workers: int = 1) -> dict:
    echo, start = FirstLine(), time.perf_counter()
    summary = run(str(path), str(out), factory, engine=engine, workers=workers, lookup=lookup, max_new_tokens=max_new,
                  batch_size=batch_size, logits_processor=forced, errors=io.StringIO(), echo=echo)
    end = time.perf_counter()
    return dict(seconds=summary.seconds, wall=end - start, first=echo.first - start, lines=summary.written,
                tokens=summary.new_tokens, tokens_per_forward=summary.tokens_per_forward)


def mismatches(out: Path, reference: Path) -> int:
    """Lines whose output_ids differ from the reference file's line of the same id."""
    ref = {r["id"]: r["output_ids"] for r in map(json.loads, open(reference))}
    return sum(ref.get(r["id"]) != r["output_ids"] for r in map(json.loads, open(out)))


def row(dataset: str, method: str, result: dict, base: dict, bad: int) -> str:
    tpf = result.get("tokens_per_forward")
    return (f"| {dataset} | {method} | {result['lines'] / result['seconds']:.3f} | "
            f"{result['tokens'] / result['seconds']:.1f} | {'-' if tpf is None else f'{tpf:.2f}'} | "
            f"{base['seconds'] / result['seconds']:.2f}x | {bad} |")


def compare(name: str, args, folder: Path) -> tuple:
    """The loop and the job (each lookup) on one dataset, interleaved; the Ray run when asked."""
    path, traces = prepare(name, args.lines, args.max_prompt, args.max_new_tokens, args.data_dir, folder)
    vocab, eos = free_id(traces, VOCAB)
    forced = ForcedReplay(traces, pad_token_id=eos, eos_token_id=eos)
    factory = functools.partial(make_model, args.shape, vocab, eos, str(args.data_dir))
    model, tokenizer = factory()
    for lookup in ("ngram", "suffix"):  # numba kernels, caches
        job(path, folder / f"{name}.warm-{lookup}", factory, forced, 4, args.batch_size, lookup)
    runs = {"hf": [], "ngram": [], "suffix": []}
    bad = {"ngram": 0, "suffix": 0}
    for r in range(args.rounds):  # methods interleaved, so that load from elsewhere hits them alike
        hf_out = folder / f"{name}.hf.{r}"
        runs["hf"].append(hf_loop(path, hf_out, model, tokenizer, forced, args.max_new_tokens, args.batch_size, eos))
        for lookup in ("ngram", "suffix"):
            out = folder / f"{name}.{lookup}.{r}"
            runs[lookup].append(job(path, out, factory, forced, args.max_new_tokens, args.batch_size, lookup))
            bad[lookup] += mismatches(out, hf_out)
    median = {method: sorted(done, key=lambda x: x["seconds"])[(len(done) - 1) // 2] for method, done in runs.items()
              if done}
    rows = [row(name, "model.generate loop", median["hf"], median["hf"], 0)] if median else []
    rows += [row(name, f"lookahead generate --lookup {lookup}", median[lookup], median["hf"], bad[lookup])
             for lookup in ("ngram", "suffix") if median]
    if not args.ray_workers or name != args.datasets[0]:
        return rows, []
    local_out, ray_out = folder / f"{name}.local", folder / f"{name}.ray"
    local = job(path, local_out, factory, forced, args.max_new_tokens, args.batch_size, "ngram")
    remote = job(path, ray_out, factory, forced, args.max_new_tokens, args.batch_size, "ngram", "ray", args.ray_workers)
    return rows, [_ray_row(name, "local", 1, local, 0),
                  _ray_row(name, "ray", args.ray_workers, remote, mismatches(ray_out, local_out))]


def _ray_row(dataset: str, engine: str, workers: int, r: dict, bad: int) -> str:
    return (f"| {dataset} | {engine} | {workers} | {r['wall']:.1f} | {r['first']:.1f} | {r['lines'] / r['wall']:.3f} | "
            f"{r['tokens'] / r['wall']:.1f} | {bad} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="gpt2-small")
    parser.add_argument("--datasets", nargs="+", default=["summarization", "code-edit"])
    parser.add_argument("--lines", type=int, default=8, help="lines per dataset")
    parser.add_argument("--max-prompt", type=int, default=384, help="longest prompt kept, in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each method, interleaved; the lower median is shown (0: only the Ray comparison)")
    parser.add_argument("--ray-workers", type=int, default=2, help="Ray run on the first dataset; 0: none")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine 2 spinning threads ran 10x slower)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # Ray's workers get 1 thread each (OMP_NUM_THREADS=1 per CPU they hold)
    print(f"shape {args.shape}, {args.lines} lines per dataset, prompts <= {args.max_prompt} tokens, "
          f"max_new_tokens {args.max_new_tokens}, batch size {args.batch_size}, lower median of {args.rounds} "
          f"interleaved rounds, torch threads {torch.get_num_threads()}\n")
    rows, ray_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets:
            more, more_ray = compare(name, args, Path(tmp))
            rows += more
            ray_rows += more_ray
    if rows:
        print("| dataset | method | lines/s | tokens/s | tokens/forward | speedup | mismatches |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(rows))
    if ray_rows:
        print("\n| dataset | engine | workers | wall s (start to end) | s to the first line | lines/s (wall) | "
              "tokens/s (wall) | mismatches vs local |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(ray_rows))


if __name__ == "__main__":
    with _jit.compiled():  # timings of numba's kernels, never of their Python twins
        main()
