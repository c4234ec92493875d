#!/usr/bin/env python3
"""Drive a Tidegate gateway with the official OpenAI and Anthropic Python SDKs.

Usage: sdk_client.py BASE_URL API_KEY [--model MODEL] [--only openai|anthropic] [--expect-echo]

BASE_URL is the server origin, e.g. http://127.0.0.1:8080 (a trailing /v1 is ignored): the
OpenAI SDK gets BASE_URL/v1, the Anthropic SDK BASE_URL (it appends /v1/messages itself).

Calls, in this order (a scripted mock upstream relies on it):
  1. OpenAI    chat.completions.create            POST /v1/chat/completions
  2. OpenAI    chat.completions.create stream=True POST /v1/chat/completions
  3. Anthropic messages.create                     POST /v1/messages
  4. Anthropic messages.stream                     POST /v1/messages

Each call must yield a well-formed answer as the SDK parses it: non-empty text, a finish/stop
reason, and for streams a clean end (the SDK iterator finishes without error; for Anthropic,
message_start first and message_stop last). With --expect-echo the text must also contain the
prompt (the mock provider's `echo` model). Prints one JSON line with the results and exits 0,
or prints a JSON line with "ok": false, says what failed on stderr and exits 1.
"""

import argparse
import json
import os
import sys

PROMPT = "tidegate compat check: say hello"

# Nothing from the environment may redirect or re-authenticate the SDKs: the test decides.
for _name in (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
    "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
):
    os.environ.pop(_name, None)

import anthropic  # noqa: E402
import openai  # noqa: E402

TIMEOUT_S = 30.0


class CheckFailed(Exception):
    pass


def require(cond, what):
    if not cond:
        raise CheckFailed(what)


def check_text(name, text, expect_echo):
    require(isinstance(text, str) and text.strip(), f"{name}: empty text")
    if expect_echo:
        require(PROMPT in text, f"{name}: text does not echo the prompt: {text!r}")


def openai_chat(client, model, expect_echo):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}]
    )
    require(r.choices, "openai chat: no choices")
    choice = r.choices[0]
    check_text("openai chat", choice.message.content, expect_echo)
    require(choice.finish_reason, "openai chat: no finish_reason")
    return {
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "model": r.model,
    }


def openai_chat_stream(client, model, expect_echo):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True
    )
    pieces, finish, chunks = [], None, 0
    with stream:
        for chunk in stream:
            chunks += 1
            for choice in chunk.choices:
                if choice.delta is not None and choice.delta.content:
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
    text = "".join(pieces)
    require(chunks > 0, "openai stream: no chunks")
    check_text("openai stream", text, expect_echo)
    require(finish, "openai stream: no chunk carried a finish_reason")
    return {"content": text, "finish_reason": finish, "chunks": chunks}


def anthropic_message(client, model, expect_echo):
    m = client.messages.create(
        model=model, max_tokens=256, messages=[{"role": "user", "content": PROMPT}]
    )
    require(m.type == "message", f"anthropic message: type {m.type!r}")
    text = "".join(b.text for b in m.content if b.type == "text")
    check_text("anthropic message", text, expect_echo)
    require(m.stop_reason, "anthropic message: no stop_reason")
    return {"content": text, "stop_reason": m.stop_reason, "model": m.model}


def anthropic_stream(client, model, expect_echo):
    events, pieces = [], []
    with client.messages.stream(
        model=model, max_tokens=256, messages=[{"role": "user", "content": PROMPT}]
    ) as stream:
        for event in stream:
            events.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                pieces.append(event.delta.text)
        final = stream.get_final_message()
    text = "".join(pieces)
    require(events and events[0] == "message_start", f"anthropic stream: events {events}")
    require(events[-1] == "message_stop", f"anthropic stream: did not end with message_stop: {events}")
    check_text("anthropic stream", text, expect_echo)
    final_text = "".join(b.text for b in final.content if b.type == "text")
    require(final_text == text, f"anthropic stream: final {final_text!r} != deltas {text!r}")
    require(final.stop_reason, "anthropic stream: no stop_reason")
    return {"content": text, "stop_reason": final.stop_reason, "events": len(events)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("api_key")
    parser.add_argument("--model", default="mock/echo")
    parser.add_argument("--only", choices=["openai", "anthropic"])
    parser.add_argument("--expect-echo", action="store_true")
    args = parser.parse_args()

    origin = args.base_url.rstrip("/")
    if origin.endswith("/v1"):
        origin = origin[: -len("/v1")]

    checks = []
    if args.only in (None, "openai"):
        oa = openai.OpenAI(
            base_url=origin + "/v1", api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S
        )
        checks += [("openai_chat", openai_chat, oa), ("openai_chat_stream", openai_chat_stream, oa)]
    if args.only in (None, "anthropic"):
        an = anthropic.Anthropic(
            base_url=origin, api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S
        )
        checks += [
            ("anthropic_message", anthropic_message, an),
            ("anthropic_stream", anthropic_stream, an),
        ]

    results = {
        "ok": True,
        "sdk": {"openai": openai.__version__, "anthropic": anthropic.__version__},
        "model": args.model,
    }
    for name, check, client in checks:
        try:
            results[name] = check(client, args.model, args.expect_echo)
        except CheckFailed as e:
            return fail(results, name, str(e))
        except Exception as e:  # an SDK error is a failed check, reported with its kind
            return fail(results, name, f"{type(e).__name__}: {e}")
    print(json.dumps(results), flush=True)
    return 0


def fail(results, name, message):
    results["ok"] = False
    results["failed"] = name
    results["error"] = message
    print(json.dumps(results), flush=True)
    print(f"sdk_client: {name} FAILED: {message}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
