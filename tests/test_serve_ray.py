"""`lookahead serve --engine ray`: two replicas behind Ray Serve on a local cluster (2 CPUs) answer the openai client
as the local server does (greedy text, bad input as a 400)."""
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from lookahead import models  # noqa: E402
from lookahead.serve import ray_engine  # noqa: E402

PROMPTS = ["Once upon a time, there was a dog.", "Tom and his dog went to the park.", "The sun was hot. Ben",
           "One day, a big red ball"]


def test_two_replicas_behind_ray_serve_answer_like_the_local_server():
    """Four concurrent greedy requests equal `model.generate`; a malformed body is OpenAI's 400."""
    import torch

    model, tok, _ = models.load(models.default_model_path())
    want = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        want.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = ray_engine.start(2, {"name": "stories260K"}, port=port, num_cpus=2, threads=1)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p: client.completions.create(model="stories260K", prompt=p, max_tokens=24,
                                                                    temperature=0).choices[0].text, PROMPTS))
        assert got == want
        r = httpx.post(url + "/v1/completions", content="{bad", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    finally:
        ray_engine.stop()
