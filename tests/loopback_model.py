"""A scripted model server on the loopback interface that coding-agent CLIs take for their provider: it speaks the
Anthropic Messages API and OpenAI's Responses and Chat Completions APIs, streaming (server-sent events) and not.

Stateless: each request's step is the number of tool results its conversation already holds, so step N answers with
the script's Nth shell command as a call of whatever shell tool the request offers (Claude Code's `Bash`, Codex's
`exec_command` or `shell`), and past the last command with a closing text. Requests offering no tools (titles,
summaries, quota probes) get a one-word text. A request whose key is not the server's is answered 401, as real
providers do. Every request is logged (path, model, step, key accepted) for the test to inspect; each answer reports
fixed token usage, so usage and cost can be checked end to end.
"""
from __future__ import annotations

import http.server
import itertools
import json
import threading
from dataclasses import dataclass, field

INPUT_TOKENS, OUTPUT_TOKENS, CACHED_TOKENS = 1200, 300, 200


@dataclass
class Script:
    """Shell commands the model runs one per turn, then the text it closes with."""

    commands: list[str]
    closing: str = "Done: kernel submitted and SKILL.md written."
    api_key: str = "sk-loopback-test-key"


@dataclass
class _Log:
    requests: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, entry: dict) -> None:
        with self.lock:
            self.requests.append(entry)


class LoopbackModel:
    """`with LoopbackModel(script) as server:` serves on 127.0.0.1 at `server.url` (no /v1) until the block ends."""

    def __init__(self, script: Script) -> None:
        self.script, self.log = script, _Log()
        self._ids = itertools.count(1)
        handler = type("Handler", (_Handler,), {"model": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "LoopbackModel":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_id(self) -> int:
        return next(self._ids)


def _tool_results(body: dict) -> int:
    """How many tool results the conversation of a request already holds, in any of the three APIs."""
    count = 0
    for item in body.get("messages") or []:
        if item.get("role") == "tool":
            count += 1
        content = item.get("content")
        if isinstance(content, list):
            count += sum(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    items = body.get("input")
    if isinstance(items, list):
        count += sum(isinstance(i, dict) and i.get("type") in ("function_call_output", "local_shell_call_output",
                                                                "custom_tool_call_output") for i in items)
    return count


def _tool_names(body: dict) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        names.append(tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type") or "")
    return names


def _shell_call(names: list[str], command: str) -> tuple[str, dict] | None:
    """(tool name, arguments) that run `command` through the shell tool the client offers, or None."""
    if "Bash" in names:
        return "Bash", {"command": command, "description": "run a step of the script"}
    if "exec_command" in names:
        return "exec_command", {"cmd": command, "yield_time_ms": 600000}
    if "shell" in names:
        return "shell", {"command": ["bash", "-lc", command]}
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model: LoopbackModel

    def log_message(self, *args) -> None:  # quiet: the test reads `LoopbackModel.log`
        pass

    def do_HEAD(self) -> None:  # connectivity probes
        self._send(200, b"", "text/plain")

    def do_GET(self) -> None:  # model lists and probes
        self._json(200, {"object": "list", "data": [], "models": []})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        path = self.path.split("?")[0]
        key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
        accepted = key == self.model.script.api_key
        step = _tool_results(body)
        self.model.log.add({"path": path, "model": body.get("model"), "step": step, "stream": bool(body.get("stream")),
                            "key_accepted": accepted, "tools": len(body.get("tools") or [])})
        if path.endswith("/count_tokens"):
            return self._json(200, {"input_tokens": INPUT_TOKENS})
        if not accepted:
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return self._json(401, {"type": "error", "error": error})
        call = None
        if step < len(self.model.script.commands):
            call = _shell_call(_tool_names(body), self.model.script.commands[step])
        text = None if call else (self.model.script.closing if body.get("tools") else "OK")
        answer = {"/v1/messages": self._messages, "/v1/responses": self._responses,
                  "/v1/chat/completions": self._chat}.get(path)
        if answer is None:
            return self._json(404, {"error": {"type": "not_found_error", "message": f"no route {path}"}})
        answer(body, call, text)

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, body: dict) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _events(self, events: list[tuple[str | None, dict | str]]) -> None:
        """Server-sent events, each `event:` (where named) and `data:` line, then the stream closes."""
        chunks = []
        for name, data in events:
            line = data if isinstance(data, str) else json.dumps(data)
            chunks.append((f"event: {name}\n" if name else "") + f"data: {line}\n\n")
        self._send(200, "".join(chunks).encode(), "text/event-stream")

    # -- Anthropic Messages ----------------------------------------------------------------------------------------
    def _messages(self, body: dict, call, text) -> None:
        n = self.model.next_id()
        usage = {"input_tokens": INPUT_TOKENS - CACHED_TOKENS, "cache_read_input_tokens": CACHED_TOKENS,
                 "cache_creation_input_tokens": 0, "output_tokens": OUTPUT_TOKENS}
        block = ({"type": "tool_use", "id": f"toolu_{n:04d}", "name": call[0], "input": call[1]} if call
                 else {"type": "text", "text": text})
        stop = "tool_use" if call else "end_turn"
        message = {"id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return self._json(200, message)
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        if call:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call[1])}
        else:
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": text}
        self._events([
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": opened}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": OUTPUT_TOKENS}}),
            ("message_stop", {"type": "message_stop"})])

    # -- OpenAI Responses ------------------------------------------------------------------------------------------
    def _responses(self, body: dict, call, text) -> None:
        n = self.model.next_id()
        if call:
            name, arguments = call
            item = {"type": "function_call", "id": f"fc_{n:04d}", "call_id": f"call_{n:04d}", "name": name,
                    "arguments": json.dumps(arguments), "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{n:04d}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        usage = {"input_tokens": INPUT_TOKENS, "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
                 "output_tokens": OUTPUT_TOKENS, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}
        response = {"id": f"resp_{n:04d}", "object": "response", "status": "completed", "model": body.get("model"),
                    "output": [item], "usage": usage}
        if not body.get("stream"):
            return self._json(200, response)
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [("response.created", {"type": "response.created", "response": pending}),
                  ("response.in_progress", {"type": "response.in_progress", "response": pending}),
                  ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                                  "item": {**item, "status": "in_progress"}})]
        if call:
            events.append(("response.function_call_arguments.delta", {
                "type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": 0,
                "delta": item["arguments"]}))
        else:
            events.append(("response.output_text.delta", {"type": "response.output_text.delta", "item_id": item["id"],
                                                          "output_index": 0, "content_index": 0, "delta": text}))
        events += [("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                                  "item": item}),
                   ("response.completed", {"type": "response.completed", "response": response})]
        self._events(events)

    # -- OpenAI Chat Completions -----------------------------------------------------------------------------------
    def _chat(self, body: dict, call, text) -> None:
        n = self.model.next_id()
        usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS, "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}}
        if call:
            calls = [{"index": 0, "id": f"call_{n:04d}", "type": "function",
                      "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
            message, finish = {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": text}, "stop"
        base = {"id": f"chatcmpl-{n:04d}", "created": 0, "model": body.get("model")}
        if not body.get("stream"):
            return self._json(200, {**base, "object": "chat.completion", "usage": usage,
                                    "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        chunk = {**base, "object": "chat.completion.chunk"}
        self._events([(None, {**chunk, "choices": [{"index": 0, "delta": message, "finish_reason": None}]}),
                      (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
                      (None, {**chunk, "choices": [], "usage": usage}), (None, "[DONE]")])
