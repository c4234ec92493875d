#!/usr/bin/env python3
"""Drive a Tidegate gateway with the official OpenAI and Anthropic Python SDKs.

Usage: sdk_client.py BASE_URL API_KEY [--model MODEL] [--only openai|anthropic] [--expect-echo]
       sdk_client.py BASE_URL API_KEY --responses [--model MODEL] [--expect-echo]
       sdk_client.py BASE_URL API_KEY --errors --model MODEL --anthropic-model MODEL
                     [--cooling-model MODEL]

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

With --responses it runs the OpenAI SDK's `responses.stream()` helper (POST /v1/responses,
stream): every event must parse, the text deltas must add up to the final response's text.

With --errors it checks the gateway's own answers as the SDKs type them instead:
  1. OpenAI    models.retrieve(MODEL)             GET /v1/models/MODEL: the model object
  2. OpenAI    models.retrieve("no-such-model")   openai.NotFoundError, code model_not_found
  3. Anthropic messages.create with a wrong key   anthropic.AuthenticationError, Anthropic body
  4. Anthropic messages.create(--cooling-model)   anthropic.RateLimitError, Anthropic body
                                                  (only with --cooling-model: a model the
                                                  gateway is holding back)
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


def openai_responses_stream(client, model, expect_echo):
    pieces, kinds = [], []
    with client.responses.stream(model=model, input=PROMPT) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                pieces.append(event.delta)
        final = stream.get_final_response()
    text = "".join(pieces)
    check_text("openai responses stream", text, expect_echo)
    require(final.output_text == text, f"final text {final.output_text!r} != deltas {text!r}")
    require(kinds and kinds[-1] == "response.completed", f"last event {kinds[-1:]!r}")
    return {"content": text, "events": kinds}


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


def openai_retrieve(client, model):
    m = client.models.retrieve(model)
    require(m.id == model, f"openai retrieve: id {m.id!r} != {model!r}")
    require(m.object == "model", f"openai retrieve: object {m.object!r}")
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        require(e.code == "model_not_found", f"openai retrieve: code {e.code!r}")
        return {"id": m.id, "owned_by": m.owned_by, "not_found": type(e).__name__}
    raise CheckFailed("openai retrieve: an unknown model did not raise NotFoundError")


def anthropic_error(client, model, expected, anthropic_type):
    try:
        client.messages.create(
            model=model, max_tokens=16, messages=[{"role": "user", "content": PROMPT}]
        )
    except expected as e:
        body = e.body if isinstance(e.body, dict) else {}
        require(body.get("type") == "error", f"{anthropic_type}: body {e.body!r}")
        got = (body.get("error") or {}).get("type")
        require(got == anthropic_type, f"{anthropic_type}: error.type {got!r}")
        code = e.response.headers.get("x-tidegate-error")
        require(code, f"{anthropic_type}: no x-tidegate-error header")
        return {"exception": type(e).__name__, "type": got, "code": code}
    raise CheckFailed(f"{anthropic_type}: the call did not raise {expected.__name__}")


def error_checks(args, origin):
    """The --errors checks, as (name, check, client) like the others; each check ignores
    the (client, model, expect_echo) it is called with."""
    oa = openai.OpenAI(
        base_url=origin + "/v1", api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S
    )
    wrong = anthropic.Anthropic(
        base_url=origin, api_key="not-" + args.api_key, max_retries=0, timeout=TIMEOUT_S
    )
    an = anthropic.Anthropic(
        base_url=origin, api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S
    )
    checks = [
        ("openai_retrieve", lambda *_: openai_retrieve(oa, args.model), None),
        (
            "anthropic_authentication_error",
            lambda *_: anthropic_error(
                wrong, args.anthropic_model, anthropic.AuthenticationError, "authentication_error"
            ),
            None,
        ),
    ]
    if args.cooling_model:
        checks.append((
            "anthropic_rate_limit_error",
            lambda *_: anthropic_error(
                an, args.cooling_model, anthropic.RateLimitError, "rate_limit_error"
            ),
            None,
        ))
    return checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("api_key")
    parser.add_argument("--model", default="mock/echo")
    parser.add_argument("--only", choices=["openai", "anthropic"])
    parser.add_argument("--expect-echo", action="store_true")
    parser.add_argument("--errors", action="store_true")
    parser.add_argument("--responses", action="store_true")
    parser.add_argument("--anthropic-model")
    parser.add_argument("--cooling-model")
    args = parser.parse_args()

    origin = args.base_url.rstrip("/")
    if origin.endswith("/v1"):
        origin = origin[: -len("/v1")]

    if args.errors:
        return run_checks(args, error_checks(args, origin))

    checks = []
    if args.responses:
        oa = openai.OpenAI(
            base_url=origin + "/v1", api_key=args.api_key, max_retries=0, timeout=TIMEOUT_S
        )
        return run_checks(args, [("openai_responses_stream", openai_responses_stream, oa)])
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
    return run_checks(args, checks)


def run_checks(args, checks):
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
