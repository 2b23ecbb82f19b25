"""Pure: text that is shown somewhere that renders it - the Temporal UI renders a workflow's summary and
current details as Markdown (and the HTML in it). A user's question, a tool name or a call id the model made
up must show as the literal text it is, never as markup: no links, images or tags an operator's browser
would fetch or render."""

from __future__ import annotations

import html
import re

# Markdown's punctuation that can start or end markup; a backslash makes each a literal character.
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def markdown_literal(text: str) -> str:
    """`text` as Markdown that renders exactly as `text` (on one line)."""
    one_line = " ".join(text.split())
    return _MARKDOWN.sub(r"\\\1", html.escape(one_line, quote=False))
