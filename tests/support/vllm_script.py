"""What the real vLLM of the tests answers: scripts a prompt names, and the tokens each forces.

Gemma 3 270M (the base model, tests/vllmproc.py) writes junk, and tests need exact answers. So the
test logits processor (vllm_logits.py, loaded into vLLM with `--logits-processors`) forces, token
by token, the answer a script says: reasoning between Gemma's reserved ids 6 and 7 (renamed
`<think>`/`</think>` by .ci/deps/vllm_convert.py, so vLLM's own deepseek_r1 parser splits it
off), content, tool calls in the Hermes format (vLLM's own hermes parser reads them), then the end
of turn (id 106, a stop token of the model's generation config), or, for `repeat`, never an end
(the answer runs to `max_tokens`). Everything else (scheduling, streaming, the parsers, usage,
aborts, metrics, the prefix cache) is vLLM's own.

A prompt names its script with a directive, `[[hlf:NAME]]`, anywhere in it; the LAST directive in
the prompt wins, so that a later turn (a user turn, a tool result) can name the next answer's. A
prompt without one gets DEFAULT (a short reasoning answer: the seeds' `"hi"` examples), and
`[[hlf:free]]` lets the model run free.

This module is pure (no vLLM, no torch): the tests import it for the texts they expect.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

THINK, END_THINK = 6, 7  # <unused0>/<unused1>, renamed <think>/</think>
END_OF_TURN = 106
DIRECTIVE = re.compile(r"\[\[hlf:([A-Za-z0-9_-]+)\]\]")


@dataclass(frozen=True)
class Script:
    reasoning: str | None = None  # None: no <think> at all ("": an empty <think></think>)
    content: str = ""
    tool_calls: tuple[tuple[str, dict], ...] = ()
    repeat: str | None = None  # after the rest, this text again and again: no end of turn
    extra: dict = field(default_factory=dict)

    def tool_text(self) -> str:
        return "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
                       for n, a in self.tool_calls)


def directive(name: str) -> str:
    """The marker a prompt carries to get script `name`."""
    assert name in SCRIPTS or name == "free", name
    return f"[[hlf:{name}]]"


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

SCRIPTS: dict[str, Script] = {
    # no directive: what the seeds' Verify commands ("hi") get
    "default": Script(reasoning="The user greets me. A short, friendly answer fits.",
                      content="Hello! How can I help you today?"),
    "reason": Script(reasoning="Two and two make four; I say so plainly.", content="Two plus two is four."),
    # deepseek_r1 reads an answer without </think> as all reasoning (R1 always thinks): an answer
    # with none is an empty <think></think> first, as R1 writes it
    "plain": Script(reasoning="", content="Just an answer, with no thinking before it."),
    "think-only": Script(reasoning="I think about it and then say nothing at all."),
    "stop": Script(reasoning="Counting is easy.", content="One, two, three, STOP, four, five."),
    "weather": Script(reasoning="The user wants the weather in Paris; get_weather tells it.",
                      tool_calls=(("get_weather", {"city": "Paris"}),)),
    "after-weather": Script(reasoning="The tool says sunny and 21 degrees.",
                            content="It is sunny in Paris, 21 degrees."),
    "long": Script(reasoning="A long story, then.", content="Once upon a time",
                   repeat=" the dragon flew on and on,"),
}
DEFAULT = SCRIPTS["default"]


def script_for(prompt: str) -> Script | None:
    """The script a prompt names (its last directive), DEFAULT when it names none, None for free."""
    found = DIRECTIVE.findall(prompt)
    if not found:
        return DEFAULT
    name = found[-1]
    if name == "free":
        return None
    return SCRIPTS.get(name, DEFAULT)


@dataclass(frozen=True)
class Plan:
    """The forced token ids of one answer, then `repeat` over and over, or the end of turn."""

    tokens: tuple[int, ...]
    repeat: tuple[int, ...] = ()

    def at(self, n: int) -> int:
        if n < len(self.tokens):
            return self.tokens[n]
        if self.repeat:
            return self.repeat[(n - len(self.tokens)) % len(self.repeat)]
        return END_OF_TURN


def plan(script: Script, encode: Callable[[str], list[int]]) -> Plan:
    """`encode`: text -> token ids, no special tokens added."""
    ids: list[int] = []
    if script.reasoning is not None:
        ids += [THINK, *encode(script.reasoning), END_THINK]
    if script.content:
        ids += encode(script.content)
    if script.tool_calls:
        ids += encode(script.tool_text())
    return Plan(tuple(ids), tuple(encode(script.repeat)) if script.repeat else ())
