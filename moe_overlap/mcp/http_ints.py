"""Streamable HTTP: a request the SDK cannot parse (an integer over 4300 digits, nesting past its depth) still
gets an answer to its own id.

The SDK parses a POST body with pydantic_core.from_json, which stops at such a body ("number out of range",
"recursion limit exceeded"): the client gets an HTTP 400 parse error with id null and never an answer to its
request. This ASGI wrapper parses a POST body first with the same parser; a body it cannot read gets the stdio
transport's answer (stdio.answer_for: -32602 with the request's own id, nothing for a notification, -32700
for what is not JSON at all) as a JSON response; every other request goes to the SDK unchanged. Torch-free.
"""

from __future__ import annotations

import pydantic_core

from moe_overlap.mcp.stdio import answer_for


class LongIntGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if _readable(body):
            return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}],
                                                 receive), send)
        answer = answer_for(body)
        if answer is None:  # a notification: accepted, never answered (JSON-RPC 2.0)
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        payload = answer.message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _readable(body: bytes) -> bool:
    """The SDK's own parser reads it (then the SDK answers it as usual)."""
    try:
        pydantic_core.from_json(body)
    except ValueError:
        return False
    return True


def _replay(messages, receive):
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
