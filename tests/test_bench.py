"""`lookahead bench`: the replay, HF prompt lookup, trace files, git traces, forced replay and the three subcommands."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SHARED, STORIES
from lookahead.bench import e2e
from lookahead.bench.forced import ForcedReplay, distinct_prompts
from lookahead.bench.git_traces import git_traces
from lookahead.bench.methods import ALIASES, AMBIGUOUS, METHODS, canonical, resolve
from lookahead.bench.peers import PromptLookup, VllmNgram
from lookahead.bench.replay import ReplayStats, predicted_speedup, ratio_cost, replay_trace
from lookahead.bench.traces_io import load_tokenizer, read_traces
from lookahead.cli import main
from lookahead.index import Draft, NgramIndex, SuffixIndex
from lookahead.decode.policy import CostCurve
from strategies import token_lists

GPT2 = SHARED / "data" / "tokenizers" / "gpt2"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One torch thread, restored after: on a busy 2-core machine a second thread makes tiny forwards 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def write_jsonl(path, rows) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def trace_file(tmp_path):
    code = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
    return write_jsonl(tmp_path / "edits.jsonl", [
        {"prompt": code + "# rename area to surface\n", "output": code.replace("area", "surface")},
        {"prompt_ids": [5, 6, 7, 8, 9, 5, 6, 7], "output_ids": [8, 9, 5, 6, 7, 8, 1]},
    ])


def test_replay_counts_forwards_of_a_copy():
    """A drafter that copies a repeated span yields several tokens per forward; the counts add up."""
    stats = replay_trace(NgramIndex(4), np.array([1, 2, 3, 4, 5, 6]), np.array([1, 2, 3, 4, 5, 6]), budget=4)
    assert stats.tokens == 6 and stats.steps < 6
    assert stats.accepted == stats.tokens - stats.steps


class FixedTree:
    """A drafter that proposes the same tree every step."""

    def __init__(self, tokens, parents):
        self.draft = Draft(np.array(tokens), np.array(parents), np.ones(len(tokens)))

    def extend(self, tokens):
        pass

    def propose_tree(self, max_nodes):
        return self.draft.head(max_nodes)


def test_tree_acceptance_follows_the_matching_branch():
    """Greedy tree acceptance walks the children that match the target, then the target's own token comes free."""
    stats = replay_trace(FixedTree([5, 6, 7], [-1, -1, 1]), np.array([1]), np.array([6, 7, 9]), budget=3, tree=True)
    assert (stats.steps, stats.accepted, stats.tokens) == (1, 2, 3)
    stats = replay_trace(FixedTree([5], [-1]), np.array([1]), np.array([4, 4]), budget=3, tree=True)
    assert (stats.steps, stats.accepted, stats.draft_sizes) == (2, 0, {1: 2})


def naive_replay(proposer, prompt, output, budget, tree):
    """Replay by the definition: walk the draft (chain or tree) while it agrees with the recording."""
    proposer.extend(prompt)
    pos, steps, accepted = 0, 0, 0
    while pos < len(output):
        if tree:
            draft = proposer.propose_tree(budget)
            node, depth = -1, 0
            while pos + depth < len(output):
                kids = [j for j in range(len(draft.tokens))
                        if draft.parents[j] == node and draft.tokens[j] == output[pos + depth]]
                if not kids:
                    break
                node, depth = kids[0], depth + 1
        else:
            draft = list(proposer.propose(min(budget, len(output) - pos)))
            depth = 0
            while depth < len(draft) and draft[depth] == output[pos + depth]:
                depth += 1
        produced = min(depth + 1, len(output) - pos)
        proposer.extend(output[pos:pos + produced])
        pos, steps, accepted = pos + produced, steps + 1, accepted + depth
    return steps, accepted


@settings(max_examples=40)
@given(token_lists(max_size=60, vocab=4), token_lists(max_size=40, vocab=4), st.integers(1, 8), st.booleans())
def test_replay_uses_the_acceptance_of_its_definition(prompt, output, budget, tree):
    """The replay (the library's acceptance rules) counts the steps and accepted tokens of the plain definition."""
    if not output:
        return
    make = SuffixIndex if tree else (lambda: NgramIndex(4))
    stats = replay_trace(make(), np.array(prompt or [0]), np.array(output), budget, tree)
    assert (stats.steps, stats.accepted) == naive_replay(make(), np.array(prompt or [0]), np.array(output), budget,
                                                         tree)
    assert stats.tokens == len(output) and sum(stats.draft_sizes.values()) == stats.steps


def test_predicted_speedup_is_tokens_over_the_step_costs():
    """Each step costs step_cost(cost, k) for its k drafts: a ratio of 1 predicts tokens per forward; a measured
    curve never makes a step cheaper than a one-token forward (the cause of negative tree predictions)."""
    stats = ReplayStats(tokens=40, steps=10, drafted=100, accepted=30, draft_sizes={10: 10})
    assert predicted_speedup(stats, ratio_cost(1.0)) == pytest.approx(4.0)
    assert predicted_speedup(stats, ratio_cost(2.0, cost_tokens=11)) == pytest.approx(40 / (10 + 0.1 * 100))
    assert predicted_speedup(stats, (0.5, 0.0)) == pytest.approx(40 / 15)
    noisy = CostCurve([1.0, 0.9, 0.7, 0.6])  # bigger forwards timed cheaper
    tree = ReplayStats(tokens=40, steps=10, drafted=320, accepted=30, draft_sizes={32: 10})
    assert 0 < predicted_speedup(tree, noisy) <= 4.0
    with pytest.raises(ValueError, match="cost_ratio must be >= 1"):
        ratio_cost(0.68)
    with pytest.raises(ValueError, match="cost_tokens must be >= 2, got 1"):
        ratio_cost(2.0, 1)


def test_registry_names_are_unambiguous():
    """Every alias names a method; the ambiguous old names say which two they could mean; generating methods say how."""
    assert all(canonical(alias) == name for alias, name in ALIASES.items())
    for name, (ours, theirs) in AMBIGUOUS.items():
        with pytest.raises(ValueError, match=f"method '{name}' is ambiguous: say {ours} .* or {theirs}"):
            canonical(name)
    with pytest.raises(ValueError, match="unknown method 'beam'; expected one of lookahead-none, "):
        canonical("beam")
    assert all(m.runner in (None, "hf", "lookahead") and (m.make or m.runner or m.requires) for m in METHODS.values())
    with pytest.raises(ValueError, match="method 'suffixdecoding' cannot be replayed: it needs arctic-inference"):
        resolve(["suffixdecoding"], need="replay")
    with pytest.raises(ValueError, match="method 'oracle' does not generate"):
        resolve(["oracle"], need="generate")
    assert [m.name for m in resolve(["hf4", "ngram", "hf-prompt-lookup-4"])] == ["hf-prompt-lookup-4",
                                                                                  "lookahead-ngram"]


def test_vllm_rule_is_hf_rule_with_a_minimum():
    """vLLM's proposer with min_n=1 drafts what HF's rule drafts; a higher minimum drafts nothing on a short match."""
    tokens = [5, 6, 7, 8, 5, 6]
    hf, vllm, strict = PromptLookup(4, 10, exact=False), VllmNgram(1, 4), VllmNgram(3, 4)
    for drafter in (hf, vllm, strict):
        drafter.extend(tokens)
    assert vllm.propose(3).tolist() == hf.propose(3).tolist() == [7, 8, 5]
    assert strict.propose(3).tolist() == []


@settings(max_examples=40)
@given(token_lists(max_size=80, vocab=5), st.integers(1, 4), st.integers(1, 6))
def test_hf_rule_in_numba_drafts_what_transformers_drafts(tokens, ngram, budget):
    """PromptLookup(exact=False) proposes exactly what transformers' get_candidates proposes."""
    exact, fast = PromptLookup(ngram, budget, exact=True), PromptLookup(ngram, budget, exact=False)
    exact.extend(tokens)
    fast.extend(tokens)
    if len(tokens) >= 2:
        assert exact.propose(budget).tolist() == fast.propose(budget).tolist()


def test_trace_file_text_and_ids(trace_file):
    """Text fields are tokenized, id fields taken as they are."""
    traces, errors = read_traces(trace_file)
    assert errors == [] and len(traces) == 2
    assert bytes(traces[0][1].tolist()).decode().startswith("def surface(")
    assert traces[1][1].tolist() == [8, 9, 5, 6, 7, 8, 1]


def test_bad_lines_are_reported_by_file_and_line_and_skipped(tmp_path):
    """Each bad line gets one message naming file and line; good lines are still read."""
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "ab", "output": "ab"}, {"prompt": "x"}, "not json", {"prompt_ids": [1], "output_ids": [300]},
        {"prompt": "a", "output": [1, "x"]}, {"prompt": "a", "output": ""}, "[1, 2]",
    ])
    traces, errors = read_traces(path, load_tokenizer(None))
    assert len(traces) == 1
    assert errors == [
        f"{path}:2: missing field 'output' (expected one of 'output', 'output_ids', 'completion': text or a list "
        "of token ids)",
        f"{path}:3: not JSON (Expecting value at column 1)",
        f"{path}:4: token id 300 in 'output_ids' is outside the tokenizer's vocabulary [0, 256)",
        f"{path}:5: field 'output' must be text or a list of integer token ids, got a list holding str 'x'",
        f"{path}:6: empty output: nothing to measure",
        f"{path}:7: expected a JSON object, got list",
    ]


def test_unreadable_file_is_one_error(tmp_path):
    """A missing file is reported, not raised."""
    traces, errors = read_traces(tmp_path / "missing.jsonl")
    assert traces == [] and errors[0].startswith(f"{tmp_path / 'missing.jsonl'}: cannot read:")


def test_tokenizers():
    """None is UTF-8 bytes; a missing path says so; the GPT-2 folder loads from vocab.json + merges.txt."""
    assert load_tokenizer(None).encode("é") == [195, 169]
    with pytest.raises(ValueError, match="cannot load tokenizer './nope': no such file or folder"):
        load_tokenizer("./nope")
    if GPT2.is_dir():
        tok = load_tokenizer(str(GPT2))
        assert tok.vocab_size == 50257 and tok.encode("hello world") == [31373, 995]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_history_gives_old_file_as_prompt_and_new_as_output(tmp_path):
    """Each commit that modifies a text file gives (old file, new file); other folders are refused by name."""
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.bin").write_bytes(b"\0\1")
    git("add", ".")
    git("commit", "-qm", "one")
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b.bin").write_bytes(b"\0\2")
    git("commit", "-qam", "two")
    [(prompt, output)] = git_traces(tmp_path)
    assert bytes(prompt.tolist()) == b"x = 1\n" and bytes(output.tolist()) == b"x = 2\n"
    (tmp_path.parent / "plain").mkdir(exist_ok=True)
    with pytest.raises(ValueError, match="plain: not a git repository"):
        git_traces(tmp_path.parent / "plain")


def test_forced_replay_tells_apart_prompts_sharing_a_long_start():
    """Prompts with the same first 48 tokens are recognised by their whole prompt; prefixes are refused."""
    start = list(range(3, 60))
    traces = [(start + [70], [71, 72]), (start + [80], [81])]
    forced = ForcedReplay(traces, pad_token_id=0, eos_token_id=1)
    ids = torch.tensor([[0] + start + [80], start + [70, 71]])
    assert forced(ids, torch.zeros(2, 100)).argmax(-1).tolist() == [81, 72]
    with pytest.raises(ValueError, match="prefixes of one another"):
        ForcedReplay(traces + [(start, [5])], 0, 1)
    assert len(distinct_prompts(traces + [(start, [5])])) == 2


def test_e2e_methods_write_the_recorded_outputs():
    """On a forced tiny model every method writes each recorded output, at batch 1 and 2."""
    traces = e2e.synthetic_traces(2, prompt_len=40, new_tokens=12, vocab=90)
    vocab, eos = e2e.free_id(traces, 90)
    model = e2e.random_model("tiny", vocab, eos)
    methods = ["hf-greedy", "hf-prompt-lookup-2", "lookahead-ngram"]
    timings = e2e.run_e2e(model, traces, "synthetic", methods, batch_sizes=(1, 2), eos=eos, max_new=12, repeats=2)
    assert [(t.batch, t.method) for t in timings] == [(1, m) for m in methods] + [(2, m) for m in methods[::2]]
    assert all(t.mismatches == 0 and t.tokens == 24 for t in timings)
    assert "| synthetic | 1 | lookahead-ngram | 24 |" in e2e.markdown(timings)


def test_bench_traces_prints_every_method(trace_file, capsys):
    """`bench traces FILE` prints one row per method with the predicted speedup for each cost ratio."""
    assert main(["bench", "traces", trace_file, "--no-progress", "--cost-ratio", "1.1", "2"]) == 0
    out = capsys.readouterr().out
    assert "| edits | lookahead-ngram |" in out and "| edits | hf-prompt-lookup-2 |" in out
    assert "| edits | lookahead-suffix-tree |" in out and "predicted speedup (cost ratio 2)" in out


def test_bench_traces_on_nothing_measurable_exits_non_zero(tmp_path, capsys):
    """A file with only bad lines: one error per line, then exit status 1; a method that cannot be replayed too."""
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a"}])
    assert main(["bench", "traces", bad, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1: missing field 'output'" in err and "nothing to measure" in err
    assert main(["bench", "traces", bad, "--methods", "hf-greedy"]) == 1
    assert "method 'hf-greedy' cannot be replayed: it is not a drafter" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["traces", "--budget", "0"], "argument --budget: expected an integer >= 1, got '0'"),
    (["traces", "--tree-budget", "x"], "argument --tree-budget: expected an integer >= 1, got 'x'"),
    (["traces", "--cost-ratio", "0"], "argument --cost-ratio: expected a number >= 1, got '0'"),
    (["traces", "--cost-ratio", "nan"], "argument --cost-ratio: expected a number >= 1, got 'nan'"),
    (["traces", "--cost-tokens", "1"], "argument --cost-tokens: expected an integer >= 2, got '1'"),
    (["traces", "--modes", "bogus"], "argument --methods/--modes: unknown method 'bogus'; expected one of"),
    (["traces", "--methods", "suffix"], "method 'suffix' is ambiguous: say lookahead-suffix"),
    (["traces", "--max-commits", "-3"], "argument --max-commits: expected an integer >= 1, got '-3'"),
    (["e2e", "--shape", "7b"], "argument --shape: invalid choice: '7b'"),
    (["e2e", "--batch", "1", "0"], "argument --batch: expected an integer >= 1, got '0'"),
    (["e2e", "--max-new", "0"], "argument --max-new: expected an integer >= 1, got '0'"),
    (["e2e", "--methods", "beam"], "argument --methods: unknown method 'beam'"),
    (["e2e", "--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (["index", "--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    (["index", "--sizes", "100", "-1"], "argument --sizes: expected an integer >= 1, got '-1'"),
])
def test_bench_argument_errors_are_one_line_and_status_2(args, message, capsys):
    """A bad argument is argparse's usage and one error line, exit status 2, no traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"lookahead bench {args[0]}: error: ")


def test_bench_e2e_tiny_synthetic(capsys):
    """`bench e2e --shape tiny --synthetic` times every method, checks they write the recording, predicts."""
    args = ["bench", "e2e", "--shape", "tiny", "--synthetic", "--prompts", "2", "--max-prompt", "48", "--max-new",
            "8", "--no-progress"]
    assert main(args + ["--methods", "greedy", "lookahead-ngram", "lookahead-suffix-tree"]) == 0
    out = capsys.readouterr().out
    assert "| synthetic | 1 | lookahead-ngram | 16 |" in out and "NO (" not in out
    assert "Forward cost here" in out and "| synthetic | lookahead-suffix-tree |" in out  # predicted vs measured
    assert main(args + ["--methods", "oracle"]) == 1
    assert "method 'oracle' does not generate" in capsys.readouterr().err


def test_bench_e2e_pretrained_model(capsys):
    """With --model the model writes its own output (not forced) and every method writes the same tokens."""
    if not (STORIES / "config.json").exists():
        pytest.skip(f"{STORIES} not found")
    assert main(["bench", "e2e", "--model", str(STORIES), "--synthetic", "--prompts", "1", "--max-prompt", "32",
                 "--max-new", "8", "--methods", "hf-greedy", "lookahead-ngram", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "outputs written by the model" in out and "| synthetic | 1 | lookahead-ngram | 8 |" in out
    assert "NO (" not in out


def test_bench_index_and_plot(trace_file, tmp_path, capsys):
    """`bench index` prints µs per step for each index and HF; --plot writes a PNG when matplotlib is there."""
    plot = tmp_path / "index.png"
    args = ["bench", "index", trace_file, "--sizes", "100", "200", "--steps", "5", "--no-progress"]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(plot)]
    except ImportError:
        plot = None
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| lookahead-ngram |" in out and "| hf-prompt-lookup-2 |" in out
    assert plot is None or plot.stat().st_size > 1000


def test_tokens_per_forward_plot_gives_each_of_many_methods_its_own_colour(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from lookahead.bench import plot

    figures = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: figures.append(fig))
    methods = [f"m{i}" for i in range(13)]  # more than the default colour cycle's 10
    plot.tokens_per_forward({(m, "d"): 1.0 + i for i, m in enumerate(methods)}, methods, ["d"], str(tmp_path / "x.png"))
    colours = [tuple(bar.get_facecolor()) for bar in figures[0].axes[0].patches]
    assert len(colours) == 13 and len(set(colours)) == 13
    plt.close(figures[0])
