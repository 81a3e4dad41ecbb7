"""The OpenAI-compatible wire format of `lever serve`: request parsing and
validation, and the JSON of responses, stream chunks and errors.

Pure functions: nothing here touches the model, the network or a clock
(`created` and ids are passed in).  Token counts are tokens.

Requests (`parse_chat`, `parse_completion`) accept the OpenAI fields that
make sense for one local model -- model, messages / prompt, max_tokens
(max_completion_tokens), temperature, top_p, seed, stop, stream,
stream_options, n (1 only) -- plus the extensions top_k and
return_token_ids (each choice, or chunk, then carries the generated ids).
`null` means "absent"; an unknown field, a wrong type or a value out of
range is refused (400 malformed / wrong type / text that is not valid
Unicode anywhere, 422 out of range or too long for the context) with OpenAI's
error body
{"error": {"message", "type", "code", "param"}}.  A `model` other than the
served one is not refused: the server answers with its own model, as
llama.cpp's server does (`GenRequest.requested_model` keeps the name asked
for, which the application logs once per name).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable

from ..errors import LeverError
from ..http.error import HttpError
from ..http.json_body import invalid_text, parse_json, shown_path
from ..sampling import MAX_SEED, SamplingParams

MAX_STOP_STRINGS = 4            # as OpenAI
MAX_STOP_CHARS = 256            # characters per stop string
SHOWN_CHARS = 60                # characters of a refused value quoted back
CHAT_ROLES = ("system", "developer", "user", "assistant")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "invalid_request_error", 413: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}

COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                 "stream_options", "n", "user", "return_token_ids", "presence_penalty", "frequency_penalty",
                 "logprobs"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "suffix"}
# accepted only at the value that means "off" (what this server does anyway)
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "echo": False, "suffix": ""}


class OpenAIError(HttpError):
    """A refused request, answered with OpenAI's error body."""

    def body(self) -> dict:
        return error_body(self.status, self.code, self.message, self.param)


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": code,
                      "param": param}}


def show(value) -> str:
    """A client's value quoted in an error message, cut to SHOWN_CHARS characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** SHOWN_CHARS else "<a huge integer>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


@dataclass(frozen=True)
class ServedModel:
    """What request validation needs to know of the served model.

    context: tokens a request may use, prompt + completion (the model's
    context less the room a draft tree needs); max_tokens: the server's cap
    on completion tokens; defaults: the sampling used for absent fields;
    encode_chat(messages) / encode_text(str): prompt ids (a LeverError for a
    conversation the chat template refuses)."""

    name: str
    vocab_size: int
    context: int
    max_tokens: int
    defaults: SamplingParams
    encode_chat: Callable[[list[dict]], list[int]]
    encode_text: Callable[[str], list[int]]


@dataclass(frozen=True)
class GenRequest:
    """One validated generation request."""

    kind: str                       # "chat" or "completion"
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    model: str = ""                 # the served model's name: the responses' `model`
    requested_model: str | None = None   # the `model` the request named when it is not the served one


def decode_json(raw: bytes) -> dict:
    """A request body: a JSON object, else a 400.  Bytes that are not UTF-8
    inside a string are kept, as lone surrogates, for `parse_chat` /
    `parse_completion` to refuse naming the field (lever.http.json_body)."""
    try:
        body = parse_json(raw)
    except (ValueError, RecursionError) as e:           # UnicodeDecodeError is a ValueError
        raise OpenAIError(400, "invalid_json", f"the body is not JSON ({type(e).__name__}: {e})"[:300]) from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "invalid_json", "the body must be a JSON object")
    return body


def bad(param: str, message: str, status: int = 400, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(status, code, f"{param}: {message}", param)


def _present(body: dict) -> dict:
    """The fields of `body` that are not null (null means absent, as in OpenAI's API),
    once every string in it, field names too, is known to be valid Unicode text
    (an unpaired surrogate anywhere is a 400 naming its field, before anything
    reaches the tokenizer)."""
    invalid = invalid_text(body)
    if invalid is not None:
        path, reason = invalid
        raise OpenAIError(400, "invalid_text", f"{shown_path(path)}: {reason}", shown_path(path))
    return {k: v for k, v in body.items() if v is not None}


def _check_fields(body: dict, allowed: set[str]) -> None:
    for name in sorted(body):
        if name not in allowed:
            raise bad(name, "this field is not supported by lever serve", code="unknown_parameter")
    for name, neutral in NEUTRAL.items():
        if name in body and not _is_neutral(body[name], neutral):
            raise bad(name, f"only {json.dumps(neutral)} is supported, got {show(body[name])}",
                      code="unsupported_value")


def _is_neutral(value, neutral) -> bool:
    """`value` is the "off" value `neutral` (a number: any JSON number equal to it)."""
    if isinstance(neutral, bool) or isinstance(value, bool) or not isinstance(neutral, (int, float)):
        return type(value) is type(neutral) and value == neutral
    return isinstance(value, (int, float)) and value == neutral


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise bad(name, f"must be an integer, got {show(value)}", code="invalid_type")
    if not lo <= value <= hi:
        raise bad(name, f"must be between {lo} and {hi}, got {show(value)}", 422)
    return value


def _number(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, f"must be a number, got {show(value)}", code="invalid_type")
    try:
        value = float(value)
    except OverflowError:
        raise bad(name, f"{show(value)} is out of range", 422) from None
    if not math.isfinite(value):
        raise bad(name, f"must be finite, got {value!r}", 422)
    return value


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if type(value) is not bool:
        raise bad(name, f"must be true or false, got {show(value)}", code="invalid_type")
    return value


def _sampling(body: dict, served: ServedModel) -> SamplingParams:
    d = served.defaults
    temperature, top_p = _number(body, "temperature"), _number(body, "top_p")
    top_k = _integer(body, "top_k", 0, 1 << 31)
    seed = _integer(body, "seed", 0, MAX_SEED)
    try:
        return SamplingParams(temperature=d.temperature if temperature is None else temperature,
                              top_p=d.top_p if top_p is None else top_p,
                              top_k=d.top_k if top_k is None else top_k,
                              seed=d.seed if seed is None else seed)
    except ValueError as e:
        name = str(e).split(" ", 1)[0]
        raise bad(name, str(e)[:200], 422) from None


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", "must be a string or a list of strings", code="invalid_type")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", 422)
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise bad("stop", f"a stop string must have 1 to {MAX_STOP_CHARS} characters, got {show(s)}", 422)
    return tuple(stops)


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad("stream_options", "is only allowed with stream: true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad("stream_options", "must be an object with include_usage", code="invalid_type")
    return stream, _boolean(options, "include_usage")


def _requested_model(body: dict, served: ServedModel) -> str | None:
    """The `model` the request names when it is not the served one (None: the
    served one, or none named); it is served by the served model all the same."""
    name = body.get("model", served.name)
    if not isinstance(name, str):
        raise bad("model", f"must be a string, got {show(name)}", code="invalid_type")
    return None if name == served.name else name


def _common(kind: str, body: dict, served: ServedModel, prompt_ids: list[int], max_tokens: int | None) -> GenRequest:
    n = _integer(body, "n", 1, 1 << 31)
    if n not in (None, 1):
        raise bad("n", f"only n = 1 is supported, got {n}", code="unsupported_value")
    if "user" in body and not isinstance(body["user"], str):
        raise bad("user", "must be a string", code="invalid_type")
    stream, include_usage = _stream(body)
    room = served.context - len(prompt_ids)
    if room < 1:
        raise OpenAIError(422, "context_length_exceeded", f"the prompt has {len(prompt_ids)} tokens; this server's "
                                                          f"context holds {served.context} tokens, prompt and "
                                                          f"completion together", "messages" if kind == "chat" else "prompt")
    if max_tokens is None:
        max_tokens = min(room, served.max_tokens)
    elif len(prompt_ids) + max_tokens > served.context:
        raise OpenAIError(422, "context_length_exceeded", f"a prompt of {len(prompt_ids)} tokens plus max_tokens "
                                                          f"{max_tokens} exceeds this server's context of "
                                                          f"{served.context} tokens", "max_tokens")
    return GenRequest(kind=kind, prompt_ids=prompt_ids, max_tokens=max_tokens, params=_sampling(body, served),
                      stop=_stop(body), stream=stream, include_usage=include_usage,
                      return_token_ids=_boolean(body, "return_token_ids"), model=served.name,
                      requested_model=_requested_model(body, served))


def _max_tokens(body: dict, served: ServedModel, *names: str) -> int | None:
    given = [name for name in names if body.get(name) is not None]
    if len(given) > 1:
        raise bad(given[1], f"give one of {' or '.join(names)}")
    return _integer(body, given[0], 1, served.max_tokens) if given else None


def _content(message: dict, i: int) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts (joined)."""
    param = f"messages[{i}].content"
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and set(p) <= {"type", "text"}
            for p in content):
        return "".join(p["text"] for p in content)
    raise bad(param, "must be a string or a list of text parts ({\"type\": \"text\", \"text\": ...})",
              code="invalid_type")


def chat_messages(value) -> list[dict]:
    """The conversation as [{"role", "content"}] with text content, validated."""
    if not isinstance(value, list):
        raise bad("messages", f"must be a list of messages, got {show(value)}", code="invalid_type")
    if not value:
        raise bad("messages", "must hold at least one message", 422, code="empty_messages")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"must be an object, got {show(m)}", code="invalid_type")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise bad(f"messages[{i}]", f"unsupported field {sorted(extra)[0]!r} (role, content and name are)",
                      code="unknown_parameter")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise bad(f"messages[{i}].role", f"must be one of {', '.join(CHAT_ROLES)}, got {show(role)}",
                      code="invalid_value")
        if "name" in m and not isinstance(m["name"], str):
            raise bad(f"messages[{i}].name", "must be a string", code="invalid_type")
        messages.append({"role": role, "content": _content(m, i)})
    return messages


def parse_chat(body: dict, served: ServedModel) -> GenRequest:
    """A /v1/chat/completions body as a GenRequest (the prompt through the chat template)."""
    body = _present(body)
    _check_fields(body, CHAT_FIELDS)
    if "messages" not in body:
        raise bad("messages", "is required", code="missing_required_parameter")
    messages = chat_messages(body["messages"])
    max_tokens = _max_tokens(body, served, "max_completion_tokens", "max_tokens")
    try:
        ids = served.encode_chat(messages)
    except LeverError as e:
        raise bad("messages", str(e)[:300], code="chat_template") from None
    return _common("chat", body, served, ids, max_tokens)


def _prompt_ids(value, served: ServedModel) -> list[int]:
    """A completion prompt: a string, token ids, or a list holding one of them."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        ids = served.encode_text(value)
    elif isinstance(value, list) and all(type(t) is int for t in value):
        ids = value
        for i, t in enumerate(ids):
            if not 0 <= t < served.vocab_size:
                raise bad("prompt", f"token id [{i}] = {show(t)} is outside the vocabulary "
                                    f"(0..{served.vocab_size - 1})", 422)
    else:
        raise bad("prompt", "must be a string or a list of token ids (one prompt: batches are not supported)",
                  code="invalid_type")
    if not ids:
        raise bad("prompt", "is empty (0 tokens)", 422, code="empty_prompt")
    return list(ids)


def parse_completion(body: dict, served: ServedModel) -> GenRequest:
    """A /v1/completions body as a GenRequest (the prompt as it is: no chat template)."""
    body = _present(body)
    _check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body:
        raise bad("prompt", "is required", code="missing_required_parameter")
    max_tokens = _max_tokens(body, served, "max_tokens")
    return _common("completion", body, served, _prompt_ids(body["prompt"], served), max_tokens)


# -- responses -------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _choice(req: GenRequest, text: str, token_ids: list[int], finish_reason: str | None, delta: bool,
            first: bool = False) -> dict:
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    elif delta:
        message = ({"role": "assistant", "content": text} if first else {"content": text}) if text or first else {}
        choice = {"index": 0, "delta": message, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    if req.return_token_ids:
        choice["token_ids"] = list(token_ids)
    return choice


def response(req: GenRequest, rid: str, created: int, text: str, token_ids: list[int], finish_reason: str,
             speculative: dict) -> dict:
    """A whole (non-streamed) answer: chat.completion or text_completion."""
    return {"id": rid, "object": "chat.completion" if req.kind == "chat" else "text_completion",
            "created": created, "model": req.model,
            "choices": [_choice(req, text, token_ids, finish_reason, delta=False)],
            "usage": usage(len(req.prompt_ids), len(token_ids)), "speculative": speculative}


def chunk(req: GenRequest, rid: str, created: int, text: str = "", token_ids: list[int] = (),
          finish_reason: str | None = None, first: bool = False, speculative: dict | None = None) -> dict:
    """One stream chunk: a piece of text (or, with finish_reason, the end of
    the choice, carrying the `speculative` object)."""
    out = {"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
           "created": created, "model": req.model,
           "choices": [_choice(req, text, token_ids, finish_reason, delta=True, first=first)]}
    if req.include_usage:
        out["usage"] = None
    if speculative is not None:
        out["speculative"] = speculative
    return out


def usage_chunk(req: GenRequest, rid: str, created: int, completion_tokens: int, speculative: dict) -> dict:
    """The last chunk under stream_options.include_usage: no choices, the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
            "created": created, "model": req.model, "choices": [],
            "usage": usage(len(req.prompt_ids), completion_tokens), "speculative": speculative}


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` (or `data: [DONE]`) and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_list(name: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "lever"}]}
