"""Nested pydantic models through the official `openai` client: a tool made by
`openai.pydantic_function_tool` (whose schema refers to its nested model by a local
`#/$defs/…` `$ref`), forced and answered with arguments that parse back into the model; and a
regex bomb in a tool parameter's `pattern`, refused as a 400 naming `tools`.

Usage: openai_pydantic_tools.py BASE_URL API_KEY MODEL; prints "ok" on success."""

import sys

import openai
from openai import OpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: City


def main() -> None:
    base, key, model = sys.argv[1:4]
    client = OpenAI(base_url=base + "/v1", api_key=key)
    tool = openai.pydantic_function_tool(GetWeather)
    assert "$defs" in tool["function"]["parameters"], tool
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = client.chat.completions.parse(
        model=model, messages=messages, tools=[tool], tool_choice="required",
        max_tokens=80, temperature=0,
    )
    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "GetWeather", call
    parsed = call.function.parsed_arguments
    assert isinstance(parsed, GetWeather) and isinstance(parsed.city, City), call

    bomb = {"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "pattern": "a{1000}{1000}"}}, "required": ["x"]}}}
    try:
        client.chat.completions.create(
            model=model, messages=messages, tools=[bomb], tool_choice="required", max_tokens=8,
        )
        raise AssertionError("a regex bomb in a tool's schema was accepted")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        assert body.get("param") == "tools", e.body
        assert "max regex units" in body.get("message", ""), e.body
    print("ok")


if __name__ == "__main__":
    main()
