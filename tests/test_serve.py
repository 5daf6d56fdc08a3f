"""`lookahead serve` with the real `openai` client against a live server on 127.0.0.1 (an ephemeral port): every
greedy answer equals `model.generate(do_sample=False)` on its own prompt, whatever else is in the batch; streams are
OpenAI's; a client that disconnects frees its row; bad input is a 400 naming the field and hurts nobody else. The live
server runs twice: on the dynamic cache and on the static slot cache."""
from __future__ import annotations

import json
import sys
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from lookahead import models  # noqa: E402
from lookahead.serve.app import chat_text  # noqa: E402
from lookahead.serve.server import Running, build  # noqa: E402

NAME = "stories260K"
PROMPTS = ["Once upon a time, there was a little girl named Lily.", "Tom and his dog went to the park.",
           "The sun was hot. Ben wanted to swim in the lake, so he", "One day, a big red ball rolled into the garden",
           "Sara had a toy car. She liked her toy car very much. One day,", "The cat sat on the mat and looked at"]


@pytest.fixture(scope="module")
def reference():
    """The bundled model in fp32 and its tokenizer, for the expected answers (the server has its own copy)."""
    model, tok, _ = models.load(models.default_model_path())
    return model, tok


@pytest.fixture(scope="module", params=["dynamic", "static"])
def server(request):
    """A live server on the bundled model, its rows in transformers' dynamic cache or in the static slot cache
    (`batch.StaticServingLM`: eager on a CPU, the step the GPU captures as CUDA graphs); yields (base url, its
    `Served`)."""
    app, served = build(cache_implementation=request.param, max_model_len=1024 if request.param == "static" else None)
    assert (served.engine.static is not None) == (request.param == "static")
    with Running(app) as running:
        yield running.url, served
    served.engine.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


def greedy(reference, ids: list, max_new: int) -> str:
    """What `model.generate(do_sample=False)` writes after `ids`."""
    import torch

    model, tok = reference
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def prompt_ids(reference, text: str) -> list:
    return reference[1](text)["input_ids"]


def test_completion_and_chat_equal_greedy_streamed_or_not(client, reference):
    """/v1/completions and /v1/chat/completions (no chat template: the contents, a line each), streamed or not."""
    prompt = PROMPTS[0]
    want = greedy(reference, prompt_ids(reference, prompt), 48)
    done = client.completions.create(model=NAME, prompt=prompt, max_tokens=48, temperature=0)
    assert done.choices[0].text == want
    assert done.usage.prompt_tokens == len(prompt_ids(reference, prompt))
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=48, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    messages = [{"role": "system", "content": "A story."}, {"role": "user", "content": PROMPTS[1]}]
    want = greedy(reference, prompt_ids(reference, chat_text(messages)), 40)
    chat = client.chat.completions.create(model=NAME, messages=messages, max_completion_tokens=40, temperature=0)
    assert chat.choices[0].message.content == want and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("length", "stop")
    stream = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
    assert stream[-1].choices == [] and stream[-1].usage.completion_tokens == chat.usage.completion_tokens
    assert all(c.usage is None for c in stream[:-1])


def test_stream_is_openais_server_sent_events(server):
    """Each event is `data: {json}` then a blank line; the last is `data: [DONE]`."""
    body = {"model": NAME, "prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream("POST", server[0] + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[6:])["object"] == "text_completion"
    assert json.loads(events[-3][6:])["choices"][0]["finish_reason"] in ("length", "stop")


def test_sixteen_concurrent_clients_of_mixed_lengths_each_equal_greedy(server, client, reference):
    """16 clients at once (streamed and not, 8 to 120 new tokens): none lost, each equal to its own greedy answer;
    afterwards no row runs."""
    jobs = [(PROMPTS[i % len(PROMPTS)] + " " * (i % 3), 8 + (i * 37) % 113, i % 2 == 0) for i in range(16)]

    def ask(job):
        prompt, max_new, stream = job
        if stream:
            chunks = client.completions.create(model=NAME, prompt=prompt, max_tokens=max_new, temperature=0,
                                               stream=True)
            return "".join(c.choices[0].text for c in chunks)
        return client.completions.create(model=NAME, prompt=prompt, max_tokens=max_new, temperature=0).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, jobs))
    for (prompt, max_new, _), text in zip(jobs, got):
        assert text == greedy(reference, prompt_ids(reference, prompt), max_new), (prompt, max_new)
    assert _wait_for(lambda: server[1].engine.rows == [])
    assert server[1].engine.peak > 4  # the clients were batched together
    assert _metric(server[0], "lookahead_running_rows") == 0


def test_a_client_that_disconnects_mid_stream_frees_its_row(server, client):
    """Closing a stream after a few chunks cancels its row: it leaves the batch (counted as cancelled)."""
    engine = server[1].engine
    freed = engine.freed
    stream = client.completions.create(model=NAME, prompt=PROMPTS[3], max_tokens=400, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert _wait_for(lambda: engine.freed == freed + 1 and engine.rows == [])
    assert _metric(server[0], 'lookahead_rows_finished_total{reason="cancelled"}') >= 1


BAD = [  # (body or raw text, the field the error names)
    ("{not json", None),
    ({"model": NAME, "prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"model": "gpt-4o", "prompt": "x"}, "model"),
    ({"model": NAME, "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": NAME, "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": NAME, "prompt": "x", "n": 0}, "n"),
    ({"model": NAME, "prompt": "x", "stop": 7}, "stop"),
    ({"model": NAME, "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": NAME, "prompt": "x", "seed": 1.5}, "seed"),
    ({"model": NAME, "prompt": "x " * 600}, "prompt"),
    ({"model": NAME, "prompt": "x", "max_tokens": 600}, "max_tokens"),
    ({"model": NAME, "prompt": [1, 2, 100000]}, "prompt"),
    ({"model": NAME, "prompt": {"text": "x"}}, "prompt"),
    ({"model": NAME}, "prompt"),
    ({"model": NAME, "prompt": "x", "prediction": "x"}, "prediction"),
    ({"model": NAME, "prompt": "x", "prediction": {"type": "text", "content": "x"}}, "prediction.type"),
    ({"model": NAME, "prompt": "x", "prediction": {"type": "content", "content": 5}}, "prediction.content"),
    ({"model": NAME, "prompt": "x", "lookahead": []}, "lookahead"),
    ({"model": NAME, "prompt": "x", "lookahead": {"lookup": "bogus"}}, "lookahead.lookup"),
    ({"model": NAME, "prompt": "x", "lookahead": {"num_draft_tokens": "x"}}, "lookahead.num_draft_tokens"),
    ({"model": NAME, "prompt": "x", "lookahead": {"max_ngram": 0}}, "lookahead.max_ngram"),
    ({"model": NAME, "prompt": "x", "lookahead": {"colour": 1}}, "lookahead.colour"),
    ({"model": NAME, "prompt": "x", "lookahead": {"draft": "tree"}}, "lookahead.draft"),
    ({"model": NAME, "prompt": "x", "logprobs": 2}, "logprobs"),
]
BAD_CHAT = [
    ({"model": NAME}, "messages"),
    ({"model": NAME, "messages": "hi"}, "messages"),
    ({"model": NAME, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"model": NAME, "messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
     "max_completion_tokens"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x " * 600}]}, "messages"),
]


def test_bad_input_is_a_400_naming_the_field_and_others_go_on(server, client, reference):
    """Every bad body gets OpenAI's error JSON naming the field, while a stream in flight runs to its greedy end."""
    url = server[0]
    want = greedy(reference, prompt_ids(reference, PROMPTS[4]), 200)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("text", "".join(
        c.choices[0].text for c in client.completions.create(model=NAME, prompt=PROMPTS[4], max_tokens=200,
                                                             temperature=0, stream=True))))
    thread.start()
    for path, cases in (("/v1/completions", BAD), ("/v1/chat/completions", BAD_CHAT)):
        for body, param in cases:
            content = body if isinstance(body, str) else json.dumps(body)
            r = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=60)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)
            assert error["message"]
    thread.join()
    assert box["text"] == want
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=3)


def test_prediction_is_drafted_from_and_counted(client, reference):
    """A prediction equal to the answer is drafted whatever the cost curve says and accepted in bulk (a few
    forwards for 80 tokens); usage counts as OpenAI does (the prediction's tokens that appear in the answer are
    accepted, the rest rejected); an unrelated one is rejected; the text is the greedy one either way."""
    prompt = PROMPTS[5]
    want = greedy(reference, prompt_ids(reference, prompt), 80)
    good = client.completions.create(model=NAME, prompt=prompt, max_tokens=80, temperature=0,
                                     extra_body={"prediction": {"type": "content", "content": want}})
    details = good.usage.completion_tokens_details
    predicted = len(reference[1](want, add_special_tokens=False)["input_ids"])
    assert good.choices[0].text == want
    # the prediction's text tokenized alone splits a few words otherwise than the answer's tokens
    assert details.accepted_prediction_tokens >= 0.85 * good.usage.completion_tokens
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == predicted
    assert good.usage.lookahead["prediction_accepted"] >= good.usage.completion_tokens // 2
    assert good.usage.lookahead["forwards"] <= good.usage.completion_tokens // 4
    parts = [{"type": "text", "text": "Zebras dance "}, {"type": "text", "text": "under the moon."}]
    bad = client.completions.create(model=NAME, prompt=prompt, max_tokens=80, temperature=0,
                                    extra_body={"prediction": {"type": "content", "content": parts}})
    assert bad.choices[0].text == want
    assert bad.usage.completion_tokens_details.accepted_prediction_tokens < details.accepted_prediction_tokens
    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=80, temperature=0)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert good.usage.lookahead["forwards"] < plain.usage.lookahead["forwards"]


def test_lookahead_options_per_request(client, reference):
    """`"lookup": "none"` drafts nothing (a forward per token); suffix trees, n-gram options and recycled
    predictions (chains and trees) keep greedy text."""
    prompt = PROMPTS[0] + " Lily liked to play. Lily liked to play. Lily"
    want = greedy(reference, prompt_ids(reference, prompt), 60)
    none = client.completions.create(model=NAME, prompt=prompt, max_tokens=60, temperature=0,
                                     extra_body={"lookahead": {"lookup": "none"}})
    assert none.choices[0].text == want
    assert none.usage.lookahead["draft_tokens"] == 0
    assert none.usage.lookahead["forwards"] == none.usage.completion_tokens
    for options in ({"lookup": "suffix", "draft": "tree", "max_draft_nodes": 16}, {"lookup": "suffix"},
                    {"lookup": "ngram", "max_ngram": 2, "num_draft_tokens": 4}, {"lookup": "recycle"},
                    {"lookup": "suffix+recycle", "draft": "tree"}):
        got = client.completions.create(model=NAME, prompt=prompt, max_tokens=60, temperature=0,
                                        extra_body={"lookahead": options})
        assert got.choices[0].text == want, options


def test_stop_strings_and_sampling(client, reference):
    """`stop` cuts the text before the first stop string; sampling with a seed replays, `n` gives n choices."""
    prompt = PROMPTS[0]
    want = greedy(reference, prompt_ids(reference, prompt), 60)
    word = re.findall(r"[a-z]{4,}", want)[2]
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=60, temperature=0, stop=[word, "zzzz"])
    assert got.choices[0].text == want[: want.index(word)] and got.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=NAME, prompt=prompt, max_tokens=60, temperature=0, stop=word, stream=True))
    assert streamed == got.choices[0].text
    kwargs = dict(model=NAME, prompt=prompt, max_tokens=30, temperature=0.9, top_p=0.95, seed=7, n=2)
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len(first.choices) == 2 and 2 <= first.usage.completion_tokens <= 60
    assert all(c.finish_reason in ("length", "stop") for c in first.choices)


def test_models_health_and_metrics(server, client):
    """/v1/models names the model; /health answers; /metrics has the counters, gauges and histograms."""
    assert [m.id for m in client.models.list()] == [NAME]
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    text = httpx.get(server[0] + "/metrics").text
    for name in ("lookahead_requests_total", "lookahead_generation_tokens_total", "lookahead_tokens_per_forward",
                 "lookahead_acceptance_rate", "lookahead_queue_depth", "lookahead_running_rows",
                 "lookahead_time_to_first_token_seconds_bucket", "lookahead_time_per_output_token_seconds_bucket"):
        assert name in text, name


def test_memory_drafts_a_request_from_earlier_answers(reference):
    """With --memory, asking again what was asked before drafts the answer from memory: fewer forwards, same text."""
    app, served = build(memory=4096, name=NAME)
    try:
        with Running(app) as running:
            c = openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0, timeout=120)
            prompt = PROMPTS[2]
            want = greedy(reference, prompt_ids(reference, prompt), 80)
            first = c.completions.create(model=NAME, prompt=prompt, max_tokens=80, temperature=0)
            second = c.completions.create(model=NAME, prompt=prompt, max_tokens=80, temperature=0)
    finally:
        served.engine.stop()
    assert first.choices[0].text == second.choices[0].text == want
    assert second.usage.lookahead["accepted_tokens"] > first.usage.lookahead["accepted_tokens"]
    assert second.usage.lookahead["forwards"] < first.usage.lookahead["forwards"]


def test_serve_is_a_subcommand(cli):
    """`lookahead serve --help` lists its options."""
    status, out, _ = cli("serve", "--help")
    assert status == 0 and "--memory" in out and "--replicas" in out


def test_the_console_server_answers_and_stops_on_sigterm(reference):
    """`lookahead serve` in a process of its own (its decoding loop on the thread that loaded the model, uvicorn in
    another: `Engine.run`) answers a real client with greedy's text and stops cleanly on SIGTERM, as on Ctrl-C."""
    import signal
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "lookahead", "serve", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        assert _wait_for(up, 120) and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        done = c.completions.create(model=NAME, prompt=PROMPTS[5], max_tokens=40, temperature=0)
        assert done.choices[0].text == greedy(reference, prompt_ids(reference, PROMPTS[5]), 40)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def _wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and "}" not in name:
            return float(line.rsplit(" ", 1)[1])
        if "{" in name and line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_a_row_that_fails_its_prefill_ends_alone_and_the_loop_goes_on(reference):
    """An error while a row is admitted ends that row with an error; a row running beside it, and one arriving
    after, decode to their greedy end."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    class Broken(Row):
        def start(self, *args, **kwargs):
            raise RuntimeError("broken on purpose")

    model, tok = models.load(models.default_model_path())[:2]
    engine = Engine(model).start()
    try:
        done = {}

        def row(cls, prompt, name):
            ids = prompt_ids(reference, prompt)
            return cls(ids, 40, (), Sampling(0.0), Drafting(), tok,
                       emit=lambda event: event[0] == "done" and done.setdefault(name, event[1]))

        first, broken = row(Row, PROMPTS[0], "first"), row(Broken, PROMPTS[1], "broken")
        engine.submit(first)
        engine.submit(broken)
        assert _wait_for(lambda: "first" in done and "broken" in done)
        after = row(Row, PROMPTS[2], "after")
        engine.submit(after)
        assert _wait_for(lambda: "after" in done)
    finally:
        engine.stop()
    assert done == {"first": "length", "broken": "error", "after": "length"}
    assert engine.error is None
    for r, prompt in ((first, PROMPTS[0]), (after, PROMPTS[2])):
        assert r.text.text == greedy(reference, prompt_ids(reference, prompt), 40)


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_windowed_models_batch_each_request_equal_to_greedy(layer_types):
    """A model whose layers attend to a 16-token window (Mistral-shaped: every layer; Gemma-3-shaped: mixed) is
    served too: three requests joining one batch a step apart each decode to `model.generate`'s tokens."""
    import transformers as T

    from lookahead.serve.engine import Engine

    tok = models.load(models.default_model_path())[1]
    small = dict(vocab_size=512, bos_token_id=1, eos_token_id=None, pad_token_id=0, hidden_size=32,
                 intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 max_position_embeddings=1024, initializer_range=0.3, sliding_window=16)
    config = T.MistralConfig(**small) if layer_types is None else T.Gemma3TextConfig(layer_types=layer_types, **small)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    g = torch.Generator().manual_seed(3)
    prompts = []
    for k in range(3):
        span = torch.randint(3, 500, (20 + 7 * k,), generator=g)
        prompts.append(torch.cat([span, torch.randint(3, 500, (15,), generator=g), span, span[:8]]).numpy())
    want = [model.generate(torch.as_tensor(p)[None], do_sample=False, max_new_tokens=48, pad_token_id=0)[0, len(p):]
            .tolist() for p in prompts]
    engine = Engine(model)
    rows = _joined(engine, prompts, 48, tok)
    assert engine.error is None and [row.out for row in rows] == want


def _joined(engine, prompts: list, max_new: int, tok, predictions=None) -> list:
    """Start `engine`, submit a greedy row per prompt a step apart (so that they join the running batch), wait until
    each is done, stop it; the rows."""
    from lookahead.serve.row import Drafting, Row, Sampling

    engine.start()
    done, rows = {}, []
    try:
        for k, prompt in enumerate(prompts):
            rows.append(Row(prompt.astype(np.int64), max_new, (), Sampling(0.0), Drafting(), tok,
                            prediction=None if predictions is None else predictions[k],
                            emit=lambda event, k=k: event[0] == "done" and done.setdefault(k, event[1])))
            engine.submit(rows[-1])
            time.sleep(0.05)
        assert _wait_for(lambda: len(done) == len(prompts), 120)
    finally:
        engine.stop()
    return rows


def served_family(name: str, least: int | None = None, cache_implementation: str | None = None, extra=None,
                  engine: list | None = None):
    """Serve the family's tiny model (`extra`: config fields of its own) three requests that join one batch a step
    apart, each drafting from a prediction that is greedy's answer with every fifth token changed (accepted up to the
    change, then rejected); assert each decodes to `model.generate`'s tokens with at least `least` drafts accepted
    (default F.NEW); the model (`engine`, a list: the engine is appended to it)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import families as F

    from lookahead.serve.engine import Engine

    if name not in [n for n, _, _ in F.families()]:
        pytest.skip(f"transformers has no {name}")
    tok = models.load(models.default_model_path())[1]
    model = F.build(name, extra) if extra else F.tiny_model(name)
    prompts = [F.prompt(30 + 5 * k, seed=k)[0].numpy() for k in range(3)]
    want = [F.reference(model, torch.as_tensor(p)[None]).tolist() for p in prompts]
    predictions = [np.array([t if (i + 1) % 5 else (t + 1) % F.VOCAB for i, t in enumerate(w)]) for w in want]
    served = Engine(model, draft_cost=0, cache_implementation=cache_implementation, max_model_len=256)
    if engine is not None:
        engine.append(served)
    rows = _joined(served, prompts, F.NEW, tok, predictions)
    assert served.error is None and [row.out for row in rows] == want
    assert sum(row.stats.accepted_tokens for row in rows) >= (F.NEW if least is None else least)
    return model


@pytest.mark.parametrize("name", ["qwen3_5_text", "lfm2", "mamba2", "minimax", "recurrent_gemma", "zaya",
                                  "qwen4_exp_text", "xlstm", "rwkv"])
def test_recurrent_models_serve_each_joined_row_on_its_own_state(name):
    """A hybrid (gated delta net beside attention, short convolutions beside attention; RecurrentGemma, whose blocks
    hold their states on the modules: each batch keeps its own between forwards, a joining row's prefill leaves them
    alone; Zaya's convolved attention projections; Qwen4-Exp, whose indexer reads its keys' positions from the cache:
    joined rows keep them, padded like their keys) and a state-space model are
    served: three requests that join one batch a step apart, each drafting from a prediction that is greedy's answer
    with every fifth token changed (accepted up to the change, then rejected), decode to `model.generate`'s tokens,
    each row's recurrent states following its own accepted path."""
    # the tiny RecurrentGemma answers in long runs of one token, where a prediction's place is ambiguous: its rows
    # accept a few drafts each (the same with the attention-only Gemma 3), not the others' four in five
    model = served_family(name, least=6 if name == "recurrent_gemma" else None)
    from lookahead.model.recurrent import recurrent_modules

    assert not any(module._forward_pre_hooks for module in recurrent_modules(model))  # no request left its hooks


def _static_families() -> list:
    from lookahead.model.static import TESTED

    return sorted(set(TESTED) | {"llama4_text", "deepseek_v3", "deepseek_v32"})


@pytest.mark.parametrize("name", _static_families())
def test_the_static_cache_serves_each_joined_row_equal_to_greedy(name):
    """Served from the static slot cache (`cache_implementation="static"`; eager here, the step a GPU captures as
    CUDA graphs), every architecture a GPU serves from it by default (`static.TESTED`: full attention, sliding
    windows beside it in a ring of slots, every layer windowed, attention sinks, soft-capping, learned positions) and
    chunks, multi-head latent attention (buffers of their own) and an indexer's keys: three requests join one batch a
    step apart (the batch grows from one row to four) and decode to `model.generate`'s tokens, drafts rejected and
    accepted."""
    # some tiny models answer in long runs of one token, where a prediction's place is ambiguous (as RecurrentGemma's)
    served_family(name, least=6, cache_implementation="static")


def test_static_rows_leave_and_join_while_the_batch_moves(reference):
    """Rows of 8 to 60 new tokens join a static batch at set steps (the engine's turns run here, in order): a request
    takes the batch row another one left, so the running rows are in no batch order; the batch grows (1, 4, 16 rows)
    and shrinks as they leave, moving the running rows' slots each time; every row decodes to its greedy answer."""
    sizes = rows_joining_and_leaving(reference)
    assert 4 in sizes and 16 in sizes and any(b < a for a, b in zip(sizes, sizes[1:]))  # grown, and shrunk later


def rows_joining_and_leaving(reference) -> list:
    """Seven requests joining and leaving a static batch at set turns, each row checked against its greedy answer
    and the rows seen running out of batch order; the batch sizes the running rows moved to."""
    from lookahead.serve import batch
    from lookahead.serve.engine import Engine, _fast
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    sizes, moved = [], batch.StaticServingLM._compact
    engine = Engine(model, cache_implementation="static", max_model_len=256, draft_cost=(0.8, 0.08))
    prompts = [np.array(prompt_ids(reference, PROMPTS[i % len(PROMPTS)]), dtype=np.int64) for i in range(7)]
    lengths, when = [60, 8, 12, 40, 8, 30, 20], [1, 1, 2, 4, 9, 12, 12]  # the turn at which each request arrives
    rows, orders = [], []
    with pytest.MonkeyPatch.context() as patch, torch.inference_mode(), _fast(model):
        patch.setattr(batch.StaticServingLM, "_compact", lambda self, size: (sizes.append(size), moved(self, size)))
        for turn in range(400):
            for k in np.flatnonzero(np.array(when) == turn):
                rows.append(Row(prompts[k], lengths[k], (), Sampling(0.0), Drafting(), tok))
                engine.submit(rows[-1])
            if engine.rows or not engine.pending.empty():
                engine._turn()
                if engine.target is not None:
                    orders.append(engine.target.active.tolist())
    assert len(rows) == 7 and all(row.done for row in rows) and not engine.rows
    assert [row.out for row in rows] == [greedy_ids(reference, p, n) for p, n in zip(prompts, lengths)]
    assert [0, 2, 3, 1] in orders  # a joined row took a freed batch row: every row running, out of batch order
    return sizes


def _turned(engine, rows: list) -> list:
    """Submit `rows` to `engine` and turn its loop in this thread until every one is done, then stop it; the rows."""
    for row in rows:
        engine.submit(row)
    try:
        with torch.inference_mode():
            while not all(row.done for row in rows):
                engine._turn(wait=False)  # (rows that all ended at their prefill leave none running)
    finally:
        engine.stop()
    return rows


def greedy_ids(reference, prompt: np.ndarray, max_new: int) -> list:
    """The new token ids of `model.generate(do_sample=False)` after `prompt`."""
    with torch.inference_mode():
        out = reference[0].generate(torch.as_tensor(prompt)[None], max_new_tokens=max_new, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_a_static_row_asking_more_than_a_step_verifies_takes_the_fused_step(reference, monkeypatch, draft):
    """A static cache's step verifies at most `most` (63) draft tokens or nodes a row: a request asking for 64 has
    its budget cut to that when it starts, so that it takes `generate`'s fused step as any other row, with greedy's
    tokens."""
    from lookahead.serve.batch import StaticServingLM
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    fused = []
    step = Engine._step_fused
    monkeypatch.setattr(Engine, "_step_fused", lambda self, f, *a: fused.append(len(f.rows)) or step(self, f, *a))
    prompt = np.array(prompt_ids(reference, PROMPTS[0]) * 3, dtype=np.int64)
    drafting = Drafting(lookup="suffix", draft=draft, num_draft_tokens=64 if draft == "chain" else None,
                        max_draft_nodes=64 if draft == "tree" else None)
    row = Row(prompt, 30, (), Sampling(0.0), drafting, tok)
    _turned(Engine(model, draft_cost=(0.0, 0.05), cache_implementation="static", max_model_len=256), [row])
    assert row.out == greedy_ids(reference, prompt, 30)
    assert (row.length.max_tokens if draft == "chain" else row.tree.max_nodes) == StaticServingLM.most == 63
    assert fused and row.stats.draft_tokens > 0


def test_the_static_cache_refuses_what_it_cannot_hold(reference):
    """A request longer than the static cache's rows ends with an error (the app answers it with a 400 first); a
    hybrid with recurrent states asked for the static cache is refused by name; an unknown cache is named."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    engine = Engine(model, cache_implementation="static", max_model_len=64)
    assert engine.limit == 64
    done = {}
    row = Row(np.arange(3, 43, dtype=np.int64), 30, (), Sampling(0.0), Drafting(), tok,
              emit=lambda event: event[0] == "done" and done.setdefault("row", event[1]))
    engine.start()
    try:
        engine.submit(row)
        assert _wait_for(lambda: "row" in done)
    finally:
        engine.stop()
    assert done == {"row": "error"} and engine.error is None
    with pytest.raises(ValueError, match="cache_implementation must be"):
        Engine(model, cache_implementation="offloaded")
    sys.path.insert(0, str(Path(__file__).parent))
    import families as F

    if "qwen3_5_text" in F.causal_types():
        with pytest.raises(ValueError, match="recurrent states of .* in the dynamic cache only"):
            Engine(F.tiny_model("qwen3_5_text"), cache_implementation="static")


def test_a_full_batch_of_weak_bets_verifies_no_drafts_and_a_strong_one_pays_for_all(reference):
    """The engine's step width sees the whole batch (`policy.batch_width`): 64 greedy rows whose drafts were rarely
    accepted verify none (a forward over 64 rows costs what all its tokens cost), while one row whose prediction is
    being accepted widens the step for the others too; a single row is left to its own policy."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    engine = Engine(model, draft_cost=(0.0, 0.05))  # a cost given: taken as it is, no step timed
    ids = np.array(prompt_ids(reference, PROMPTS[0]) * 3, dtype=np.int64)  # repeats: every row has a match

    def row(prediction=None):
        r = Row(ids, 64, (), Sampling(0.0), Drafting(), tok, prediction=prediction)
        r.start(None, *engine.sizing(r), "cpu")
        r.length.accepted[:], r.length.rejected[:] = 1.0, 9.0  # drafts accepted 1 time in 10
        return r

    weak = [row() for _ in range(64)]
    assert all(r.index.match_length > 0 for r in weak)
    budgets = [r.budget(64) for r in weak]
    assert engine._width(weak, budgets, max(budgets)) == 0
    strong = row(prediction=ids[:40].copy())
    strong.stats.prediction_accepted = 200  # its prediction has been right so far
    pair = [weak[0], strong]
    budgets = [r.budget(2) for r in pair]
    width = engine._width(pair, budgets, max(budgets))
    assert width > 0 and len(strong.draft(budgets[1], width, width)) == width
    assert len(weak[0].draft(budgets[0], width, width)) <= width


@pytest.mark.parametrize("path", ["fused", "fused with predictions", "engine"])
def test_a_batch_whose_drafts_lost_steps_its_greedy_rows_plainly(reference, monkeypatch, path):
    """Where steps with drafts gave fewer tokens per second than plain ones at a batch size (`StepTimes.drafts`),
    the batch's greedy rows verify no drafts: on the fused step its kernel finds no width worth a draft (with
    predictions, wrong everywhere, `Engine._predicted` finds none); on the engine's own they ask their policies for
    none (at 64 rows that work cost 1-2 ms a step). Their policies still learn from the drafts they would have
    verified (`Row.watch`), and they gain greedy's tokens."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    engine = Engine(model)  # its steps timed
    engine.times.plain[4], engine.times.wide[4] = 1e-3, 1.0  # 3-4 rows: drafts gave a tenth of plain steps' rate
    engine.times.PROBE = 10**9  # and no step probes the other way
    asked, kinds = [], []
    budget, step = Row.budget, Engine._step_fused
    monkeypatch.setattr(Row, "budget", lambda row, b: asked.append(b) or budget(row, b))
    monkeypatch.setattr(Engine, "_step_fused", lambda self, f, *a: kinds.append(len(f.rows)) or step(self, f, *a))
    if path == "engine":
        monkeypatch.setattr(Engine, "_fused_for", lambda self, batch, most: None)
    ids = [np.array(prompt_ids(reference, text) * 2, dtype=np.int64) for text in PROMPTS[:3]]  # repeats: matches
    wrong = None if path == "fused" else np.full(40, tok.eos_token_id or 0, dtype=np.int64)
    rows = [Row(p, 12, (), Sampling(0.0), Drafting(), tok, prediction=wrong) for p in ids]
    for row in rows:
        engine.submit(row)
    try:
        with torch.inference_mode():
            while not all(row.done for row in rows):
                engine._turn()  # the three rows join before the first step
    finally:
        engine.stop()
    assert engine.peak == 3 and all(row.stats.draft_tokens == 0 for row in rows)
    assert (3 in kinds) == (path != "engine") and (bool(kinds) == (path != "engine"))
    assert path == "fused with predictions" or not asked  # (a prediction's row asks the reach of its guess)
    assert any(row.length.version.sum() > 0 for row in rows)  # a watched draft scored
    assert [row.out for row in rows] == [greedy_ids(reference, p, 12) for p in ids]


def test_a_whole_answer_is_decoded_once_and_sends_no_text_events(reference, monkeypatch):
    """A row whose answer is sent whole (`stream=False`) sends no "text" events and, without stop strings, decodes its
    tokens once, at its end; its text is the streamed row's, and with a stop string it is cut at the same place."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    calls = []
    decode = type(tok).decode
    monkeypatch.setattr(type(tok), "decode", lambda self, *a, **k: calls.append(1) or decode(self, *a, **k))
    ids = np.array(prompt_ids(reference, PROMPTS[0]), dtype=np.int64)
    word = re.findall(r"[a-z]{4,}", greedy(reference, ids.tolist(), 40))[2]
    engine = Engine(model, draft_cost=(0.0, 0.05))
    got = {}
    try:
        for stream in (True, False):
            for stops in ((), (word,)):
                events = []
                row = Row(ids, 40, (), Sampling(0.0), Drafting(), tok, stops, emit=events.append, stream=stream)
                calls.clear()
                engine.submit(row)
                with torch.inference_mode():
                    while not row.done:
                        engine._turn()
                got[stream, stops] = row.text.text, row.finish, len(calls), [e[0] for e in events]
    finally:
        engine.stop()
    for stops in ((), (word,)):
        assert got[True, stops][:2] == got[False, stops][:2]
        assert got[False, stops][3] == ["done"] and "text" in got[True, stops][3]
    assert got[False, ()][2] == 1 and got[True, ()][2] > 5 and word not in got[False, (word,)][0]


def test_recycling_rows_are_served_and_learn_across_requests(reference):
    """Rows of `"lookup": "recycle"` (chains) and `"suffix+recycle"` (trees), greedy and sampling, joined in one
    batch, draft from M, the engine's `Recycled`, and learn every forward's top-k: the greedy rows give greedy's
    tokens, a sampling row samples (with its seed it replays only while M is the same: M's drafts decide which random
    draws the acceptance takes), a later request of the same prompt accepts more of its drafts than the first (M
    learned the target's predictions), and no recycling kernel compiles beyond what the served kind's warm-up
    compiled."""
    from lookahead.decode import _warm_up
    from lookahead.index import _recycle_kernels
    from lookahead.runtime.jit import SERVED
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    _warm_up.kind(*SERVED)
    kernels = [getattr(_recycle_kernels, name) for name in ("advance", "merged_chain", "merged_tree", "update_step")]
    warm = [len(kernel.signatures) for kernel in kernels]
    model, tok = reference
    engine = Engine(model, draft_cost=(0.0, 0.05))
    ids = [np.array(prompt_ids(reference, text), dtype=np.int64) for text in PROMPTS[:2]]

    def served(rows):
        for row in rows:
            engine.submit(row)
        with torch.inference_mode():
            while not all(row.done for row in rows):
                engine._turn()
        return rows

    try:
        chain, tree, sampled = served([Row(ids[0], 40, (), Sampling(0.0), Drafting(lookup="recycle"), tok),
                                       Row(ids[1], 40, (), Sampling(0.0), Drafting("suffix+recycle", "tree"), tok),
                                       Row(ids[1], 40, (), Sampling(0.9, seed=3), Drafting("recycle"), tok)])
        again, = served([Row(ids[0], 40, (), Sampling(0.0), Drafting(lookup="recycle"), tok)])
    finally:
        engine.stop()
    assert [chain.out, tree.out, again.out] == [greedy_ids(reference, p, 40) for p in (ids[0], ids[1], ids[0])]
    assert sampled.done and sampled.stats.draft_tokens > 0 and sampled.out != tree.out and engine.peak == 3
    assert again.stats.accepted_tokens > chain.stats.accepted_tokens and tree.stats.draft_tokens > 0
    assert (engine.recycled().ids[:, 0] >= 0).sum() > 20  # M holds the target's predictions after many tokens
    assert [len(kernel.signatures) for kernel in kernels] == warm


@pytest.mark.parametrize("rows", [1, 3])
def test_greedy_merged_tree_rows_take_the_fused_step_as_the_engines_path(reference, monkeypatch, rows):
    """Greedy rows of `"suffix+recycle"` trees, alone or several in a batch, take `generate`'s fused step for merged
    trees (`FusedRecycleTrees`: the step's kernel teaches M each forward's top-k), compiled by the served kind's
    warm-up, and give greedy's tokens; a row alone, with one cost, in the forwards, draft and accepted tokens of the
    engine's own path, M learning the same. (Several rows' trees differ there: the fused step fills each row's tree
    to the nodes the batch's widest forward computes anyway, as `generate`'s batches do.)"""
    from lookahead.decode import _fused_recycle, _warm_up, fused
    from lookahead.runtime.jit import SERVED
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    _warm_up.kind(*SERVED)
    kernels = [getattr(_fused_recycle, name) for name in ("draft_recycle_trees", "step_recycle_trees")]
    warm = [len(kernel.signatures) for kernel in kernels]
    model, tok = reference
    prompts = [np.array(prompt_ids(reference, text) * 2, dtype=np.int64) for text in PROMPTS[:rows]]
    wants = [greedy_ids(reference, p, 32 + 4 * k) for k, p in enumerate(prompts)]
    steps, step = [], fused.FusedRecycleTrees.step
    monkeypatch.setattr(fused.FusedRecycleTrees, "step",
                        lambda self, r, s: steps.append(len(r.indexes)) or step(self, r, s))
    got = []
    for path in ("fused", "engine"):
        if path == "engine":
            monkeypatch.setattr(Engine, "_fused_for", lambda self, batch, most: None)
        engine = Engine(model, draft_cost=(0.0, 0.05))
        done = _turned(engine, [Row(p, len(w), (), Sampling(0.0), Drafting("suffix+recycle", "tree"), tok)
                                for p, w in zip(prompts, wants)])
        assert [row.out for row in done] == wants
        got.append(([(r.stats.forward_passes, r.stats.draft_tokens, r.stats.accepted_tokens) for r in done],
                    engine.recycled().ids.copy()))
    assert rows in steps and sum(c[2] for c in got[0][0]) > 0
    assert rows > 1 or (got[0][0] == got[1][0] and np.array_equal(got[0][1], got[1][1]))
    assert [len(kernel.signatures) for kernel in kernels] == warm


def test_a_batch_size_whose_drafting_is_cut_is_said(reference, caplog):
    """Where steps with drafts gave fewer tokens per second than plain ones (`StepTimes.drafts`), the engine says
    so: a warning naming the batch size and both rates the first time, and the `lookahead_drafting` metric (0 while
    cut, 1 once drafts pay again); a batch size cut again later changes the metric without a second warning."""
    import logging

    from lookahead.serve.engine import Engine
    from lookahead.serve.metrics import Metrics

    model, _ = reference
    engine = Engine(model, metrics=Metrics())
    times = engine.times
    times.plain[4], times.wide[4] = 1e-3, 10.0  # 3-4 rows: 10 tokens/s with drafts against 1,000 plain
    with caplog.at_level(logging.DEBUG, logger="lookahead.serve"):
        times.drafts(3)
        gauge = [line for line in engine.metrics.text().decode().splitlines() if line.startswith("lookahead_drafting{")]
        times.wide[4] = 5000.0
        times.drafts(4)
        again = engine.metrics.text().decode()
        times.wide[4] = 10.0
        times.drafts(4)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert gauge == ['lookahead_drafting{rows="4"} 0.0'] and 'lookahead_drafting{rows="4"} 1.0' in again
    assert len(warned) == 1 and "4 rows stop verifying drafts" in warned[0] and "10.0 tokens/s" in warned[0]
    assert "1000.0" in warned[0] and sum("verify drafts again" in r.getMessage() for r in caplog.records) == 1
    assert 'lookahead_drafting{rows="4"} 0.0' in engine.metrics.text().decode()


@pytest.mark.parametrize("lookup", ["ngram", "suffix", "tree"])
def test_a_lone_greedy_row_takes_generates_fused_step(reference, monkeypatch, lookup):
    """A greedy row of chains or trees running alone is stepped as `generate`'s fused path steps (`fused.for_rows`:
    one kernel call after each forward accepts, teaches its policy, extends its index and drafts the next step); it
    drafts, its tokens are greedy's, and it compiles no fused kernel beyond what the served kind's warm-up
    compiled."""
    from lookahead.decode import _fused_kernels, _warm_up, fused
    from lookahead.runtime.jit import SERVED
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    _warm_up.kind(*SERVED)
    kernels = [getattr(_fused_kernels, name) for name in ("draft", "step", "draft_suffix", "step_suffix",
                                                           "draft_trees", "step_trees")]
    warm = [len(kernel.signatures) for kernel in kernels]

    model, tok = reference
    steps = []
    kind = {"ngram": fused.FusedChains, "suffix": fused.FusedSuffixChains, "tree": fused.FusedTrees}[lookup]
    step = kind.step
    monkeypatch.setattr(kind, "step", lambda self, rows, s: steps.append(1) or step(self, rows, s))
    engine = Engine(model, draft_cost=(0.0, 0.05))
    prompt = np.array(prompt_ids(reference, PROMPTS[0]) * 2, dtype=np.int64)  # repeats: something to copy
    drafting = Drafting(lookup="suffix", draft="tree") if lookup == "tree" else Drafting(lookup=lookup)
    row, = _turned(engine, [Row(prompt, 24, (), Sampling(0.0), drafting, tok)])
    assert row.out == greedy_ids(reference, prompt, 24)
    assert len(steps) == row.stats.forward_passes - 1 and row.stats.draft_tokens > 0  # every step but the prefill
    assert [len(kernel.signatures) for kernel in kernels] == warm


@pytest.mark.parametrize("draft", ["chain", "tree"])
@pytest.mark.parametrize("wrong", [0, 5])
def test_a_lone_row_with_a_prediction_takes_the_fused_step_as_the_engines_path_drafts(reference, monkeypatch, wrong,
                                                                                        draft):
    """A greedy row alone with a prediction (its answer, or its answer with every fifth token changed) is stepped by
    the fused step: a chain row's prediction's next tokens written over the kernel's draft while the answer follows
    it (`Engine._predicted`), a tree row's drafted from its index, where the prediction is a document: greedy's
    tokens, in as many forwards as the engine's own path takes (`Row.draft`), with the same draft tokens and the same
    counts of the prediction's accepted and rejected ones."""
    from lookahead.decode import fused
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    prompt = np.array(prompt_ids(reference, PROMPTS[0]) * 2, dtype=np.int64)
    want = greedy_ids(reference, prompt, 60)
    prediction = np.array([t if not wrong or (i + 1) % wrong else (t + 1) % 64 for i, t in enumerate(want)])
    kind = fused.FusedChains if draft == "chain" else fused.FusedTrees
    steps, step = [], kind.step
    monkeypatch.setattr(kind, "step", lambda self, rows, s: steps.append(1) or step(self, rows, s))
    drafting = Drafting() if draft == "chain" else Drafting(lookup="suffix", draft="tree")
    counts = []
    for path in ("fused", "engine"):
        if path == "engine":
            monkeypatch.setattr(Engine, "_fused_for", lambda self, batch, most: None)
        row, = _turned(Engine(model, draft_cost=(0.0, 0.05)),
                       [Row(prompt, 60, (), Sampling(0.0), drafting, tok, prediction=prediction.copy())])
        assert row.out == want
        c = row.stats
        counts.append((c.forward_passes, c.draft_tokens, c.accepted_tokens, c.prediction_accepted,
                       c.prediction_rejected))
        if path == "fused":
            assert len(steps) == c.forward_passes - 1  # every step but the prefill
    assert counts[0] == counts[1] and counts[0][3] > 0 and (counts[0][4] > 0) == bool(wrong)


def test_rows_with_predictions_take_the_fused_step_together(reference, monkeypatch):
    """A batch of greedy chain rows, two with a prediction (one the answer, one with every fifth token changed) and
    one without, is stepped by the fused step together, the predictions written over the kernel's drafts and the
    batch cut to the width that pays as the engine's own path cuts it (`Engine._predicted`): greedy's tokens, the
    predictions' tokens accepted (and the changed ones rejected), and with one cost the engine's own path's
    forwards, draft tokens and prediction counts, row by row."""
    from lookahead.decode import fused
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    prompts = [np.array(prompt_ids(reference, text) * 2, dtype=np.int64) for text in PROMPTS[:3]]
    wants = [greedy_ids(reference, p, n) for p, n in zip(prompts, (40, 30, 36))]
    predictions = [np.array(wants[0]), np.array([t if (i + 1) % 5 else (t + 1) % 64 for i, t in enumerate(wants[1])]),
                   None]
    steps, step = [], fused.FusedChains.step
    monkeypatch.setattr(fused.FusedChains, "step", lambda self, rows, s: steps.append(len(rows.indexes))
                        or step(self, rows, s))
    counts = []
    for path in ("fused", "engine"):
        if path == "engine":
            monkeypatch.setattr(Engine, "_fused_for", lambda self, batch, most: None)
        rows = _turned(Engine(model, draft_cost=(0.0, 0.05)),
                       [Row(p, len(w), (), Sampling(0.0), Drafting(), tok, prediction=None if q is None else q.copy())
                        for p, w, q in zip(prompts, wants, predictions)])
        assert [row.out for row in rows] == wants
        counts.append([(row.stats.forward_passes, row.stats.draft_tokens, row.stats.prediction_accepted,
                        row.stats.prediction_rejected) for row in rows])
    assert steps.count(3) > 3  # the three rows stepped together
    exact, changed, plain = counts[0]
    assert exact[2] > 0 and exact[3] == 0 and changed[2] > 0 and changed[3] > 0 and plain[2:] == (0, 0)
    assert counts[0] == counts[1]


@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_a_lone_row_drafts_as_generate_does_by_the_curve_it_measures(reference, monkeypatch, draft):
    """With the cost measured (the default on a CPU), a lone greedy row drafts what `lookahead.generate` drafts on
    the same prompt: chains by the curve measured to 20 tokens, trees by the one measured to their 32 nodes (here
    two made-up curves, the tree's with a plateau that widens its budgets and pads its steps), the same forwards,
    draft tokens and accepted tokens, and greedy's tokens."""
    import lookahead
    from lookahead.decode import calibrate
    from lookahead.decode.policy import CostCurve
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    curves = {20: CostCurve(1.0 + 0.2 * np.arange(21)),  # measured to 20 (a chain) and to 32 (a tree)
              32: CostCurve(np.concatenate([1.0 + 0.1 * np.arange(30), [3.5, 3.6, 3.0]]))}
    monkeypatch.setattr(calibrate, "measured_draft_cost", lambda model, max_tokens, store=None: curves[max_tokens])
    model, tok = reference
    prompt = np.array(prompt_ids(reference, PROMPTS[0]) * 2, dtype=np.int64)
    options = {"lookup": "suffix", "draft": draft}
    out, stats = lookahead.generate(model, torch.as_tensor(prompt)[None], max_new_tokens=48, return_stats=True,
                                    **options)
    engine = Engine(model)
    row, = _turned(engine, [Row(prompt, 48, (), Sampling(0.0), Drafting(**options), tok)])
    c = row.stats
    assert row.out == out[0, len(prompt):].tolist() == greedy_ids(reference, prompt, 48)
    assert (c.forward_passes, c.draft_tokens, c.accepted_tokens) == (stats.forward_passes, stats.draft_tokens,
                                                                      stats.accepted_tokens)
    if draft == "tree":
        assert engine.sizing(row)[0] is curves[32] and engine.sizing(row)[2] == 32 and row.tree.max_nodes == 32


def test_rows_that_arrive_together_are_prefilled_in_one_forward(reference, monkeypatch):
    """Rows that arrive together with prompts of one length (a greedy chain row, a tree row, one whose answer ends at
    its first token, a sampling row, a recycling row) are prefilled in one forward and joined to a running row's
    batch, a row whose prompt is three times as long in one of its own (padding costs more than its tokens): the
    greedy rows give greedy's tokens, the row of one token ends at the prefill, the sampling
    row with its seed gives what it gives alone; `PREFILL_TOKENS` splits rows into forwards."""
    from lookahead.serve import engine as E
    from lookahead.serve.batch import ServingLM
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    prefills = []
    prefill = ServingLM.prefill
    monkeypatch.setattr(ServingLM, "prefill",
                        lambda self, stats: prefills.append(len(self.pos)) or prefill(self, stats))
    prompts = [np.array((prompt_ids(reference, text) * 4)[:40], dtype=np.int64) for text in PROMPTS[:3]]
    long = np.concatenate(prompts)

    def rows():
        return [Row(prompts[0], 24, (), Sampling(0.0), Drafting(), tok),
                Row(prompts[1], 20, (), Sampling(0.0), Drafting(lookup="suffix", draft="tree"), tok),
                Row(prompts[2], 1, (), Sampling(0.0), Drafting(), tok),
                Row(prompts[0], 16, (), Sampling(0.9, seed=5), Drafting(), tok),
                Row(prompts[1], 18, (), Sampling(0.0), Drafting(lookup="recycle"), tok),
                Row(long, 12, (), Sampling(0.0), Drafting(), tok)]

    engine = E.Engine(model, draft_cost=(0.0, 0.05))
    first = Row(prompts[2], 30, (), Sampling(0.0), Drafting(), tok)
    try:
        with torch.inference_mode():
            engine.submit(first)
            engine._turn()  # a running row
            together = rows()
            for row in together:
                engine.submit(row)
            while not all(row.done for row in together + [first]):
                engine._turn()
    finally:
        engine.stop()
    assert prefills == [1, 5, 1] and engine.peak == 6
    for row in together[:3] + together[4:] + [first]:
        assert row.out == greedy_ids(reference, row.prompt, row.max_new)
    assert len(together[2].out) == 1 and together[2].stats.forward_passes == 1
    sampled, = _turned(E.Engine(model, draft_cost=(0.0, 0.05)), rows()[3:4])
    assert together[3].out == sampled.out  # its seed replays (sampling rows draft by their own line)
    prefills.clear()
    monkeypatch.setattr(E, "PREFILL_TOKENS", 2 * 40)
    _turned(E.Engine(model, draft_cost=(0.0, 0.05)), rows())
    assert sorted(prefills) == [1, 1, 2, 2]


def test_a_lone_row_on_the_fused_step_goes_on_exactly_around_a_row_that_joins_and_leaves(reference):
    """A row stepped alone by the fused step, then with a short request that joins its batch (a fused step of two
    rows, made anew: the batch's arrays changed), then alone again once that one is done (made anew again): both give
    greedy's tokens."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    engine = Engine(model, draft_cost=(0.0, 0.05))
    long, short = (np.array(prompt_ids(reference, text) * 2, dtype=np.int64) for text in PROMPTS[:2])
    rows = [Row(long, 40, (), Sampling(0.0), Drafting(), tok), Row(short, 6, (), Sampling(0.0), Drafting(), tok)]
    fused = []  # the rows each turn's fused step stepped
    try:
        with torch.inference_mode():
            engine.submit(rows[0])
            for _ in range(3):
                engine._turn()
                fused.append(sum(len(f.rows) for f in engine._fused.values()))
            engine.submit(rows[1])
            while not rows[0].done:
                engine._turn()
                fused.append(sum(len(f.rows) for f in engine._fused.values()))
    finally:
        engine.stop()
    assert [row.out for row in rows] == [greedy_ids(reference, long, 40), greedy_ids(reference, short, 6)]
    assert fused[:3] == [1] * 3 and 2 in fused[3:] and 1 in fused[fused.index(2, 3):]


@pytest.mark.parametrize("lookup", ["ngram", "suffix", "tree"])
def test_greedy_rows_of_a_batch_take_the_fused_step_together(reference, monkeypatch, lookup):
    """Greedy rows of chains or of trees with their own most new tokens, joining a batch at different turns, are
    stepped by one fused kernel call a step (`fused.for_rows`), each row with its own policy (`policy.Stacked`: what
    the kernels teach a row, its `DraftLength` knows) and a tree row with its own calibration (`StackedTrees`): they
    draft, every row's tokens are greedy's, no fused kernel compiles beyond what the served kind's warm-up compiled,
    and a row with other eos ids sends the batch back to the engine's own step."""
    from lookahead.decode import _fused_kernels, _policy_kernels, _warm_up
    from lookahead.runtime.jit import SERVED
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    _warm_up.kind(*SERVED)
    kernels = [getattr(_fused_kernels, name) for name in ("draft", "step", "draft_suffix", "step_suffix", "kept",
                                                           "draft_trees", "step_trees")]
    kernels += [_policy_kernels.choose, _policy_kernels.record, _policy_kernels.tree_size, _policy_kernels.tree_record]
    warm = [len(kernel.signatures) for kernel in kernels]
    model, tok = reference
    widths = []
    step = Engine._step_fused
    monkeypatch.setattr(Engine, "_step_fused", lambda self, f, *a: widths.append(len(f.rows)) or step(self, f, *a))
    engine = Engine(model, draft_cost=(0.0, 0.05))
    ids = [np.array(prompt_ids(reference, text) * 2, dtype=np.int64) for text in PROMPTS[:3]]
    news = [30, 9, 17]
    drafting = Drafting(lookup="suffix", draft="tree") if lookup == "tree" else Drafting(lookup=lookup)
    rows = [Row(p, n, (), Sampling(0.0), drafting, tok) for p, n in zip(ids, news)]
    try:
        with torch.inference_mode():
            engine.submit(rows[0])
            engine._turn()
            engine.submit(rows[1])
            engine.submit(rows[2])
            while not all(row.done for row in rows):
                engine._turn()
    finally:
        engine.stop()
    assert [row.out for row in rows] == [greedy_ids(reference, p, n) for p, n in zip(ids, news)]
    assert 3 in widths and sum(row.stats.draft_tokens for row in rows) > 0
    assert all(row.length.accepted.base is not None for row in rows)  # a view of the stack it ran in
    if lookup != "tree":  # each row's own policy
        assert all(row.length.version.sum() > 0 for row in rows if row.stats.draft_tokens)
    else:  # each row's own calibration, taught in the stack (its chain floor only where the floor drafted)
        assert all(row.tree.calibration.seen.base is not None for row in rows)
        assert all(row.tree.calibration.seen.sum() > 0 for row in rows if row.stats.draft_tokens)
        assert len({row.tree.calibration.seen.tobytes() for row in rows}) > 1
    assert [len(kernel.signatures) for kernel in kernels] == warm

    want = [greedy_ids(reference, p, 8) for p in ids[:2]]
    stop = want[1][3]  # the second row's own eos id: its fourth token
    other = [Row(ids[0], 8, (), Sampling(0.0), drafting, tok), Row(ids[1], 8, (stop,), Sampling(0.0), drafting, tok)]
    engine, widths[:] = Engine(model, draft_cost=(0.0, 0.05)), []
    try:
        with torch.inference_mode():
            for row in other:
                engine.submit(row)
            while not all(row.done for row in other):
                engine._turn()
    finally:
        engine.stop()
    assert 2 not in widths and [row.out for row in other] == [want[0], want[1][:want[1].index(stop) + 1]]


def test_a_row_left_out_of_a_step_learns_from_the_tokens_that_come(reference):
    """A greedy row that verifies no draft (the batch's width left it out) keeps the draft it would have verified
    and scores it against the tokens the target gives: all of them accepted teach its policy a hit, a mismatch a
    miss, with no forward spent on it."""
    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    model, tok = reference
    engine = Engine(model, draft_cost=(0.0, 0.05))
    ids = np.array(prompt_ids(reference, PROMPTS[0]) * 3, dtype=np.int64)
    row = Row(ids, 64, (), Sampling(0.0), Drafting(), tok)
    row.start(None, *engine.sizing(row), "cpu")
    accepted, rejected = row.length.accepted.sum(), row.length.rejected.sum()
    row.watch()
    start, tokens, match = row.shadow
    assert start == 0 and len(tokens) > 2 and match > 0
    row.advance([int(tokens[0])])
    row.advance([int(tokens[1])])
    assert row.shadow is not None  # two of them agree so far: not told yet
    row.advance([int(tokens[2]) + 1])  # the third differs
    assert row.shadow is None and row.stats.draft_tokens == 0
    assert row.length.accepted.sum() == accepted + 2 and row.length.rejected.sum() == rejected + 1


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("name", ["gpt_neo", "bloom", "falcon_alibi"])
def test_windows_and_biases_by_position_serve_joined_rows(name, cache_implementation):
    """GPT-Neo's bands of slots and Bloom's and Falcon's ALiBi biases follow positions (`model.local`, the 2D mask a
    row's biases are counted from): three requests joining one batch, each drafting from a prediction wrong at every
    fifth token, decode to model.generate's tokens, in the dynamic cache and the static one. MPT, whose biases are
    one line of slots for every row, is refused by name."""
    # the tiny Bloom answers in long runs of one token and the tiny Falcon in cycles of two to four, where a
    # prediction's place is ambiguous: fewer drafts accepted than the others' four in five
    least = {"bloom": 6, "falcon_alibi": 24}.get(name)
    served_family(name, least=least, cache_implementation=cache_implementation)


ROWS_APART = {"mpt": None, "inkling_text": None,  # compressed windows that close within a step (as test_indexer's)
              "deepseek_v4": {"compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}}}


@pytest.mark.parametrize("name", sorted(ROWS_APART))
def test_rows_that_cannot_share_a_cache_are_served_each_in_a_batch_of_its_own(name, monkeypatch):
    """MPT's ALiBi biases from cache slots, DeepSeek-V4's compressed attention and Inkling's recurrent layers windowed
    by slot (rows that cannot share one cache: `facts.rows_apart`): three requests arriving a step apart, each drafting
    from a prediction wrong at every fifth token, run side by side, each in a batch of its own stepped by the fused
    step (as `generate` runs each row alone), and decode to model.generate's tokens. The static cache asked for by
    name is refused; a tree, where the layers take none, is a 400 naming lookahead.draft."""
    from fastapi.testclient import TestClient

    from lookahead.serve.app import Served, make_app
    from lookahead.serve.engine import Engine
    from lookahead.serve.metrics import Metrics

    engines, fused = [], []
    step = Engine._step_fused
    monkeypatch.setattr(Engine, "_step_fused", lambda self, f, *a: fused.append(f.batch) or step(self, f, *a))
    # the tiny MPT answers in long runs of one token, where a prediction's place is ambiguous (as Bloom's)
    model = served_family(name, least=6 if name == "mpt" else None, extra=ROWS_APART[name], engine=engines)
    assert engines[0].apart is not None and engines[0].peak == 1  # no forward verified two rows
    assert len({id(batch) for batch in fused}) == 3 and len(fused) >= 3 * 3  # each row's batch took fused steps
    with pytest.raises(ValueError, match=r"cache_implementation='static': lookahead serve runs each row of \w+ in a "
                                         r"dynamic cache of its own"):
        Engine(model, draft_cost=0, cache_implementation="static")
    engine = Engine(model, draft_cost=0).start()
    tok = models.load(models.default_model_path())[1]
    try:
        reply = TestClient(make_app(Served(NAME, tok, engine, Metrics()))).post(
            "/v1/completions", json={"model": NAME, "prompt": [5, 6, 7, 5, 6], "max_tokens": 4,
                                     "lookahead": {"lookup": "suffix", "draft": "tree"}})
    finally:
        engine.stop()
    if name == "mpt":  # ALiBi by position: trees run
        assert reply.status_code == 200, reply.text
    else:
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "lookahead.draft", reply.text
        assert "'tree' is not supported for" in reply.json()["error"]["message"]
