"""Linear layers run with weights packed for MKL (`lookahead.model.linear`)."""
import pytest
import torch

from lookahead import generate
from lookahead.model import linear
from lookahead.model.linear import ROWS, packed_linears

from models import repeated_prompt, tiny_model

pytestmark = pytest.mark.skipif(not linear.available(), reason="this torch build has no MKL packed sgemm")


@pytest.fixture(autouse=True)
def _nothing_kept(tmp_path, monkeypatch):
    """Each test times its own row counts (`_faster_rows`, replaced in some): none read from another's disk cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


@pytest.fixture
def every_row(monkeypatch):
    """The packed kernel chosen for every row count it serves, whatever this machine's timings say."""
    monkeypatch.setattr(linear, "_faster_rows", lambda layers, packed: set(range(1, ROWS + 1)))
    linear._PACKS.clear()
    yield
    linear._PACKS.clear()


def _layers(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def test_packed_layers_compute_the_same_product(every_row):
    """Inside the block every row count up to ROWS gives nn.Linear's output (to the last bits); above, nn.Linear's."""
    layer = torch.nn.Linear(40, 24)
    model = torch.nn.Sequential(layer)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 2, 3, 5, 8, ROWS, ROWS + 1, 40):
        x = torch.randn(1, rows, 40, generator=g)
        want = layer(x)
        with packed_linears(model):
            assert "forward" in layer.__dict__
            got = layer(x)
        assert got.shape == want.shape == (1, rows, 24)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "forward" not in layer.__dict__


def test_the_layers_are_set_back_after_an_error(every_row):
    """A block that raises leaves every layer with its own forward."""
    model = tiny_model("llama")
    with pytest.raises(RuntimeError, match="boom"):
        with packed_linears(model):
            assert all("forward" in m.__dict__ for m in _layers(model))
            raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in _layers(model))


def test_a_nested_block_leaves_the_outer_one_in_place(every_row):
    """An inner block on the same model changes nothing; the outer one sets the layers back."""
    model = tiny_model("qwen2")
    with packed_linears(model):
        installed = [m.__dict__["forward"] for m in _layers(model)]
        with packed_linears(model):
            pass
        assert [m.__dict__.get("forward") for m in _layers(model)] == installed
    assert not any("forward" in m.__dict__ for m in _layers(model))


def test_a_changed_weight_is_packed_again(every_row):
    """After a weight changes in place, the packed layer computes with the new weight."""
    layer = torch.nn.Linear(16, 8, bias=False)
    model = torch.nn.Sequential(layer)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with packed_linears(model):
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)
    with packed_linears(model):
        got = layer(x)
    torch.testing.assert_close(got, x @ layer.weight.detach().t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_are_left_alone(every_row, dtype):
    """A model in another dtype than fp32 runs its own layers."""
    model = tiny_model("llama").to(dtype)
    with packed_linears(model):
        assert not any("forward" in m.__dict__ for m in _layers(model))


def test_gradients_go_through_the_plain_kernel(every_row):
    """With autograd on and a weight that needs a gradient, the layer computes a differentiable product."""
    layer = torch.nn.Linear(8, 4)
    with packed_linears(torch.nn.Sequential(layer)):
        out = layer(torch.randn(3, 8)).sum()
    out.backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_no_layer_is_packed_when_none_is_faster(monkeypatch):
    """Where the packed kernel wins at no row count, the layers keep their own forward."""
    monkeypatch.setattr(linear, "_faster_rows", lambda layers, packed: set())
    linear._PACKS.clear()
    model = tiny_model("llama")
    with packed_linears(model):
        assert not any("forward" in m.__dict__ for m in _layers(model))
    linear._PACKS.clear()


def test_the_choice_is_measured_once_per_thread_count(monkeypatch):
    """The kernel choice is timed on first use and kept for the model and the thread count."""
    calls = []
    monkeypatch.setattr(linear, "_faster_rows", lambda layers, packed: calls.append(len(layers)) or {4})
    linear._PACKS.clear()
    model = tiny_model("llama")
    for _ in range(3):
        with packed_linears(model):
            pass
    assert calls == [len(_layers(model))]
    linear._PACKS.clear()


def test_the_measured_choice_names_row_counts_it_served():
    """The real timing returns row counts between 1 and ROWS."""
    layers = [torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)]
    packed = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), ROWS) for m in layers]
    rows = linear._faster_rows(layers, packed, rounds=1)
    assert rows <= set(range(1, ROWS + 1))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_calls_with_packed_layers_stay_lossless(every_row, arch, draft):
    """Greedy output equals model.generate with every verification forward on packed layers, batches with padding."""
    model = tiny_model(arch)
    ids = torch.stack([repeated_prompt(s, 40) for s in range(2)])
    mask = torch.ones_like(ids)
    ids[1, :6], mask[1, :6] = 0, 0
    want = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    seen = []
    hook = model.lm_head.register_forward_pre_hook(lambda m, _: seen.append("forward" in m.__dict__))
    got = generate(model, ids, attention_mask=mask, max_new_tokens=30, pad_token_id=0, lookup="suffix", draft=draft,
                   draft_cost=0)
    hook.remove()
    assert torch.equal(got, want)
    assert seen and all(seen)
    assert "forward" not in model.lm_head.__dict__


@pytest.mark.parametrize("physical,free", [(4 << 20, 1 << 40), (1 << 40, 64 << 10), (0, 0)])
def test_weights_too_large_for_the_memory_are_left_alone(every_row, monkeypatch, physical, free):
    """Weights over a quarter of the machine's memory, or half of what is free (or memory unknown): no packing."""
    monkeypatch.setattr(linear, "_memory", lambda: (physical, free))
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024))  # 2 MiB of weights
    with packed_linears(model):
        assert "forward" not in model[0].__dict__


def test_a_forward_set_on_a_layer_after_packing_is_kept(every_row):
    """A layer that gets its own forward (a hook library's) after the first block keeps it through later blocks."""
    layer = torch.nn.Linear(8, 4)
    model = torch.nn.Sequential(layer)
    with packed_linears(model):
        pass
    own = lambda x: x.sum(-1, keepdim=True).expand(*x.shape[:-1], 4)  # noqa: E731
    layer.forward = own
    with packed_linears(model):
        assert layer.__dict__["forward"] is own
    assert layer.__dict__["forward"] is own
