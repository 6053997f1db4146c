"""Agent programs used by the endpoint tests (rlx.agents.programs), loaded by name as a user's own would be:
plain OpenAI-client code, which knows nothing of rlx."""

import asyncio
import json

from transformers.utils import get_json_schema

from helpers.agents import ping

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


async def adder(client, row):
    """Ask, run each add call the model makes, hand back the results, answer with the model's last word."""
    messages = list(row["prompt"])
    for _ in range(4):
        reply = (await client.chat.completions.create(model="rlx-policy", messages=messages, tools=[ADD])).choices[0]
        messages.append(reply.message)  # the SDK's own message object, as most agents append it
        if not reply.message.tool_calls:
            return reply.message.content
        for call in reply.message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
    return messages[-1]["content"]


async def rewriter(client, row):
    """Asks twice, the second time with its first question reworded: a history the session does not hold."""
    first = await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=4)
    reworded = [{"role": "user", "content": "Again: " + row["prompt"][0]["content"]}, first.choices[0].message]
    reworded.append({"role": "user", "content": "Sure?"})
    second = await client.chat.completions.create(model="rlx-policy", messages=reworded, max_tokens=4)
    return second.choices[0].message.content


async def raises(client, row):
    await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=2)
    raise ValueError("the agent's own bug")


async def hangs(client, row):
    await asyncio.sleep(3600)


async def chatty(client, row):
    """Calls until it is refused (the call budget), then answers as if nothing happened."""
    for _ in range(10):
        await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=2)
    return "done"


async def sends_garbage(client, row):
    """A malformed call (refused, counted), then a proper one: the rollout goes on."""
    import openai

    try:
        await client.chat.completions.create(model="rlx-policy", messages=[{"content": "no role"}])
    except openai.BadRequestError:
        pass
    reply = await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=3)
    return reply.choices[0].message.content


async def hotter(client, row):
    """Asks for another temperature on its first row (gold ``9``); behaves on the others."""
    if row["ground_truth"] != "9":
        return await adder(client, row)
    await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], temperature=0.3)
    return "unreachable"


async def says_nothing(client, row):
    await client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=2)
    return {"not": "an answer"}


def plain(client, row):
    return "not async"


async def pinger(client, row):
    """helpers.agents.ping's rollouts (helpers.teaching.agent_inputs) as a program: call, run each ping, answer."""
    messages = list(row["prompt"])
    for _ in range(2):
        reply = await client.chat.completions.create(model="rlx-policy", messages=messages, tools=[PING])
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": call.id, "content": ping()} for call in message.tool_calls]
    return message.content


PING = get_json_schema(ping)


async def one_call(client, row):
    """One call, its reply the answer: what the endpoint's overhead benchmark makes 64 of at once."""
    reply = await client.chat.completions.create(model="rlx-policy", messages=row["prompt"])
    return reply.choices[0].message.content


async def faulty(client, row):
    """The fault its row's ground truth names (``raises``, ``hangs``, ...), or a program that behaves (``9``)."""
    behaviours = {
        "raises": raises, "hangs": hangs, "chatty": chatty, "says_nothing": says_nothing, "garbage": sends_garbage,
    }  # fmt: skip
    return await behaviours.get(row["ground_truth"], adder)(client, row)


async def streaming_adder(client, row):
    """:func:`adder` with its replies streamed, the tool calls put together from the chunks as agents do."""
    messages = list(row["prompt"])
    for _ in range(4):
        stream = await client.chat.completions.create(model="rlx-policy", messages=messages, tools=[ADD], stream=True)
        content, calls = "", {}
        async for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                made = calls.setdefault(call.index, {"id": call.id, "type": "function", "function": {}})
                made["function"]["name"] = made["function"].get("name", "") + (call.function.name or "")
                made["function"]["arguments"] = made["function"].get("arguments", "") + (call.function.arguments or "")
        if not calls:
            return content
        messages.append({"role": "assistant", "content": content, "tool_calls": list(calls.values())})
        for call in calls.values():
            arguments = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(arguments["a"] + arguments["b"])}
            )
    return content
