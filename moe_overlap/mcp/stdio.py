"""The stdio transport, bounded: every line gets an answer or is dropped by the rules, and stdin's end is seen.

Why not the SDK's ``stdio_server`` as it is: a line it cannot parse (not JSON, nested beyond pydantic's limit, a
JSON array) is logged and dropped, so a client waiting for that request's answer waits forever; and a line is read
whole, however long. Here:

- a line longer than MAX_MESSAGE_BYTES is skipped to its end and answered -32600 (Invalid Request);
- a line that is not JSON (or nested too deeply for the JSON reader) is answered -32700 (Parse error), id null;
  an integer over 4000 digits (Python's int() stops at 4300) does not make it unreadable: the request is
  answered -32602 with its own id;
- JSON that is not a valid message is answered -32602 (Invalid params) with its id when it is a request that
  names a method and carries an id, else -32600 with id null; notifications are never answered (JSON-RPC 2.0);
- the process's own fd 0 and 1 point at /dev/null and stderr while serving (as the SDK does), so child processes
  (verification ranks) can neither read the client's bytes nor write onto the wire.
Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

logger = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 32 << 20  # a 4 MB log passed inline, JSON-escaped, fits with room to spare


def _claim(fd: int, replacement: int) -> int:
    """A private duplicate of `fd` (above the standard range), with `fd` itself pointed at `replacement`."""
    private = os.dup(fd)
    if private <= 2:  # keep the wire out of the standard descriptors children inherit
        moved = os.dup(private)
        os.close(private)
        private = moved
    os.set_inheritable(private, False)
    os.dup2(replacement, fd)
    return private


def _error(code: int, message: str, request_id=None) -> SessionMessage:
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                             error=types.ErrorData(code=code, message=message)))


MAX_INT_DIGITS = 4000  # under Python's 4300-digit limit for int(), which would make the line unreadable


class _Huge(int):
    """An integer too long to convert: kept as its digit count, so the request's id can still be answered."""


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    return _Huge(digits) if digits > MAX_INT_DIGITS else int(text)


def _has_huge(data) -> bool:
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, _Huge):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def top_level_id(line: bytes) -> tuple[str | int | None, bool]:
    """(the "id" of a JSON object's top level, whether it has a "method"), found by one linear scan that skips
    nested values without parsing them: for a message too deeply nested for the JSON reader."""
    text = line.decode("utf-8", "replace")
    depth, i, n, key, expect_key = 0, 0, len(text), None, False
    found, has_method = None, False
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            token = text[i:j + 1]
            if depth == 1 and expect_key:
                key, expect_key = token, False
            elif depth == 1 and key == '"id"':
                found = token
            i = j + 1
            continue
        if c in "{[":
            depth += 1
            expect_key = depth == 1
        elif c in "}]":
            depth -= 1
        elif c == "," and depth == 1:
            key, expect_key = None, True
        elif depth == 1 and key == '"id"' and c not in ": \t\r\n":
            j = i
            while j < n and text[j] not in ",} \t\r\n":
                j += 1
            found, i = text[i:j], j
            continue
        if depth == 1 and key == '"method"':
            has_method = True
        i += 1
    try:
        value = json.loads(found) if found is not None and len(found) <= 200 else None
    except ValueError:
        value = None
    return (value if isinstance(value, str | int) and not isinstance(value, bool) else None), has_method


def answer_for(line: bytes) -> SessionMessage | None:
    """The error answer for a line that is not a valid JSON-RPC message (None: a notification, never answered)."""
    try:
        data = json.loads(line, parse_int=_parse_int)
    except RecursionError:  # valid JSON maybe, nested past the reader's depth: answer the request's own id
        request_id, has_method = top_level_id(line)
        if request_id is None:
            return None if has_method and b'"id"' not in line else _error(
                types.PARSE_ERROR, "Parse error: not a JSON document (or nested too deeply)")
        return _error(types.INVALID_PARAMS, "Invalid params: nested too deeply. Fix: send arguments nested at "
                      "most a few levels (the tool's input schema shows their shape)", request_id)
    except ValueError:
        return _error(types.PARSE_ERROR, "Parse error: not a JSON document (or nested too deeply)")
    if isinstance(data, dict):
        request_id = data.get("id")
        if isinstance(request_id, bool | _Huge) or not isinstance(request_id, (str, int)):
            request_id = None
        if isinstance(data.get("method"), str):
            if request_id is None and "id" not in data:
                return None  # an invalid notification: JSON-RPC answers no notification
            if _has_huge(data.get("params")):
                return _error(types.INVALID_PARAMS, f"Invalid params: an integer of more than {MAX_INT_DIGITS} "
                              "digits. Fix: send each number within its argument's range (the tool's input "
                              "schema gives the bounds)", request_id)
            return _error(types.INVALID_PARAMS, "Invalid params: the message does not fit the method's schema "
                          "(or is nested too deeply)", request_id)
        return _error(types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response",
                      request_id)
    return _error(types.INVALID_REQUEST, "Invalid Request: a message must be one JSON object (no batches)")


class _LineReader:
    """Lines of at most `limit` bytes from a descriptor; an oversized line is read to its end and reported."""

    def __init__(self, fd: int, limit: int):
        self._file = os.fdopen(fd, "rb", buffering=1 << 16, closefd=False)
        self._limit = limit

    def readline(self) -> tuple[bytes, bool]:
        """(line, oversized); (b"", False) at end of input."""
        line = self._file.readline(self._limit + 1)
        if len(line) <= self._limit or line.endswith(b"\n"):
            return line, False
        while line and not line.endswith(b"\n"):  # skip the rest of the oversized line, bounded per read
            line = self._file.readline(1 << 20)
        return b"", True


@asynccontextmanager
async def bounded_stdio_server(on_eof: Callable[[], None] | None = None) -> AsyncIterator[tuple]:
    """(read stream, write stream) over this process's stdin/stdout, with the rules of the module docstring.
    `on_eof` runs as soon as the client closes stdin (before in-flight requests are wound down)."""
    null_fd = os.open(os.devnull, os.O_RDONLY)
    wire_in = _claim(0, null_fd)
    os.close(null_fd)
    wire_out = _claim(1, 2)
    reader = _LineReader(wire_in, MAX_MESSAGE_BYTES)
    own_threads = anyio.CapacityLimiter(2)  # the wire never waits for a thread that a tool holds
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(wire_out, view):]

    async def stdin_reader() -> None:
        async with read_writer:
            while True:
                line, oversized = await anyio.to_thread.run_sync(reader.readline, abandon_on_cancel=True,
                                                                  limiter=own_threads)
                if oversized:
                    await write_stream.send(_error(types.INVALID_REQUEST,
                                                   f"Invalid Request: a message is limited to {MAX_MESSAGE_BYTES} bytes"))
                    continue
                if not line:  # the client closed stdin: the session is over
                    if on_eof is not None:
                        on_eof()
                    return
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except Exception:  # noqa: BLE001 - every kind of bad line gets its answer
                    answer = answer_for(line)
                    if answer is not None:
                        await write_stream.send(answer)
                    continue
                await read_writer.send(SessionMessage(message))

    drained = anyio.Event()

    async def stdout_writer() -> None:
        try:
            async with write_reader:
                async for session_message in write_reader:
                    text = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    try:
                        await anyio.to_thread.run_sync(write, text.encode("utf-8"), abandon_on_cancel=True,
                                                       limiter=own_threads)
                    except OSError:  # the client is gone
                        return
        finally:
            drained.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdin_reader)
            tg.start_soon(stdout_writer)
            try:
                yield read_stream, write_stream
            finally:
                # The session is over: answers already handed to the writer go out (a second at most: a client
                # that no longer reads must not keep the server alive), then both tasks stop.
                with anyio.CancelScope(shield=True):
                    await write_stream.aclose()
                    with anyio.move_on_after(1.0):
                        await drained.wait()
                tg.cancel_scope.cancel()
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)


async def serve_stdio(server, on_eof: Callable[[], None] | None = None) -> None:
    """Run an MCPServer over the bounded stdio transport until the client closes stdin."""
    low = server._lowlevel_server  # what MCPServer.run_stdio_async drives; the transport is the only change
    async with bounded_stdio_server(on_eof) as (read_stream, write_stream):
        await low.run(read_stream, write_stream, low.create_initialization_options())
