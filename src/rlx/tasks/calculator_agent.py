"""The calculator demo's agent as a plain OpenAI-client program (``configs/agent_openai.yaml``): what the
built-in loop does with ``tools: [rlx.tasks.calculator:calculator]``, written as any agent is written
against an OpenAI-compatible server. rlx serves the policy behind ``client`` and records every token."""

import json

from transformers.utils import get_json_schema

from rlx.tasks.calculator import calculator

TOOLS = [get_json_schema(calculator)]  # the schema the built-in loop shows the model


async def run(client, row):
    """Ask; while the model calls the calculator, run each call and send back its result; return the answer."""
    messages = list(row["prompt"])
    while True:
        reply = await client.chat.completions.create(model="rlx-policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message)
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except (TypeError, ValueError) as error:
                result = f"Error: {type(error).__name__}: {error}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
