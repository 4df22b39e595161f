"""A tool-call round trip through the official `openai` client: a forced call, the call and
its result fed back, and a streamed call reassembled from its deltas.

Usage: openai_tools.py BASE_URL API_KEY MODEL; prints "ok" on success."""

import json
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def main() -> None:
    base, key, model = sys.argv[1:4]
    client = OpenAI(base_url=base + "/v1", api_key=key)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required",
        max_tokens=60, temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str), args
    # The call and its result go back through the chat template, the call as the SDK
    # returned it (the message object itself, as the SDK's own tool-loop examples do).
    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'})
    second = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=24, temperature=0,
    )
    answer = second.choices[0].message
    assert answer.content or answer.tool_calls, second
    # Streamed: the deltas add up to one valid call.
    stream = client.chat.completions.create(
        model=model, messages=messages[:1], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60, temperature=0, stream=True,
    )
    calls = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for d in c.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
            if d.function.name:
                entry["name"] += d.function.name
            if d.function.arguments:
                entry["arguments"] += d.function.arguments
        finish = c.finish_reason or finish
    assert finish == "tool_calls", finish
    assert calls[0]["name"] == "get_weather", calls
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str), calls
    print("ok")


if __name__ == "__main__":
    main()
