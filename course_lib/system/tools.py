"""An agent's tools and how a model calls them: a calculator, a Python-docs lookup, and the call's format.

A tool call is a JSON object ``{"tool": <name>, "input": <string>}``; ``{"tool": "answer", "input": ...}``
ends the loop with an answer. ``parse_tool_call`` reads the first such object out of a model's text (None
when there is none: an unparsable call), and ``call_schema`` is the JSON schema a grammar-constrained decoder
(``SamplingParams.structured``, chapter 06) holds the model to. The calculator evaluates arithmetic by walking
Python's own parse tree (``ast``), never ``eval``; the docs lookup is the BM25 retriever of section 1 over the
standard library's docstrings. A tool's failure is an observation for the agent ("error: ..."), not a crash.
Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass

from course_lib.system.retrieval import BM25Retriever

ANSWER = "answer"  # the pseudo-tool that ends the loop
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """The value of an arithmetic ``expression`` (numbers, + - * / // % **, parentheses) as a string."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"expression must be a non-empty str, got {expression!r}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"expression {expression!r} is not arithmetic ({err.msg})") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError(f"expression {expression!r}: exponent {right} is too large (at most 64)")
            try:
                return _OPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError(f"expression {expression!r} divides by zero") from None
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        raise ValueError(f"expression {expression!r}: only numbers and + - * / // % ** ( ) are allowed")

    value = ev(tree)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class DocsLookup:
    """``lookup(query)``: the best BM25 document for ``query``, rendered and cut to ``max_chars``."""

    def __init__(self, retriever: BM25Retriever, max_chars: int = 420) -> None:
        if not isinstance(retriever, BM25Retriever):
            raise ValueError(f"retriever must be a BM25Retriever, got {type(retriever).__name__}")
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 40:
            raise ValueError(f"max_chars must be an int >= 40, got {max_chars!r}")
        self.retriever, self.max_chars = retriever, max_chars

    def __call__(self, query: str) -> str:
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"query must be a non-empty str, got {query!r}")
        [hit] = self.retriever.retrieve(query, 1)
        return hit.doc.render()[: self.max_chars]


@dataclass(frozen=True)
class ToolCall:
    tool: str
    input: str

    def to_json(self) -> str:
        return json.dumps({"tool": self.tool, "input": self.input})


_OBJECT = re.compile(r"\{[^{}]*\}")


def parse_tool_call(text: str, tools) -> ToolCall | None:
    """The first JSON object in ``text`` with a ``tool`` among ``tools`` (or "answer") and a string ``input``."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    names = _names(tools)
    for m in _OBJECT.finditer(text):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("tool") in (*names, ANSWER) and isinstance(obj.get("input"), str):
            return ToolCall(obj["tool"], obj["input"])
    return None


def call_schema(tools) -> dict:
    """The JSON schema of one call: ``tool`` one of ``tools`` or "answer", ``input`` a string."""
    return {
        "type": "object",
        "properties": {"tool": {"enum": [*_names(tools), ANSWER]}, "input": {"type": "string"}},
        "required": ["tool", "input"],
        "additionalProperties": False,
    }


def run_tool(call: ToolCall, tools: dict) -> str:
    """The tool's result, or ``"error: ..."`` when the tool rejects its input (the agent sees it)."""
    if not isinstance(call, ToolCall):
        raise ValueError(f"call must be a ToolCall, got {type(call).__name__}")
    if call.tool not in _names(tools):
        return f"error: no tool named {call.tool!r}"
    try:
        return tools[call.tool](call.input)
    except ValueError as err:
        return f"error: {err}"


def _names(tools) -> tuple[str, ...]:
    if isinstance(tools, dict):
        tools = tuple(tools)
    if isinstance(tools, str) or not tools or not all(isinstance(t, str) and t and t != ANSWER for t in tools):
        raise ValueError(f"tools must be a non-empty dict or list of tool names (not {ANSWER!r}), got {tools!r}")
    return tuple(tools)


__all__ = ["ANSWER", "DocsLookup", "ToolCall", "calculator", "call_schema", "parse_tool_call", "run_tool"]
