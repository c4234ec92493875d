#!/usr/bin/env python3
"""Drive a Tidegate gateway across formats with the official SDKs.

Usage: sdk_translate.py BASE_URL API_KEY openai MODEL     (an Anthropic-format upstream)
       sdk_translate.py BASE_URL API_KEY anthropic MODEL  (an OpenAI-format upstream)
       sdk_translate.py BASE_URL API_KEY responses MODEL  (a Chat-Completions-only or an
                                                          Anthropic-format upstream)
       sdk_translate.py BASE_URL API_KEY responses-stream MODEL

openai mode, calls in this order (the scripted mock upstream relies on it):
  1. chat.completions.create with a system prompt and an image (base64 data URL)
  2. chat.completions.create stream=True, stream_options include_usage
  3. chat.completions.create with tools: the answer must be a tool call
  4. chat.completions.create with the tool call and its tool result sent back

anthropic mode:
  1. messages.create with system blocks and tools: the answer must be a tool_use block
  2. messages.create with the tool_use and its tool_result sent back
  3. messages.stream with thinking enabled: thinking and text blocks, message_stop last

responses mode:
  1. responses.create with instructions and function tools: the answer must be a function call
  2. responses.create with that call and its function_call_output sent back: a text answer
  3. responses.stream with reasoning (summary auto): reasoning summary and text deltas, the
     final response from response.completed equal to what the deltas built, with usage

responses-stream mode: call 3 of responses mode alone (a stream the gateway may splice
  from two upstreams), also reporting the event types, sequence numbers and final output

combo-openai / combo-anthropic mode (MODEL a combo whose targets alternate formats):
  1. a create call (chat.completions / messages), then
  2. a stream (chat.completions stream=True with include_usage / messages.stream);
  each answered by whichever target the gateway fails over to

Every answer is parsed by the SDK's own types. Prints one JSON line with what was seen and
exits 0, or says what failed on stderr and exits 1.
"""

import json
import os
import sys

for _name in (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
    "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
):
    os.environ.pop(_name, None)

import anthropic  # noqa: E402
import openai  # noqa: E402

TIMEOUT_S = 30.0
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class CheckFailed(Exception):
    pass


def require(cond, what):
    if not cond:
        raise CheckFailed(what)


def openai_mode(origin, key, model):
    c = openai.OpenAI(base_url=origin + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)
    out = {}
    r = c.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
            ]},
        ],
        max_tokens=100,
    )
    require(isinstance(r, openai.types.chat.ChatCompletion), "chat: not a ChatCompletion")
    ch = r.choices[0]
    require(ch.message.content, "chat: no content")
    require(ch.finish_reason == "stop", f"chat: finish_reason {ch.finish_reason!r}")
    require(r.usage and r.usage.prompt_tokens > 0, "chat: no usage")
    out["chat"] = {"content": ch.message.content, "model": r.model, "prompt_tokens": r.usage.prompt_tokens}

    pieces, finish, usage = [], None, None
    stream = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count"}], stream=True,
        stream_options={"include_usage": True}, max_tokens=100,
    )
    with stream:
        for chunk in stream:
            require(isinstance(chunk, openai.types.chat.ChatCompletionChunk), "stream: not a chunk")
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
    require(pieces, "stream: no content")
    require(finish == "stop", f"stream: finish_reason {finish!r}")
    require(usage is not None and usage.completion_tokens > 0, "stream: no usage chunk")
    out["stream"] = {"content": "".join(pieces), "completion_tokens": usage.completion_tokens}

    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model=model, messages=msgs, tools=[TOOL], max_tokens=100)
    ch = r.choices[0]
    require(ch.finish_reason == "tool_calls", f"tools: finish_reason {ch.finish_reason!r}")
    require(ch.message.tool_calls, "tools: no tool_calls")
    call = ch.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    require(call.function.name == "get_weather", "tools: wrong name")
    out["tool_call"] = {"id": call.id, "arguments": args}
    msgs.append(ch.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
    r = c.chat.completions.create(model=model, messages=msgs, tools=[TOOL], max_tokens=100)
    ch = r.choices[0]
    require(ch.message.content, "tool result: no content")
    require(ch.finish_reason == "stop", f"tool result: finish_reason {ch.finish_reason!r}")
    out["tool_result"] = {"content": ch.message.content}
    return out


def anthropic_mode(origin, key, model):
    c = anthropic.Anthropic(base_url=origin, api_key=key, max_retries=0, timeout=TIMEOUT_S)
    out = {}
    tools = [{
        "name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]
    system = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
    ]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    m = c.messages.create(model=model, max_tokens=200, system=system, tools=tools, messages=msgs)
    require(isinstance(m, anthropic.types.Message), "tools: not a Message")
    require(m.stop_reason == "tool_use", f"tools: stop_reason {m.stop_reason!r}")
    uses = [b for b in m.content if b.type == "tool_use"]
    require(uses, f"tools: no tool_use block in {m.content!r}")
    use = uses[0]
    require(use.input.get("city") == "Paris", f"tools: input {use.input!r}")
    out["tool_use"] = {"id": use.id, "name": use.name, "input": use.input}
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    msgs.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21C"}]})
    m = c.messages.create(model=model, max_tokens=200, system=system, tools=tools, messages=msgs)
    text = "".join(b.text for b in m.content if b.type == "text")
    require(text, "tool result: no text")
    require(m.stop_reason == "end_turn", f"tool result: stop_reason {m.stop_reason!r}")
    out["tool_result"] = {"content": text}

    events, thinking, pieces = [], [], []
    with c.messages.stream(
        model=model, max_tokens=4000, messages=[{"role": "user", "content": "Think, then answer"}],
        thinking={"type": "enabled", "budget_tokens": 2048},
    ) as stream:
        for event in stream:
            events.append(event.type)
            if event.type == "content_block_delta":
                if event.delta.type == "thinking_delta":
                    thinking.append(event.delta.thinking)
                elif event.delta.type == "text_delta":
                    pieces.append(event.delta.text)
        final = stream.get_final_message()
    require(events and events[0] == "message_start", f"stream: events {events}")
    require(events[-1] == "message_stop", f"stream: events {events}")
    require(thinking, "stream: no thinking")
    kinds = [b.type for b in final.content]
    require(kinds == ["thinking", "text"], f"stream: final blocks {kinds}")
    require(final.content[1].text == "".join(pieces), "stream: final text differs from deltas")
    require(final.stop_reason == "end_turn", f"stream: stop_reason {final.stop_reason!r}")
    require(final.usage.output_tokens > 0, "stream: no usage")
    out["stream"] = {"thinking": "".join(thinking), "content": "".join(pieces),
                     "output_tokens": final.usage.output_tokens}
    return out


def responses_mode(origin, key, model):
    c = openai.OpenAI(base_url=origin + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)
    out = {}
    tools = [{
        "type": "function", "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]
    inp = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
    r = c.responses.create(model=model, instructions="Be brief.", input=inp, tools=tools,
                           max_output_tokens=200, store=False)
    require(isinstance(r, openai.types.responses.Response), "create: not a Response")
    calls = [o for o in r.output if o.type == "function_call"]
    require(calls, f"create: no function_call in {r.output!r}")
    call = calls[0]
    require(isinstance(call, openai.types.responses.ResponseFunctionToolCall), "create: call type")
    args = json.loads(call.arguments)
    require(call.name == "get_weather" and args.get("city") == "Paris", f"create: call {call!r}")
    require(r.status == "completed", f"create: status {r.status!r}")
    out["call"] = {"call_id": call.call_id, "arguments": args}
    inp += [o.model_dump(exclude_none=True) for o in r.output]
    inp.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"})
    r = c.responses.create(model=model, instructions="Be brief.", input=inp, tools=tools,
                           max_output_tokens=200, store=False)
    require(r.output_text, f"call output: no text in {r.output!r}")
    require(r.usage and r.usage.input_tokens > 0, "call output: no usage")
    out["answer"] = {"text": r.output_text, "input_tokens": r.usage.input_tokens}

    out["stream"] = responses_stream(c, model)
    return out


def responses_stream(c, model):
    """responses.stream with reasoning: the checks of responses mode's call 3."""
    kinds, seqs, summary, pieces = [], [], [], []
    with c.responses.stream(
        model=model, input="Think, then answer", reasoning={"effort": "medium", "summary": "auto"},
        max_output_tokens=2000, store=False,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            seqs.append(event.sequence_number)
            if event.type == "response.reasoning_summary_text.delta":
                summary.append(event.delta)
            elif event.type == "response.output_text.delta":
                pieces.append(event.delta)
        final = stream.get_final_response()
    require(kinds and kinds[0] == "response.created", f"stream: events {kinds}")
    require(kinds[-1] == "response.completed", f"stream: events {kinds}")
    require(pieces, "stream: no text deltas")
    require(final.output_text == "".join(pieces), "stream: final text differs from deltas")
    types = [o.type for o in final.output]
    require(types == ["reasoning", "message"], f"stream: final output {types}")
    require(final.output[0].summary[0].text == "".join(summary), "stream: summary differs")
    require(final.usage and final.usage.output_tokens > 0, "stream: no usage")
    return {"summary": "".join(summary), "text": "".join(pieces), "final_text": final.output_text,
            "output_tokens": final.usage.output_tokens, "input_tokens": final.usage.input_tokens,
            "kinds": kinds, "sequence_numbers": seqs, "id": final.id,
            "output_ids": [o.id for o in final.output]}


def responses_stream_mode(origin, key, model):
    c = openai.OpenAI(base_url=origin + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)
    return {"stream": responses_stream(c, model)}


def combo_openai_mode(origin, key, model):
    c = openai.OpenAI(base_url=origin + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                  max_tokens=50)
    require(isinstance(r, openai.types.chat.ChatCompletion), "create: not a ChatCompletion")
    require(r.choices[0].finish_reason == "stop", f"create: {r.choices[0].finish_reason!r}")
    pieces, usage = [], None
    with c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}],
                                   stream=True, stream_options={"include_usage": True},
                                   max_tokens=50) as stream:
        for chunk in stream:
            require(isinstance(chunk, openai.types.chat.ChatCompletionChunk), "stream: not a chunk")
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    pieces.append(choice.delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
    require(usage is not None, "stream: no usage chunk")
    return {"create": r.choices[0].message.content, "stream": "".join(pieces),
            "completion_tokens": usage.completion_tokens}


def combo_anthropic_mode(origin, key, model):
    c = anthropic.Anthropic(base_url=origin, api_key=key, max_retries=0, timeout=TIMEOUT_S)
    m = c.messages.create(model=model, max_tokens=50, messages=[{"role": "user", "content": "Hi"}])
    require(isinstance(m, anthropic.types.Message), "create: not a Message")
    require(m.stop_reason == "end_turn", f"create: stop_reason {m.stop_reason!r}")
    with c.messages.stream(model=model, max_tokens=50,
                           messages=[{"role": "user", "content": "Count"}]) as stream:
        pieces = [e.delta.text for e in stream
                  if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        final = stream.get_final_message()
    require(final.stop_reason == "end_turn", f"stream: stop_reason {final.stop_reason!r}")
    require(final.content[0].text == "".join(pieces), "stream: final text differs from deltas")
    return {"create": "".join(b.text for b in m.content if b.type == "text"),
            "stream": "".join(pieces), "output_tokens": final.usage.output_tokens}


def main():
    origin, key, mode, model = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], sys.argv[4]
    if origin.endswith("/v1"):
        origin = origin[:-3]
    try:
        modes = {"openai": openai_mode, "anthropic": anthropic_mode, "responses": responses_mode,
                 "responses-stream": responses_stream_mode, "combo-openai": combo_openai_mode,
                 "combo-anthropic": combo_anthropic_mode}
        out = modes[mode](origin, key, model)
    except (CheckFailed, openai.APIError, anthropic.APIError) as e:
        print(json.dumps({"ok": False}))
        print(f"sdk_translate.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    out["ok"] = True
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
