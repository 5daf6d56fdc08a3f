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
from lookahead.bench.peers import PromptLookup
from lookahead.bench.replay import (ReplayStats, accepted_path_length, forward_cost, predicted_speedup,
                                    replay_trace)
from lookahead.bench.traces_io import load_tokenizer, read_traces
from lookahead.cli import main
from lookahead.index import NgramIndex
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


def test_tree_acceptance_follows_the_matching_branch():
    """Greedy tree acceptance walks the children that match the target."""
    assert accepted_path_length(np.array([5, 6, 7]), np.array([-1, -1, 1]), np.array([6, 7, 9])) == 2
    assert accepted_path_length(np.array([5]), np.array([-1]), np.array([4])) == 0


def test_predicted_speedup_is_tokens_over_linear_cost():
    """Each step costs forward_cost(1 + drafted); with a ratio of 1 the prediction is tokens per forward."""
    stats = ReplayStats(tokens=40, steps=10, drafted=100, accepted=30)
    assert predicted_speedup(stats, 1.0) == pytest.approx(4.0)
    assert predicted_speedup(stats, 2.0, cost_tokens=11) == pytest.approx(40 / (10 + 0.1 * 100))
    assert forward_cost(11, 2.0, 11) == pytest.approx(2.0) and forward_cost(21, 2.0, 11) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="cost_tokens must be >= 2, got 1"):
        forward_cost(3, 2.0, 1)


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
        f"{path}:3: not valid JSON (Expecting value at column 1)",
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
    methods = ["greedy", "hf-prompt-lookup", "lookahead-ngram"]
    timings = e2e.run_e2e(model, traces, "synthetic", methods, batch_sizes=(1, 2), eos=eos, max_new=12)
    assert [(t.batch, t.method) for t in timings] == [(1, m) for m in methods] + [(2, m) for m in methods[::2]]
    assert all(t.mismatches == 0 and t.tokens == 24 for t in timings)
    assert "| synthetic | 1 | lookahead-ngram | 24 |" in e2e.markdown(timings)


def test_bench_traces_prints_every_mode_and_hf(trace_file, capsys):
    """`bench traces FILE` prints one row per method with the predicted speedup for each cost ratio."""
    assert main(["bench", "traces", trace_file, "--no-progress", "--cost-ratio", "1.1", "2"]) == 0
    out = capsys.readouterr().out
    assert "| edits | lookahead ngram |" in out and "| edits | HF prompt lookup (ngram 2) |" in out
    assert "predicted speedup (cost ratio 2)" in out


def test_bench_traces_on_nothing_measurable_exits_non_zero(tmp_path, capsys):
    """A file with only bad lines: one error per line, then non-zero exit; so does an unknown mode."""
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a"}])
    assert main(["bench", "traces", bad, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1: missing field 'output'" in err and "nothing to measure" in err
    assert main(["bench", "traces", bad, "--modes", "bogus"]) == 1
    assert "unknown mode 'bogus'; available:" in capsys.readouterr().err


def test_bench_e2e_tiny_synthetic(capsys):
    """`bench e2e --shape tiny --synthetic` times every method and checks they agree; unknown shapes are refused."""
    args = ["bench", "e2e", "--shape", "tiny", "--synthetic", "--prompts", "2", "--max-prompt", "48", "--max-new",
            "8", "--no-progress"]
    assert main(args + ["--methods", "greedy", "lookahead-ngram"]) == 0
    out = capsys.readouterr().out
    assert "| synthetic | 1 | lookahead-ngram | 16 |" in out and "NO (" not in out
    assert "Forward cost ratio here" in out and "| synthetic | lookahead-ngram |" in out  # predicted vs measured
    assert main(["bench", "e2e", "--shape", "7b"]) == 1
    assert "unknown shape '7b'; expected one of tiny, gpt2-small, 1b" in capsys.readouterr().err
    assert main(args + ["--methods", "beam"]) == 1
    assert "unknown method 'beam'" in capsys.readouterr().err


def test_bench_e2e_pretrained_model(capsys):
    """With --model the model writes its own output (not forced) and every method writes the same tokens."""
    if not (STORIES / "config.json").exists():
        pytest.skip(f"{STORIES} not found")
    assert main(["bench", "e2e", "--model", str(STORIES), "--synthetic", "--prompts", "1", "--max-prompt", "32",
                 "--max-new", "8", "--methods", "greedy", "lookahead-ngram", "--no-progress"]) == 0
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
    assert "| lookahead ngram |" in out and "| HF prompt lookup (ngram 2) |" in out
    assert plot is None or plot.stat().st_size > 1000
