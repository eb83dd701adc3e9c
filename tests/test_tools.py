"""Tool calling (LPX issue 27, item 2): tool_choice required and named are enforced with the
structured-output machinery, so the demo's tiny random model returns calls that parse and validate
against their parameters' schema - streamed (OpenAI's tool-call deltas) and not, finish_reason
tool_calls; tool messages go back into the conversation. The family parsers (auto) and the checks of
tools / tool_choice run without a server.
"""

from __future__ import annotations

import json

import pytest

from pipeline.gateway import toolparsers
from pipeline.gateway.errors import ApiError
from pipeline.gateway.schemas import ChatCompletionRequest
from pipeline.gateway.tools import ToolCalls, tool_mode

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "tiny-llama"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 6}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": MODEL, "messages": USER, **kw})


# -- unit ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, text, calls",
    [
        (
            "hermes",
            'Sure.<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
            [("get_time", {"zone": "UTC"})],
        ),
        (
            "llama3_json",
            '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}',
            [("get_time", {"zone": "CET"})],
        ),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "PST"}}, {"name": "x", "arguments": {}}]',
            [("get_time", {"zone": "PST"}), ("x", {})],
        ),
    ],
)
def test_family_parsers_find_calls(name, text, calls) -> None:
    content, found = toolparsers.PARSERS[name](text)
    assert [(n, json.loads(a)) for n, a in found] == calls
    assert toolparsers.PARSERS[name]("just words, no call") == ("just words, no call", [])


def test_parser_is_picked_from_setting_config_or_template() -> None:
    assert toolparsers.pick(None, "llama", None) == "llama3_json"
    assert toolparsers.pick(None, "qwen2", None) == "hermes"
    assert toolparsers.pick(None, "mistral", None) == "mistral"
    assert toolparsers.pick(None, None, "{{ '[TOOL_CALLS]' }}") == "mistral"
    assert toolparsers.pick("hermes", "llama", None) == "hermes"
    with pytest.raises(ValueError, match="not one of"):
        toolparsers.pick("nope", None, None)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"tools": [{"type": "function"}]}, "must be"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "same name"),
    ],
)
def test_bad_tools_are_400(kw, words) -> None:
    with pytest.raises(ApiError, match=words) as err:
        tool_mode(_req(**kw), "hermes")
    assert err.value.status == 400


def test_auto_needs_a_template_that_renders_tools() -> None:
    """tool_choice auto (the default with tools) is refused when the chat template never reads `tools`
    (SmolLM2-135M-Instruct's, the demo's): the model would not see them; required / named still work."""
    from pipeline.gateway.text import TextCodec
    from pipeline.gateway.tools import check_template

    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with_tools = "{% if tools %}{{ tools | tojson }}{% endif %}" + plain
    codecs = {}
    for name, template in (("plain", plain), ("tools", with_tools), ("broken", "{% for %}")):
        codecs[name] = TextCodec.__new__(TextCodec)  # the template check only, no tokenizer
        codecs[name].template, codecs[name]._reads_tools = template, None
    assert [codecs[n].reads_tools for n in ("plain", "tools", "broken")] == [False, True, True]
    auto = tool_mode(_req(tools=TOOLS), "hermes")
    with pytest.raises(ApiError, match="never reads `tools`") as err:
        check_template(auto, reads_tools=False)
    assert err.value.status == 400 and err.value.param == "tool_choice"
    check_template(auto, reads_tools=True)
    for choice in ("required", "none", {"type": "function", "function": {"name": "get_time"}}):
        check_template(tool_mode(_req(tools=TOOLS, tool_choice=choice), "hermes"), reads_tools=False)


def test_required_guide_lists_the_tools_and_answers_parse() -> None:
    tm = tool_mode(_req(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), "hermes")
    schema = json.loads(tm.guide.text)
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    message, reason = ToolCalls(tm).message('[{"name": "get_time", "parameters": {"zone": "UTC"}}]', "stop")
    assert reason == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "get_time"
    assert tool_mode(_req(tools=TOOLS, tool_choice="none"), "hermes").calls is False


# -- end to end ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(torch_triton, tmp_path_factory):
    from helpers_engine import session_gateway

    for proc in session_gateway(torch_triton, tmp_path_factory.mktemp("tools"), MODEL):
        yield openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _valid(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed(stream) -> tuple[list[dict], str]:
    """Tool-call deltas joined per index, as OpenAI's clients do; and the finish_reason."""
    calls: dict[int, dict] = {}
    reason = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = entry["id"] or d.id
            entry["name"] = entry["name"] or (d.function.name if d.function else None)
            entry["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[i] for i in sorted(calls)], reason


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_calls_validate(client, choice) -> None:
    for t in (0, 1.0):
        out = client.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=300,
            temperature=t,
            parallel_tool_calls=False,  # one call: a random model would add calls until max_tokens
        )
        c = out.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        _valid(c.message.tool_calls)
        if isinstance(choice, dict):
            assert [x.function.name for x in c.message.tool_calls] == ["get_weather"]


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_streamed_calls_validate(client, choice) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=300,
        stream=True,
        temperature=1.0,
        parallel_tool_calls=False,
    )
    calls, reason = _streamed(stream)
    assert reason == "tool_calls" and calls
    for call in calls:
        assert call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.triton
@pytest.mark.slow
def test_tool_results_go_back_into_the_conversation(client) -> None:
    first = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=300,
        temperature=0,
        parallel_tool_calls=False,
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    # the demo's template never reads `tools`: auto (the default with tools) would hide them from the model
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=8)
    assert info.value.param == "tool_choice" and "never reads `tools`" in info.value.message
    out = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt
