"""LiteLLM's tool loop against the server, as its documentation writes it: a forced call,
the assistant message appended exactly as LiteLLM returned it, the tool's result (with the
function's `name`, as LiteLLM's examples send it) and a second completion; the user message
carries a `name` too.

Usage: litellm_tools.py BASE_URL API_KEY MODEL; prints "ok" on success."""

import json
import os
import sys

# No fetch of LiteLLM's model price map from the network at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

# The same tool as the openai client's round trip (a script beside this one).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openai_tools import TOOLS  # noqa: E402


def main() -> None:
    base, key, model = sys.argv[1:4]
    args = {"model": "openai/" + model, "api_base": base + "/v1", "api_key": key}
    messages = [{"role": "user", "name": "alice", "content": "What is the weather in Paris?"}]
    first = litellm.completion(
        messages=messages, tools=TOOLS, tool_choice="required", max_tokens=60,
        temperature=0, **args,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", calls
    city = json.loads(calls[0].function.arguments)["city"]
    assert isinstance(city, str), calls
    messages.append(choice.message)
    for call in calls:
        messages.append({
            "tool_call_id": call.id, "role": "tool", "name": call.function.name,
            "content": json.dumps({"city": city, "celsius": 21}),
        })
    second = litellm.completion(messages=messages, tools=TOOLS, max_tokens=24, temperature=0,
                                **args)
    answer = second.choices[0].message
    assert answer.content or answer.tool_calls, second
    assert second.usage.prompt_tokens > first.usage.prompt_tokens, (first.usage, second.usage)
    print("ok")


if __name__ == "__main__":
    main()
