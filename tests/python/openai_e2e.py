"""Drives a running superinfer server with the official `openai` package.

Usage: python3 openai_e2e.py BASE_URL API_KEY MODEL
Exits non-zero (with a traceback) on the first check that fails.
"""

import sys

import openai


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)

    models = client.models.list()
    assert [m.id for m in models.data] == [model], models

    # Chat, streamed, with usage in the last chunk.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.8,
        top_p=0.95,
        seed=1,
    )
    content, finish, usage, roles = "", None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert roles == ["assistant"], roles
    assert len(content.split()) == 5, content
    assert finish == "length", finish
    assert usage is not None and usage.completion_tokens == 5, usage

    # Chat, not streamed.
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=3,
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 3, chat.usage

    # The SDK's own round trip: the answer sent back as the SDK returned it (the message
    # object, and its full dump with every field the SDK knows, nulls included), with a
    # `name` on the user messages.
    answer = chat.choices[0].message
    again = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "Hi", "name": "alice"},
            answer,
            {"role": "user", "content": "And then?", "name": "alice"},
            answer.model_dump(),
            {"role": "user", "content": "Go on."},
        ],
        max_tokens=2,
    )
    assert again.usage.completion_tokens == 2, again.usage
    assert again.usage.prompt_tokens > chat.usage.prompt_tokens, again.usage

    # Completions, not streamed and streamed, with a stop string.
    done = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    assert done.object == "text_completion"
    assert done.usage.prompt_tokens == 4 and done.usage.completion_tokens == 4, done.usage
    assert done.choices[0].finish_reason == "length"

    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt="x", max_tokens=6, stream=True, stop=["llo he"]
        )
        if c.choices
    )
    assert text == " he", repr(text)

    # Errors arrive as the package's exceptions.
    try:
        client.completions.create(model="not-a-model", prompt="x")
        raise AssertionError("an unknown model must fail")
    except openai.NotFoundError as e:
        assert "does not exist" in str(e), e
    bad = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-si-wrong", max_retries=0)
    try:
        bad.completions.create(model=model, prompt="x")
        raise AssertionError("a bad key must fail")
    except openai.AuthenticationError:
        pass
    try:
        client.completions.create(model=model, prompt="x", temperature=7)
        raise AssertionError("a bad temperature must fail")
    except openai.BadRequestError as e:
        assert "temperature" in str(e), e

    print("openai", openai.__version__, "ok")


if __name__ == "__main__":
    main()
