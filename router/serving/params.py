"""What the router does with each sampling / output parameter of the OpenAI API over the PD split.

The one source of truth: ``serving/parse.py`` refuses what :data:`PARAMETERS` marks ``refused``
(400 naming the parameter), ``engines/legs.py`` drops from the prefill leg what is marked
``decode leg``, and ``docs/api.md`` holds the same table (``tests/unit/test_api_doc.py`` compares
them). Every field not listed here passes to both legs unchanged, like the listed ``both legs``
ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Route = Literal["both legs", "decode leg", "refused"]


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    route: Route  # where the client's value goes (or that it is refused)
    what: str  # what it does through the router (the docs/api.md table's last column)
    refused_above: int | None = None  # for a "refused" integer parameter: the largest value served


PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "n",
        "decode leg",
        "n choices, each with its `index`; the prefill leg runs one sequence (the prompt's KV is shared)",
    ),
    Parameter(
        "best_of",
        "refused",
        "values above 1 are refused (400, `param: best_of`): the router does not rank candidate "
        "sequences over the split; 1 (or null) reaches the decode leg only",
        refused_above=1,
    ),
    Parameter("echo", "both legs", "the decode engine's answer starts with the prompt, as it sent it"),
    Parameter(
        "logprobs",
        "both legs",
        "the decode engine's logprobs for every generated token (completions: the number of top "
        "alternatives; chat: true/false), relayed as the engine sent them, buffered and streamed",
    ),
    Parameter("top_logprobs", "both legs", "chat: alternatives per token, as `logprobs`"),
    Parameter(
        "prompt_logprobs",
        "refused",
        "refused (400, `param: prompt_logprobs`): the decode engine does not run the prompt (its KV "
        "comes from the prefill engine), so it cannot score it",
    ),
    Parameter(
        "stop",
        "both legs",
        "the decode engine stops on it: `finish_reason: stop`, `stop_reason` = the matched string",
    ),
    Parameter(
        "stop_token_ids",
        "both legs",
        "as `stop`; `stop_reason` = the matched token id",
    ),
    Parameter("seed", "both legs", "the decode engine samples with it: same seed, same answer"),
    Parameter(
        "response_format",
        "both legs",
        "structured output (`json_object`, `json_schema`) is decoded by the decode engine",
    ),
    Parameter(
        "tools",
        "both legs",
        "both legs render the same prompt; the decode engine's `tool_calls` reach the client "
        "(`delta.tool_calls` streamed, `message.tool_calls` buffered) and count as output",
    ),
    Parameter("tool_choice", "both legs", "as `tools`"),
    Parameter(
        "stream_options.include_usage",
        "decode leg",
        "the decode engine's final usage chunk (`choices: []`) is relayed before `[DONE]`; "
        "`stream_options` without `stream: true` is refused (400, `param: stream_options`), as vLLM does",
    ),
    Parameter(
        "stream_options.continuous_usage_stats",
        "decode leg",
        "the decode engine's `usage` on every chunk, relayed",
    ),
    Parameter(
        "min_tokens",
        "decode leg",
        "the decode engine generates at least that many tokens (the prefill leg generates one)",
    ),
    Parameter(
        "max_tokens",
        "decode leg",
        "bounds the decode leg (the prefill leg always asks for 1); above the model's context: 400",
    ),
    Parameter(
        "max_completion_tokens",
        "decode leg",
        "chat: as `max_tokens`",
    ),
    Parameter(
        "stream",
        "decode leg",
        "true: the decode leg streams and its chunks are relayed as they come; false: the decode "
        "leg answers one document and that document is the client's answer (the prefill leg is "
        "never streamed)",
    ),
    Parameter(
        "return_token_ids",
        "both legs",
        "the engine's `token_ids` (and `prompt_token_ids`) reach the client; without it the router "
        "still asks a streamed decode leg for them (to count tokens) and cuts them out",
    ),
)

BY_NAME: dict[str, Parameter] = {p.name: p for p in PARAMETERS}

# Top-level client fields the prefill leg does not get (``decode leg`` rows, and ``stream_options``
# whose members are all decode-only). ``max_tokens`` and ``stream`` are set, not dropped.
# ``best_of`` (refused above 1, so at most 1 here) is dropped too, as it always was.
PREFILL_DROP: frozenset[str] = frozenset(
    {p.name.split(".", 1)[0] for p in PARAMETERS if p.route == "decode leg"} - {"max_tokens", "stream"}
) | {"best_of"}


def refusal(body: dict[str, object]) -> tuple[str, str] | None:
    """(parameter, message) for the first refused parameter ``body`` sets, else None."""
    for p in PARAMETERS:
        if p.route != "refused" or p.name not in body:
            continue
        v = body[p.name]
        if v is None:
            continue
        if p.refused_above is not None:
            if type(v) is int and v <= p.refused_above:
                continue
            return p.name, f"'{p.name}' > {p.refused_above} is not supported through this router"
        return p.name, f"'{p.name}' is not supported through this router: {p.what.split(': ', 1)[-1]}"
    return None


def markdown_table() -> str:
    """The parameter table of ``docs/api.md`` (a test keeps the two equal)."""
    lines = ["| Parameter | Reaches | Through the router |", "|---|---|---|"]
    lines += [f"| `{p.name}` | {p.route} | {p.what} |" for p in PARAMETERS]
    return "\n".join(lines)
