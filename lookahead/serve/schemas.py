"""The OpenAI request bodies the server takes, checked field by field: a bad field is a `BadRequest` naming it
(HTTP 400 with OpenAI's error JSON), never an exception inside the decoding loop.

Fields the server does not know are ignored, as OpenAI's API ignores them; known fields must have their type.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .._checks import LOOKUPS, TREE_LOOKUPS
from ..index.ngram import MAX_NGRAM
from .row import Drafting, Sampling

MAX_STOPS, MAX_N, MAX_STEP = 4, 16, 1024
_UNSUPPORTED = {  # field -> the values that mean "off"
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
    "best_of": (None, 1), "tools": (None, []), "tool_choice": (None, "none"), "response_format": (None,),
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
}


class BadRequest(ValueError):
    """A request the server refuses: `status`, and OpenAI's error body (`body()`)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass
class Request:
    """A checked request: what to prompt with and how to decode it."""

    model: str
    chat: bool
    messages: list | None = None  # chat: [{"role", "content": str}]
    prompt: str | list | None = None  # completions: text, or token ids
    max_tokens: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stops: tuple = ()
    sampling: Sampling = field(default_factory=Sampling)
    drafting: Drafting = field(default_factory=Drafting)
    prediction: str | None = None


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body.

    Raises:
        BadRequest: not JSON, or not an object.
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"We could not parse the JSON body of your request: {error}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest(f"The request body must be a JSON object, got {type(body).__name__}", None, "invalid_json")
    return body


def parse_request(body: dict, chat: bool) -> Request:
    """A `Request` from a chat (`chat=True`) or completions body.

    Raises:
        BadRequest: a missing or wrongly typed field, a value out of range, or an option the server does not do.
    """
    model = _get(body, "model", str, required=True)
    req = Request(model=model, chat=chat)
    if chat:
        req.messages = _messages(body.get("messages"))
    else:
        req.prompt = _prompt(body.get("prompt"))
    for name, off in _UNSUPPORTED.items():
        if name in body and body[name] not in off:
            raise BadRequest(f"{name}={body[name]!r} is not supported by lookahead serve", name, "unsupported")
    tokens = _int(body, "max_completion_tokens", 1) if chat else None
    req.max_tokens = tokens if tokens is not None else _int(body, "max_tokens", 1)
    req.n = _int(body, "n", 1, MAX_N) or 1
    req.stream = bool(_get(body, "stream", bool))
    options = _get(body, "stream_options", dict)
    if options is not None:
        if not req.stream:
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
        req.include_usage = bool(_get(options, "include_usage", bool, path="stream_options.include_usage"))
    req.stops = _stops(body.get("stop"))
    req.sampling = _sampling(body)
    req.drafting = _drafting(body.get("lookahead"))
    req.prediction = _prediction(body.get("prediction"))
    return req


def _get(body: dict, name: str, kind, required: bool = False, path: str | None = None):
    path = path or name
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"Missing required parameter: '{path}'.", path, "missing_required_parameter")
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f"Invalid type for '{path}': expected {_type_name(kind)}, but got {_json_type(value)}.",
                         path, "invalid_type")
    return value


def _int(body: dict, name: str, low: int, high: int | None = None, path: str | None = None) -> int | None:
    path = path or name
    value = _get(body, name, int, path=path)
    if value is not None and (value < low or (high is not None and value > high)):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise BadRequest(f"Invalid value for '{path}': expected an integer {bound}, got {value}.", path,
                         "invalid_value")
    return value


def _number(body: dict, name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = _get(body, name, (int, float))
    if value is not None and not (low < value <= high if low_open else low <= value <= high):
        raise BadRequest(f"Invalid value for '{name}': expected a number in {'(' if low_open else '['}{low}, {high}], "
                         f"got {value}.", name, "invalid_value")
    return None if value is None else float(value)


def _messages(messages) -> list:
    if messages is None:
        raise BadRequest("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("Invalid 'messages': expected a non-empty array of messages.", "messages", "invalid_type")
    out = []
    for i, m in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"Invalid type for '{path}': expected an object, but got {_json_type(m)}.", path,
                             "invalid_type")
        role = _get(m, "role", str, required=True, path=f"{path}.role")
        out.append({"role": role, "content": _text(m.get("content"), f"{path}.content", allow_none=True) or ""})
    return out


def _text(content, path: str, allow_none: bool = False) -> str | None:
    """A string, or an array of text parts ({"type": "text", "text": str}) joined."""
    if content is None and allow_none:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"Invalid '{path}': expected a string or an array of text parts "
                     f"({{\"type\": \"text\", \"text\": ...}}), got {_json_type(content)}.", path, "invalid_type")


def _prompt(prompt):
    if prompt is None:
        raise BadRequest("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt(prompt[0])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
        return prompt
    raise BadRequest("Invalid 'prompt': expected a string, an array of token ids, or an array of one of them "
                     "(one prompt per request).", "prompt", "invalid_type")


def _stops(stop) -> tuple:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise BadRequest(f"Invalid 'stop': expected a string or an array of at most {MAX_STOPS} strings.", "stop",
                         "invalid_type")
    return tuple(s for s in stops if s)


def _sampling(body: dict) -> Sampling:
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    seed = _get(body, "seed", int)
    return Sampling(1.0 if temperature is None else temperature, 1.0 if top_p is None else top_p,
                    None if seed is None else seed % 2**63)


def _prediction(prediction) -> str | None:
    if prediction is None:
        return None
    if not isinstance(prediction, dict):
        raise BadRequest(f"Invalid type for 'prediction': expected an object, but got {_json_type(prediction)}.",
                         "prediction", "invalid_type")
    if prediction.get("type") != "content":
        raise BadRequest(f"Invalid 'prediction.type': expected 'content', got {prediction.get('type')!r}.",
                         "prediction.type", "invalid_value")
    return _text(prediction.get("content"), "prediction.content")


_DRAFTING = {"lookup": str, "draft": str, "num_draft_tokens": int, "max_draft_nodes": int, "max_ngram": int,
             "min_ngram": int}


def _drafting(options) -> Drafting:
    """The `lookahead` object: the library's options for this request."""
    if options is None:
        return Drafting()
    if not isinstance(options, dict):
        raise BadRequest(f"Invalid type for 'lookahead': expected an object, but got {_json_type(options)}.",
                         "lookahead", "invalid_type")
    for name in options:
        if name not in _DRAFTING:
            raise BadRequest(f"Unknown option 'lookahead.{name}': expected one of {', '.join(_DRAFTING)}.",
                             f"lookahead.{name}", "unknown_parameter")
        _get(options, name, _DRAFTING[name], path=f"lookahead.{name}")
    got = dict(Drafting().__dict__) | {k: v for k, v in options.items() if v is not None}
    _choice(got, "lookup", LOOKUPS)
    _choice(got, "draft", ("chain", "tree"))
    if got["draft"] == "tree" and got["lookup"] not in TREE_LOOKUPS:
        raise BadRequest(f"draft='tree' needs lookup={', '.join(map(repr, TREE_LOOKUPS))}, got "
                         f"lookup={got['lookup']!r}", "lookahead.draft", "invalid_value")
    for name, low, high in (("num_draft_tokens", 0, MAX_STEP), ("max_draft_nodes", 1, MAX_STEP),
                            ("max_ngram", 1, MAX_NGRAM), ("min_ngram", 1, MAX_NGRAM)):
        _int(got, name, low, high, path=f"lookahead.{name}")
    if got["min_ngram"] > got["max_ngram"]:
        raise BadRequest(f"lookahead.min_ngram must be <= lookahead.max_ngram, got {got['min_ngram']} > "
                         f"{got['max_ngram']}", "lookahead.min_ngram", "invalid_value")
    return Drafting(**got)


def _choice(got: dict, name: str, allowed: tuple) -> None:
    if got[name] not in allowed:
        raise BadRequest(f"Invalid value for 'lookahead.{name}': expected one of {', '.join(allowed)}, got "
                         f"{got[name]!r}.", f"lookahead.{name}", "invalid_value")


def _type_name(kind) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}
    return names.get(kind, "a number")


def _json_type(value) -> str:
    for kind, name in ((bool, "a boolean"), (str, "a string"), (int, "an integer"), (float, "a number"),
                       (dict, "an object"), (list, "an array")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__
