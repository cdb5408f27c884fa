"""Restart command templates: parsed once, rendered without a shell (pure, no I/O).

A template is split into argv once (``shlex.split``) when the worker's configuration is loaded.
Rendering substitutes each placeholder *inside one argument* in a single pass — a value is never
scanned again, so an engine id containing ``{url}`` stays the literal text ``{url}`` — and the
argv runs with ``create_subprocess_exec``: no shell sees the values.

Placeholders: ``{iid}`` (engine id), ``{url}`` (engine base URL), ``{host}`` and ``{port}`` (from
the URL); ``{{`` and ``}}`` are literal braces. ``{name!q}`` is the value shell-quoted
(``shlex.quote``) for a command that hands its arguments to *another* shell, e.g. ssh, which joins
its arguments and lets the remote user's shell parse them::

    ssh -o BatchMode=yes -- {host} sudo systemctl restart vllm@{iid!q}

A template with ``shell: true`` (worker configuration only) is run by ``/bin/sh -c``: every value
is substituted shell-quoted, and a placeholder written inside quotes (``"{iid}"``, where the shell
would re-read the quoted value) is refused when the configuration is loaded.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

FIELDS = ("iid", "url", "host", "port")
_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_]+)(!q)?\}")


class TemplateError(ValueError):
    """A template the worker refuses to load (the message names it and why)."""


@dataclass(frozen=True)
class Values:
    iid: str
    url: str

    def get(self, name: str) -> str:
        if name == "iid":
            return self.iid
        if name == "url":
            return self.url
        parts = urlsplit(self.url) if self.url else None
        if name == "host":
            return (parts.hostname or "") if parts else ""
        if parts is None:
            return ""
        return str(parts.port or (443 if parts.scheme == "https" else 80))


def _check_placeholders(text: str) -> None:
    for m in _TOKEN.finditer(text):
        if m.group(1) is not None and m.group(1) not in FIELDS:
            raise TemplateError(
                f"unknown placeholder {m.group(0)} in {text!r} (known: {', '.join('{' + f + '}' for f in FIELDS)})"
            )


def _quoted_placeholders(text: str) -> list[str]:
    """Placeholders that sit inside single or double quotes of a shell string."""
    found: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote == "" and c in "'\"":
            quote = c
        elif quote and c == quote:
            quote = ""
        elif quote and c == "{":
            m = _TOKEN.match(text, i)
            if m and m.group(1):
                found.append(m.group(0))
        i += 1
    return found


def parse_exec(template: str) -> tuple[str, ...]:
    """The argv template of an exec-mode command (no shell)."""
    _check_placeholders(template)
    try:
        argv = tuple(shlex.split(template))
    except ValueError as exc:
        raise TemplateError(f"cannot split {template!r} into arguments: {exc}") from None
    if not argv:
        raise TemplateError("empty command template")
    if any(m.group(1) for m in _TOKEN.finditer(argv[0])):
        raise TemplateError(f"the program of {template!r} must not be a placeholder")
    return argv


def check_shell(template: str) -> str:
    """A shell-mode template: placeholders only outside quotes (the worker quotes every value)."""
    _check_placeholders(template)
    if not template.strip():
        raise TemplateError("empty command template")
    inside = _quoted_placeholders(template)
    if inside:
        raise TemplateError(
            f"{', '.join(inside)} inside quotes in {template!r}: the shell would re-read the value; "
            "write the placeholder bare, the worker quotes every value for the shell"
        )
    return template


def _substitute(text: str, values: Values, quote_all: bool) -> str:
    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        value = values.get(m.group(1))
        if quote_all:
            value = shlex.quote(value)
        return shlex.quote(value) if m.group(2) else value

    return _TOKEN.sub(one, text)  # one pass: substituted text is never scanned again


def render_exec(argv: tuple[str, ...], values: Values) -> list[str]:
    return [_substitute(arg, values, quote_all=False) for arg in argv]


def render_shell(template: str, values: Values) -> str:
    return _substitute(template, values, quote_all=True)
