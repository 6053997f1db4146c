"""The agents' calculator (``tools: [rlx.tasks.calculator:calculator]``): arithmetic the tiny demo model
cannot do in its head (``configs/agent_calculator.yaml``), and GSM8K's (``configs/gpu/gsm8k_qwen2.5_0.5b_agent.yaml``).

The expression is parsed, never evaluated as code: numbers, ``+``, ``-``, ``*``, ``/``, unary minus and
parentheses only, computed exactly (fractions), so model output cannot run anything.
"""

from __future__ import annotations

import ast
import json
import operator
from fractions import Fraction

from rlx.agents.format import tool_turn_ids

OPERATIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_CHARS = 200  # bounds the numbers a product of literals can reach


def calculator(expression: str) -> str:
    """Compute an arithmetic expression exactly.

    Args:
        expression: Numbers joined by +, -, * and /, with parentheses, e.g. "4821 + 3977" or "(12 - 4.5) / 3".
    """
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    result = value(tree.body)
    return str(result.numerator) if result.denominator == 1 else f"{float(result):.10g}"


def value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(repr(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATIONS:
        return OPERATIONS[type(node.op)](value(node.left), value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -value(node.operand)
    raise ValueError(f"only numbers, +, -, * and / are allowed, not {ast.unparse(node)!r}")


def expression(solution: str) -> str:
    """The problem's arithmetic as one expression, from its worked solution (``a op b = r`` per line):
    ``a op b``, then ``(a op b) op c`` and so on, as the lines chain."""
    lines = [line.split(" = ")[0] for line in solution.split("\n") if " = " in line]
    chained = lines[0]
    for line in lines[1:]:
        _, op, number = line.split(" ")
        chained = f"({chained}) {op} {number}"
    return chained


def call_text(arithmetic: str) -> str:
    """The model's turn that calls the calculator, in the Qwen family's format (rlx.agents.format)."""
    call = {"name": "calculator", "arguments": {"expression": arithmetic}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def tool_example(tokenizer, prompt: list[int], solution: str) -> tuple[list[int], list[int]]:
    """(input ids, labels) of a warm-start rollout that calls the calculator and answers with its
    result: the ids an agent rollout has (rlx.agents.loop), the tool's own tokens left out of the loss."""
    arithmetic = expression(solution)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = [*encode(call_text(arithmetic)), tokenizer.eos_token_id]
    result = tool_turn_ids(tokenizer, [{"role": "tool", "name": "calculator", "content": calculator(arithmetic)}])
    answer = [*encode(f"#### {calculator(arithmetic)}"), tokenizer.eos_token_id]
    return [*prompt, *call, *result, *answer], [-100] * len(prompt) + call + [-100] * len(result) + answer
