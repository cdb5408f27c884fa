"""vLLM-shaped answers for the sampling and output parameters a plain request does not use.

``n`` choices (each with its ``index``), ``logprobs`` (completions: ``tokens`` / ``token_logprobs``
/ ``top_logprobs`` / ``text_offset``; chat: ``content`` entries with ``top_logprobs``), ``echo``,
``stop`` / ``stop_token_ids`` (``finish_reason: stop`` and the matched ``stop_reason``), ``seed``,
``response_format`` (the content is a JSON document), ``tools`` (a ``tool_calls`` answer with
``finish_reason: tool_calls``; streamed as vLLM does: a role chunk, the call's name, then its
arguments piece by piece), ``stream_options.continuous_usage_stats``. Deterministic: the same
request gives the same answer on any engine, so a test can compare a direct answer with a routed
one. Pure (no I/O); ``generate.py`` paces and writes what this renders.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleet.sim.state import iter_tokens, token_text

# Request fields that take the rich path (a request with none of them keeps the plain fast path).
RICH_FIELDS = (
    "n",
    "logprobs",
    "top_logprobs",
    "echo",
    "stop",
    "stop_token_ids",
    "seed",
    "response_format",
    "tools",
    "stream_options",
)


def wants_rich(body: dict[str, Any]) -> bool:
    for k in RICH_FIELDS:
        v = body.get(k)
        if k == "stream_options":
            if isinstance(v, dict) and v.get("continuous_usage_stats") is True:
                return True
        elif k == "n":
            if v != 1 and v is not None:
                return True
        elif v is not None and v is not False and v != []:
            return True
    return False


@dataclass
class Choice:
    index: int
    pieces: list[str] = field(default_factory=list)  # text per generated token (what is streamed)
    tokens: list[int] = field(default_factory=list)
    finish: str = "length"
    stop_reason: str | int | None = None
    tool: dict[str, str] | None = None  # id, name (the arguments are the pieces)


@dataclass
class Request:
    chat: bool
    n: int = 1
    logprobs: int | None = None  # alternatives per token (chat: top_logprobs), None: no logprobs
    echo: str | None = None
    stop: list[str] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    seed: int = 0
    json_output: bool = False
    tool_name: str | None = None
    continuous_usage: bool = False


def read_request(body: dict[str, Any], chat: bool) -> Request:
    r = Request(chat=chat)
    n = body.get("n")
    r.n = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    lp = body.get("logprobs")
    if chat:
        if lp is True:
            top = body.get("top_logprobs")
            r.logprobs = top if isinstance(top, int) and not isinstance(top, bool) else 0
    elif isinstance(lp, int) and not isinstance(lp, bool):
        r.logprobs = lp
    if not chat and body.get("echo") is True:
        prompt = body.get("prompt")
        r.echo = prompt if isinstance(prompt, str) else "\n".join(map(str, prompt or []))
    stop = body.get("stop")
    r.stop = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str) and s]
    r.stop_ids = [t for t in body.get("stop_token_ids") or [] if isinstance(t, int)]
    seed = body.get("seed")
    r.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    fmt = body.get("response_format")
    r.json_output = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if chat and isinstance(tools, list) and tools and choice != "none":
        fn = choice.get("function") if isinstance(choice, dict) else None
        fn = fn or (tools[0].get("function") if isinstance(tools[0], dict) else None) or {}
        r.tool_name = str(fn.get("name") or "tool")
    opts = body.get("stream_options")
    r.continuous_usage = isinstance(opts, dict) and opts.get("continuous_usage_stats") is True
    return r


def generate(r: Request, key: bytes, engine_seed: int, max_tokens: int) -> list[Choice]:
    out = []
    for i in range(r.n):
        c = Choice(index=i)
        seed = engine_seed ^ (r.seed * 1_000_003) ^ (i * 7919)
        text = ""
        for tok in iter_tokens(key, seed, max_tokens):
            if tok in r.stop_ids:
                c.finish, c.stop_reason = "stop", tok
                break
            piece = token_text(tok)
            hit = _first_stop(text + piece, r.stop, len(text))
            if hit is not None:
                cut, s = hit
                if cut > len(text):
                    c.pieces.append((text + piece)[len(text) : cut])
                    c.tokens.append(tok)
                c.finish, c.stop_reason = "stop", s
                break
            text += piece
            c.pieces.append(piece)
            c.tokens.append(tok)
        if r.tool_name is not None:
            digest = hashlib.blake2b(key + i.to_bytes(4, "little"), digest_size=8).hexdigest()
            c.tool = {"id": f"chatcmpl-tool-{digest}", "name": r.tool_name}
            c.pieces = _wrap(c.pieces, '{"query": "', '"}')
            c.finish, c.stop_reason = "tool_calls", None
        elif r.json_output:
            c.pieces = _wrap(c.pieces, '{"answer": "', '"}')
        out.append(c)
    return out


def _first_stop(text: str, stops: list[str], since: int) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        j = text.find(s, max(0, since - len(s) + 1))
        if j != -1 and (best is None or j < best[0]):
            best = (j, s)
    return best


def _wrap(pieces: list[str], head: str, tail: str) -> list[str]:
    if not pieces:
        return [head + tail]
    return (
        [head + pieces[0], *pieces[1:-1], pieces[-1] + tail] if len(pieces) > 1 else [head + pieces[0] + tail]
    )


def _lp(tok: int) -> float:
    return -((tok % 97) + 1) / 16


def _alternatives(tok: int, k: int) -> list[tuple[str, float]]:
    return [(token_text(tok + j), _lp(tok) - j / 4) for j in range(max(k, 1))]


def completion_logprobs(r: Request, c: Choice, lo: int, hi: int, offset: int) -> dict[str, Any] | None:
    if r.logprobs is None:
        return None
    toks = c.tokens[lo:hi]
    offsets, at = [], offset
    for p in c.pieces[lo:hi]:
        offsets.append(at)
        at += len(p)
    return {
        "text_offset": offsets,
        "token_logprobs": [_lp(t) for t in toks],
        "tokens": [token_text(t) for t in toks],
        "top_logprobs": [dict(_alternatives(t, r.logprobs)) for t in toks],
    }


def chat_logprobs(r: Request, c: Choice, lo: int, hi: int) -> dict[str, Any] | None:
    if r.logprobs is None:
        return None
    content = []
    for t in c.tokens[lo:hi]:
        text = token_text(t)
        top = [
            {"token": a, "logprob": lp, "bytes": list(a.encode())} for a, lp in _alternatives(t, r.logprobs)
        ]
        content.append(
            {
                "token": text,
                "logprob": _lp(t),
                "bytes": list(text.encode()),
                "top_logprobs": top[: r.logprobs],
            }
        )
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def full_body(
    r: Request, head: dict[str, Any], choices: list[Choice], prompt_tokens: int, token_ids: bool
) -> dict[str, Any]:
    docs = []
    for c in choices:
        text = "".join(c.pieces)
        d: dict[str, Any] = {"index": c.index}
        if r.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "tool_calls": []}
            if c.tool is not None:
                msg["content"] = None
                call = {"name": c.tool["name"], "arguments": text}
                msg["tool_calls"] = [{"id": c.tool["id"], "type": "function", "function": call}]
            msg["reasoning_content"] = None
            d["message"] = msg
            d["logprobs"] = chat_logprobs(r, c, 0, len(c.tokens))
        else:
            d["text"] = (r.echo or "") + text
            d["logprobs"] = completion_logprobs(r, c, 0, len(c.tokens), len(r.echo or ""))
        d["finish_reason"] = c.finish
        d["stop_reason"] = c.stop_reason
        if token_ids:
            d["token_ids"] = c.tokens
        if not r.chat:
            d["prompt_logprobs"] = None
        docs.append(d)
    body = dict(head)
    body["choices"] = docs
    body["usage"] = usage(prompt_tokens, sum(len(c.tokens) for c in choices))
    body["kv_transfer_params"] = None
    return body


def chunks(
    r: Request, head: dict[str, Any], choices: list[Choice], prompt_tokens: int, token_ids: bool
) -> list[list[dict[str, Any]]]:
    """The stream's chunk documents, grouped by engine step (the caller sleeps between steps)."""
    steps: list[list[dict[str, Any]]] = []
    if r.chat:  # vLLM's first chunk per choice: the role, no output
        steps.append([_chunk(head, c, {"role": "assistant", "content": ""}, None) for c in choices])
    done = 0
    longest = max((len(c.pieces) for c in choices), default=0)
    for j in range(longest):
        step = []
        for c in choices:
            if j >= len(c.pieces):
                continue
            last = j == len(c.pieces) - 1
            fin = c.finish if last else None
            piece = c.pieces[j]
            tok = c.tokens[j : j + 1] if j < len(c.tokens) else []
            if r.chat:
                if c.tool is not None:
                    if j == 0:  # the call's header (id, name) as its own delta, then the arguments
                        call0 = {"index": 0, "id": c.tool["id"], "type": "function"}
                        call0["function"] = {"name": c.tool["name"], "arguments": ""}
                        step.append(_chunk(head, c, {"tool_calls": [call0]}, None))
                    delta: dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                else:
                    delta = {"content": piece}
                ch = _chunk(head, c, delta, fin)
                ch["choices"][0]["logprobs"] = chat_logprobs(r, c, j, j + 1)
            else:
                text = ((r.echo or "") if j == 0 else "") + piece
                offset = len(r.echo or "") + sum(len(p) for p in c.pieces[:j])
                ch = _chunk(head, c, None, fin, text)
                ch["choices"][0]["logprobs"] = completion_logprobs(r, c, j, j + 1, offset)
            if token_ids:
                ch["choices"][0]["token_ids"] = tok
            done += len(tok)
            if r.continuous_usage:
                ch["usage"] = usage(prompt_tokens, done)
            step.append(ch)
        steps.append(step)
    return steps


def _chunk(
    head: dict[str, Any], c: Choice, delta: dict[str, Any] | None, fin: str | None, text: str = ""
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": c.index}
    if delta is not None:
        choice["delta"] = delta
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = fin
    choice["stop_reason"] = c.stop_reason if fin is not None else None
    body = dict(head)
    body["choices"] = [choice]
    return body


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
