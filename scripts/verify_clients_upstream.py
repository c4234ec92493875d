#!/usr/bin/env python3
"""A scripted LLM upstream for scripts/verify-clients.sh: one tool round trip.

Serves POST /v1/chat/completions (OpenAI format) and POST /v1/messages (Anthropic format),
streamed or not, on 127.0.0.1 (port 0; prints "upstream listening on ADDR"). It plays a
model that uses the client's shell tool once:

- a request whose conversation holds no tool result is answered with one call of the
  client's shell tool (Claude Code's `Bash`, Codex CLI's `exec_command`, or `shell`), whose
  command echoes the marker found in the prompt (`tidegate-check-…`) with `-tool` appended;
- for the model `agent`, when Codex's multi-agent namespace is offered (flattened by the
  gateway to `multi_agent_v1__close_agent` and so on), the call is `close_agent` with the
  id `<marker>-tool`, which Codex refuses with an error quoting the id: that answer reaches
  the model only if the gateway gave the call back its namespace (a call of a plain
  `close_agent`, or of the flat name, is "unsupported call" to Codex);
- a request that holds a tool result is answered with text quoting that result.

So the client's final answer holds `<marker>-tool` only if the client ran the command and
sent its output back through the gateway. Standard library only.
"""

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKER = re.compile(r"tidegate-check-[a-z]+-[0-9]+")
# The model name `agent` asks for this tool instead of the shell.
AGENT_TOOL = "multi_agent_v1__close_agent"


def texts(v):
    """Every string inside a JSON value, depth first."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from texts(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from texts(x)


def tool_result(req, anthropic):
    """The text of the conversation's last tool result, or None."""
    found = None
    for m in req.get("messages", []):
        if anthropic:
            if isinstance(m.get("content"), list):
                for b in m["content"]:
                    if isinstance(b, dict) and b.get("type") == "tool_result":
                        found = " ".join(texts(b.get("content", "")))
        elif m.get("role") == "tool":
            found = " ".join(texts(m.get("content", "")))
    return found


def tool_call(req, anthropic):
    """(name, arguments) of a call of the client's shell tool."""
    names = []
    for t in req.get("tools", []):
        names.append(t.get("name") if anthropic else (t.get("function") or {}).get("name"))
    m = MARKER.search(" ".join(texts(req.get("messages", []))))
    command = "echo %s-tool" % (m.group(0) if m else "tidegate-check-none-0")
    if req.get("model") == "agent" and AGENT_TOOL in names:
        # Codex's namespaced multi-agent tool, flattened by the gateway: closing an agent
        # that does not exist makes Codex answer with an error that quotes the id.
        return AGENT_TOOL, {"target": "%s-tool" % (m.group(0) if m else "tidegate-check-none-0")}
    if "Bash" in names:
        return "Bash", {"command": command, "description": "Echo the marker"}
    if "exec_command" in names:
        return "exec_command", {"cmd": command}
    return "shell", {"command": ["bash", "-lc", command]}


def sse(event, data):
    head = "event: %s\n" % event if event else ""
    return "%sdata: %s\n\n" % (head, json.dumps(data))


def chat_answer(req, text, call):
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if call:
        name, args = call
        tc = {"id": "call_tg1", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args)}}
        message = {"role": "assistant", "content": None, "tool_calls": [tc]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": text}
        finish = "stop"
    if not req.get("stream"):
        return "application/json", json.dumps({
            "id": "chatcmpl-tg", "object": "chat.completion", "created": 0, "model": "tool",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage})
    base = {"id": "chatcmpl-tg", "object": "chat.completion.chunk", "created": 0, "model": "tool"}

    def chunk(delta, finish_reason=None):
        return sse(None, dict(base, choices=[{"index": 0, "delta": delta,
                                              "finish_reason": finish_reason}]))

    out = chunk({"role": "assistant", "content": ""})
    if call:
        tc = dict(message["tool_calls"][0], index=0)
        out += chunk({"tool_calls": [tc]})
    else:
        out += chunk({"content": text})
    out += chunk({}, finish)
    if (req.get("stream_options") or {}).get("include_usage"):
        out += sse(None, dict(base, choices=[], usage=usage))
    return "text/event-stream", out + "data: [DONE]\n\n"


def messages_answer(req, text, call):
    if call:
        name, args = call
        block = {"type": "tool_use", "id": "toolu_tg1", "name": name, "input": args}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": text}
        stop = "end_turn"
    msg = {"id": "msg_tg", "type": "message", "role": "assistant", "model": "tool",
           "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 10, "output_tokens": 1}}
    if not req.get("stream"):
        return "application/json", json.dumps(dict(msg, content=[block], stop_reason=stop))
    out = sse("message_start", {"type": "message_start", "message": dict(msg, content=[])})
    if call:
        start = dict(block, input={})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": text}
    out += sse("content_block_start",
               {"type": "content_block_start", "index": 0, "content_block": start})
    out += sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    out += sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out += sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": 5}})
    out += sse("message_stop", {"type": "message_stop"})
    return "text/event-stream", out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.reply(400, "application/json", '{"error":{"message":"bad json"}}')
        path = self.path.split("?")[0]
        if path not in ("/v1/chat/completions", "/v1/messages"):
            return self.reply(404, "application/json", '{"error":{"message":"no such path"}}')
        anthropic = path == "/v1/messages"
        result = tool_result(req, anthropic)
        call = None if result is not None else tool_call(req, anthropic)
        text = "The command printed: %s" % (result or "").strip()
        answer = messages_answer if anthropic else chat_answer
        self.reply(200, *answer(req, text, call))

    def reply(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print("upstream listening on %s:%d" % (host, port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
