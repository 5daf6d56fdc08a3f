"""Every method the benchmarks compare, under one unambiguous name: what it drafts in the model-free replay and
the index timing, and how the wall-clock harnesses run it.

A method may have a drafter (``make(setup)`` returns ``make_proposer(trace)``, called once per dataset, so that a
cache shared across one dataset's traces starts empty), a way to generate (``runner`` "hf" for transformers'
``model.generate``, "lookahead" for ``lookahead.generate``, with ``options``; "call" for a loop of its own,
``options["generate"](model, ids, mask, max_new, eos)``), or both. SuffixDecoding needs an
extra package: its drafters live in ``benchmarks/suffix_decoding.py`` and are passed to ``resolve`` as ``external``.

Example::

    [ngram, hf] = resolve(["lookahead-ngram", "hf2"])     # old names are aliases
    make_proposer = ngram.make(Setup(budget=10))
    stats = replay_dataset(make_proposer, traces, budget=10)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Callable

TREE_NODES = 32  # max_draft_nodes of tree drafts, in the replay and end to end
HF_NUM_TOKENS = 10  # prompt_lookup_num_tokens of HF prompt lookup, as lookahead's num_draft_tokens
COST_TOKENS = HF_NUM_TOKENS + 1  # the forward a cost ratio refers to: the last token and 10 drafts


@dataclass(frozen=True)
class Setup:
    """How the replay drafts: ``budget`` tokens a chain step, ``tree_budget`` nodes a tree step; ``hf_exact``: HF
    prompt lookup through transformers' own ``get_candidates`` (slow on long contexts) instead of its rule in numba."""

    budget: int = 10
    tree_budget: int = TREE_NODES
    hf_exact: bool = False


@dataclass(frozen=True)
class Method:
    """One compared method (see the module docstring)."""

    name: str
    description: str
    make: Callable[[Setup], Callable] | None = None
    tree: bool = False
    runner: str | None = None
    options: dict = field(default_factory=dict)
    requires: str | None = None  # the extra package an external drafter needs
    compiled: bool = False  # also transformers' default CompileConfig (made on use: importing it loads torch)

    @property
    def replayable(self) -> bool:
        return self.make is not None

    def generate_options(self) -> dict:
        """The keyword arguments its runner passes to ``generate``: `options`, and a ``compile_config`` if compiled."""
        if not self.compiled:
            return dict(self.options)
        from transformers import CompileConfig

        return {**self.options, "compile_config": CompileConfig()}


def _same(build: Callable[[Setup], object]) -> Callable[[Setup], Callable]:
    """A drafter that ignores the trace: a fresh ``build(setup)`` for each one."""
    return lambda setup: lambda trace: build(setup)


# The drafters import their modules when made: the registry itself (names, defaults, `method_name`) loads neither
# numba nor torch, so that `lookahead bench --help` answers at once.
def _hf(ngram: int) -> Callable[[Setup], Callable]:
    def make(setup: Setup):
        from .peers import PromptLookup

        return PromptLookup(ngram, setup.budget, setup.hf_exact)

    return _same(make)


def _oracle(kind: str) -> Callable[[Setup], Callable]:
    def make(trace):
        from .oracles import AnchoredOracle, HindsightOracle

        if kind == "oracle":
            return HindsightOracle(trace[1])
        return AnchoredOracle(trace[1], longest=kind == "ceiling-longest")

    return lambda setup: make


def _ngram(setup: Setup):
    from ..index import NgramIndex

    return NgramIndex()


def _suffix(setup: Setup):
    from ..index import SuffixIndex

    return SuffixIndex()


def _vllm(setup: Setup):
    from .peers import VllmNgram

    return VllmNgram(1, 4)


_NGRAM = _same(_ngram)
_SUFFIX = _same(_suffix)
_TREE = {"draft": "tree", "max_draft_nodes": TREE_NODES}
_STATIC = {"cache_implementation": "static"}
_DYNAMIC = {"cache_implementation": "dynamic"}
_SD = "arctic-inference (benchmarks/suffix_decoding.py; see benchmarks/README.md)"

METHODS: dict[str, Method] = {m.name: m for m in [
    Method("lookahead-none", "lookahead's loop drafting nothing", runner="lookahead", options={"lookup": "none"}),
    Method("lookahead-ngram", "lookahead NgramIndex chains (default cache: static with CUDA graphs on CUDA)", _NGRAM,
           runner="lookahead", options={"lookup": "ngram"}),
    Method("lookahead-suffix", "lookahead SuffixIndex chains", _SUFFIX, runner="lookahead",
           options={"lookup": "suffix"}),
    Method("lookahead-suffix-tree", f"lookahead SuffixIndex trees ({TREE_NODES} nodes)", _SUFFIX, tree=True,
           runner="lookahead", options={"lookup": "suffix", **_TREE}),
    Method("lookahead-recycle-tree", "lookahead Token Recycling trees: the target's own earlier predictions "
           "(real models only: drafts depend on the model's logits)", runner="lookahead",
           options={"lookup": "recycle", **_TREE}),
    Method("lookahead-suffix-recycle-tree", "lookahead SuffixIndex trees with recycled predictions filling the "
           "budget (real models only)", runner="lookahead", options={"lookup": "suffix+recycle", **_TREE}),
    Method("lookahead-none-static", "lookahead's static step drafting nothing (its plain decoding)",
           runner="lookahead", options={"lookup": "none", **_STATIC}),
    Method("lookahead-ngram-dynamic", "lookahead-ngram with cache_implementation='dynamic' (eager on any device)",
           runner="lookahead", options={"lookup": "ngram", **_DYNAMIC}),
    Method("lookahead-suffix-tree-dynamic", "lookahead-suffix-tree with cache_implementation='dynamic'",
           runner="lookahead", options={"lookup": "suffix", **_TREE, **_DYNAMIC}),
    Method("lookahead-ngram-static", "lookahead-ngram with cache_implementation='static' (compiled on CUDA)",
           runner="lookahead", options={"lookup": "ngram", **_STATIC}),
    Method("lookahead-suffix-static", "lookahead-suffix with cache_implementation='static' (compiled on CUDA)",
           runner="lookahead", options={"lookup": "suffix", **_STATIC}),
    Method("lookahead-suffix-tree-static", "lookahead-suffix-tree with cache_implementation='static' (compiled on "
           "CUDA)", runner="lookahead", options={"lookup": "suffix", **_TREE, **_STATIC}),
    Method("lookahead-ngram-compiled", "lookahead-ngram with cache_implementation='static' and transformers' "
           "CompileConfig: compiled on any device (on CUDA the same as lookahead-ngram-static)", runner="lookahead",
           options={"lookup": "ngram", **_STATIC}, compiled=True),
    Method("hf-greedy", "transformers greedy, dynamic cache", runner="hf"),
    Method("hf-greedy-static", "transformers greedy, static cache (compiled with CUDA graphs on a GPU)",
           runner="hf", options=_STATIC),
    Method("hf-prompt-lookup-2", "transformers prompt lookup, max_matching_ngram_size 2 (its default)", _hf(2),
           runner="hf", options={"prompt_lookup_num_tokens": HF_NUM_TOKENS, "max_matching_ngram_size": 2}),
    Method("hf-prompt-lookup-4", "transformers prompt lookup, max_matching_ngram_size 4", _hf(4),
           runner="hf", options={"prompt_lookup_num_tokens": HF_NUM_TOKENS, "max_matching_ngram_size": 4}),
    Method("vllm-ngram", "vLLM n-gram proposer rule (prompt_lookup_min 1, max 4)",
           _same(_vllm)),
    Method("suffixdecoding", "SuffixDecoding chains, per request", requires=_SD),
    Method("suffixdecoding-tree", f"SuffixDecoding trees ({TREE_NODES} nodes), per request", tree=True, requires=_SD),
    Method("suffixdecoding-global", "SuffixDecoding chains, one global cache per dataset", requires=_SD),
    Method("suffixdecoding-global-tree", f"SuffixDecoding trees ({TREE_NODES} nodes), one global cache per dataset",
           tree=True, requires=_SD),
    Method("oracle", "hindsight: the best single copy from anywhere in the context", _oracle("oracle")),
    Method("ceiling", "ceiling: the best copy after any occurrence of the last token", _oracle("ceiling")),
    Method("ceiling-longest", "ceiling: the best copy after an occurrence of the longest recurring suffix",
           _oracle("ceiling-longest")),
]}

ALIASES = {  # the names older commands used
    "greedy": "hf-greedy", "hf-prompt-lookup": "hf-prompt-lookup-2", "hf": "hf-prompt-lookup-2",
    "hf2": "hf-prompt-lookup-2", "hf4": "hf-prompt-lookup-4", "vllm": "vllm-ngram", "ngram": "lookahead-ngram",
    "suffix-index": "lookahead-suffix", "suffix-index-tree": "lookahead-suffix-tree",
    "suffix-global": "suffixdecoding-global", "suffix-global-tree": "suffixdecoding-global-tree",
    "lookahead-ngram-static-compiled": "lookahead-ngram-static",  # explicit static is compiled on CUDA now
    "lookahead-suffix-tree-static-compiled": "lookahead-suffix-tree-static",
}
AMBIGUOUS = {"suffix": ("lookahead-suffix", "suffixdecoding"),
             "suffix-tree": ("lookahead-suffix-tree", "suffixdecoding-tree")}

REPLAY_DEFAULT = ("lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree", "hf-prompt-lookup-2",
                  "hf-prompt-lookup-4")
E2E_DEFAULT = ("hf-greedy", "hf-prompt-lookup-2", "lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree")
INDEX_DEFAULT = ("lookahead-ngram", "lookahead-suffix", "hf-prompt-lookup-2")
REAL_DEFAULT = ("hf-greedy", "hf-prompt-lookup-2", "lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree")


def canonical(name: str) -> str:
    """The registry name that ``name`` (a name or an alias) stands for.

    Raises:
        ValueError: an unknown or ambiguous name.

    >>> canonical("hf2")
    'hf-prompt-lookup-2'
    """
    if name in AMBIGUOUS:
        ours, theirs = AMBIGUOUS[name]
        raise ValueError(f"method {name!r} is ambiguous: say {ours} (lookahead's index) or {theirs} (ArcticInference)")
    name = ALIASES.get(name, name)
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}")
    return name


def method_name(text: str) -> str:
    """``argparse`` type: a method name or alias, as its registry name (errors are argparse's one-line errors)."""
    try:
        return canonical(text)
    except ValueError as reason:
        raise argparse.ArgumentTypeError(str(reason)) from None


def resolve(names, external: dict | None = None, need: str | None = None) -> list:
    """The methods named (names or aliases), in the order given, without repeats.

    Args:
        names: method names or aliases.
        external: name -> ``make(setup)`` for drafters that live outside the package (SuffixDecoding).
        need: "replay" (a drafter) or "hf"/"lookahead"/"generate" (a way to generate): refuse methods without it.
    Raises:
        ValueError: an unknown or ambiguous name, or a method that cannot do what ``need`` asks.
    """
    external = external or {}
    wanted = dict.fromkeys(canonical(n) for n in names)
    methods = [replace(METHODS[n], make=external.get(n, METHODS[n].make)) for n in wanted]
    for m in methods:
        if need == "replay" and not m.replayable:
            why = f"it needs {m.requires}" if m.requires else "it is not a drafter"
            raise ValueError(f"method {m.name!r} cannot be replayed: {why}")
        if need == "generate" and m.runner is None:
            raise ValueError(f"method {m.name!r} does not generate (a drafter for the replay only)")
    return methods
