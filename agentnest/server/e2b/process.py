"""envd's ``process.Process`` service, carried out through the sandbox's agent channel.

A command started here runs like any other: through the guard (approval,
audit event, secrets redacted from its output), with the sandbox's limits,
and with its whole process tree killed at its timeout (the Start call's
``connect-timeout-ms``, which is how E2B clients send ``timeout=``).  It is
owned by the sandbox, not by the request: a client that disconnects from a
background command leaves it running, and ``Connect`` (by pid or tag)
attaches to its output from then on, as envd does.  What holds the
sandbox's lease is an attached client, not the command: a command whose
clients are all gone does not keep an idle or session lease from lapsing.  Output travels as
UTF-8 text (redaction works on text; invalid bytes are replaced).

Pids are the face's own numbers (from 1001), unique per sandbox; they are
not the pids inside the sandbox, which E2B clients never need.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import StreamType
from connectrpc.server import Endpoint

from ...aio import AsyncExecutionStream
from ...errors import AgentNestError, ConfigurationError, ExecutionTimeoutError
from ..entries import Lease
from ..inputs import check_env, confine
from . import wire as w
from .rpc import box, check_user, endpoint, keepalive_interval
from .state import Box

#: Commands running at once in one sandbox through this face.
MAX_PROCESSES = 256
_SIGNALS = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, 9: 9, 15: 15, "9": 9, "15": 15}
_SIGNAL_NAMES = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}


class Proc:
    """One command: its output fanned out to every attached stream."""

    def __init__(
        self, pid: int, config: w.ProcessConfig, tag: str | None, stream: AsyncExecutionStream, pty: bool
    ) -> None:
        self.pid = pid
        self.config = config
        self.tag = tag
        self.stream = stream
        self.pty = pty
        self.subscribers: set[asyncio.Queue[w.ProcessEvent]] = set()
        self.end: w.EndEvent | None = None
        self.signalled: int | None = None

    def subscribe(self) -> asyncio.Queue[w.ProcessEvent]:
        queue: asyncio.Queue[w.ProcessEvent] = asyncio.Queue()
        self.subscribers.add(queue)
        return queue

    def _send(self, event: w.ProcessEvent) -> None:
        for queue in self.subscribers:
            queue.put_nowait(event)

    async def pump(self, owner: Box) -> None:
        """Read the command to its end; every subscriber gets every event."""
        code: int | None = None
        error: str | None = None
        timed_out = False
        try:
            async for chunk in self.stream:
                if chunk.stream == "status":
                    code = chunk.exit_code
                elif chunk.data:
                    data = chunk.data.encode("utf-8")
                    if self.pty:
                        event = w.DataEvent(pty=data)
                    elif chunk.stream == "stdout":
                        event = w.DataEvent(stdout=data)
                    else:
                        event = w.DataEvent(stderr=data)
                    self._send(w.ProcessEvent(data=event))
        except ExecutionTimeoutError as exc:
            timed_out = True
            error = str(exc)
        except AgentNestError as exc:
            error = str(exc)
        finally:
            self.end = _end_event(code, error, timed_out, self.signalled)
            owner.processes.pop(self.pid, None)
            self._send(w.ProcessEvent(end=self.end))
            with contextlib.suppress(Exception):
                await self.stream.aclose()

    async def events(
        self, queue: asyncio.Queue[w.ProcessEvent], ctx: Any, lease: Lease
    ) -> AsyncIterator[w.EventResponse]:
        """The start event, then the command's events until its end (keepalives while quiet).

        The stream holds the sandbox's ``lease`` while its client is attached: a command with
        no client left does not (an idle or session lease lapses under it, ending it)."""
        interval = keepalive_interval(ctx)
        try:
            with lease.held():
                yield w.EventResponse(event=w.ProcessEvent(start=w.StartEvent(pid=self.pid)))
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), interval)
                    except asyncio.TimeoutError:
                        yield w.EventResponse(event=w.ProcessEvent(keepalive=w.Empty()))
                        continue
                    yield w.EventResponse(event=event)
                    if event.end is not None:
                        return
        finally:
            # A client that goes away detaches; the command runs on (envd's semantics).
            self.subscribers.discard(queue)


def _end_event(code: int | None, error: str | None, timed_out: bool, signalled: int | None) -> w.EndEvent:
    """The end as Go's ``ProcessState`` tells it, which is what E2B clients show."""
    signal: int | None = None
    if timed_out:
        signal = 9
    elif code is not None and code < 0:
        signal = -code
    elif code is not None and signalled is not None and code in (128 + signalled, 128 + 9):
        signal = code - 128
    if signal is not None:
        name = _SIGNAL_NAMES.get(signal, f"signal {signal}")
        return w.EndEvent(exit_code=-1, exited=False, status=f"signal: {name}", error=error)
    if code is None:
        return w.EndEvent(
            exit_code=-1, exited=False, status="unknown", error=error or "the command's end was lost"
        )
    return w.EndEvent(exit_code=code, exited=True, status=f"exit status {code}", error=error)


def _find(owner: Box, selector: w.ProcessSelector) -> Proc:
    if selector.pid is not None:
        proc: Proc | None = owner.processes.get(selector.pid)
        if proc is not None:
            return proc
        raise ConnectError(Code.NOT_FOUND, f"process with pid {selector.pid} not found")
    if selector.tag is not None:
        procs: list[Proc] = list(owner.processes.values())
        for each in procs:
            if each.tag == selector.tag:
                return each
        raise ConnectError(Code.NOT_FOUND, f"process with tag {selector.tag[:64]!r} not found")
    raise ConnectError(Code.INVALID_ARGUMENT, "a process selector needs a pid or a tag")


def _display(config: w.ProcessConfig) -> str:
    # E2B clients send `/bin/bash -l -c <command>`: the audit log shows the command.
    if config.args[:2] == ["-l", "-c"] and len(config.args) == 3:
        return config.args[2]
    return shlex.join([config.cmd, *config.args])


class ProcessService:
    """The RPCs; each acts on the sandbox the dispatcher put in :data:`~.rpc.CURRENT`."""

    async def start(self, request: w.StartRequest, ctx: Any) -> AsyncIterator[w.EventResponse]:
        check_user(ctx)
        owner = box()
        if len(owner.processes) >= MAX_PROCESSES:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED, f"{MAX_PROCESSES} commands already run in this sandbox; wait for one"
            )
        config = request.process
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is empty")
        try:
            # envd answers a bad cwd with invalid_argument; here one outside the workspace is bad too.
            cwd = confine(owner.workdir, owner.sandbox_path(config.cwd), config.cwd)
            check_env(config.envs, "process.envs")
        except ConfigurationError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None
        timeout_ms = ctx.timeout_ms
        size = request.pty.size if request.pty is not None else None
        pty = (size.rows or 24, size.cols or 80) if request.pty is not None and size is not None else None
        if request.pty is not None and pty is None:
            pty = (24, 80)
        stream = owner.entry.sandbox.stream_exec(
            [config.cmd, *config.args],
            timeout=None if timeout_ms is None else max(timeout_ms / 1000.0, 0.001),
            env={**owner.env, **config.envs},
            cwd=cwd,
            interactive=bool(request.stdin),
            pty=pty,
            display_command=_display(config),
        )
        # Started here, so that a refusal (approval, policy) is this call's error.
        await stream.__aenter__()
        proc = Proc(owner.new_pid(), config, request.tag, stream, pty is not None)
        queue = proc.subscribe()
        owner.processes[proc.pid] = proc
        owner.spawn(proc.pump(owner))
        async for response in proc.events(queue, ctx, owner.entry.lease):
            yield response

    async def connect(self, request: w.ConnectRequest, ctx: Any) -> AsyncIterator[w.EventResponse]:
        owner = box()
        proc = _find(owner, request.process)
        async for response in proc.events(proc.subscribe(), ctx, owner.entry.lease):
            yield response

    async def list(self, request: w.Empty, ctx: Any) -> w.ListResponse:
        return w.ListResponse(
            processes=[w.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag) for p in box().processes.values()]
        )

    async def _input(self, proc: Proc, data: w.ProcessInput) -> None:
        payload = data.pty if data.pty is not None else data.stdin
        if payload is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "input needs stdin or pty bytes")
        await proc.stream.send_input(payload)

    async def send_input(self, request: w.SendInputRequest, ctx: Any) -> w.Empty:
        await self._input(_find(box(), request.process), request.input)
        return w.Empty()

    async def stream_input(self, requests: AsyncIterator[w.StreamInputRequest], ctx: Any) -> w.Empty:
        proc: Proc | None = None
        async for message in requests:
            if message.start is not None:
                proc = _find(box(), message.start.process)
            elif message.data is not None:
                if proc is None:
                    raise ConnectError(
                        Code.FAILED_PRECONDITION, "send a start event (the process) before data"
                    )
                await self._input(proc, message.data.input)
        return w.Empty()

    async def close_stdin(self, request: w.SelectorRequest, ctx: Any) -> w.Empty:
        proc = _find(box(), request.process)
        await proc.stream.close_input()
        return w.Empty()

    async def send_signal(self, request: w.SendSignalRequest, ctx: Any) -> w.Empty:
        proc = _find(box(), request.process)
        signal = _SIGNALS.get(request.signal)
        if signal is None:
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"signal {request.signal!r:.40}: send SIGKILL or SIGTERM"
            )
        # Both end the command's whole process tree: it cannot shed the kill by
        # trapping SIGTERM (the guard's cancel is a kill of the tree).
        proc.signalled = signal
        await proc.stream.kill()
        return w.Empty()

    async def update(self, request: w.UpdateRequest, ctx: Any) -> w.Empty:
        proc = _find(box(), request.process)
        if request.pty is None or request.pty.size is None:
            return w.Empty()
        if not proc.pty:
            raise ConnectError(Code.FAILED_PRECONDITION, f"process {proc.pid} has no terminal to resize")
        await proc.stream.resize(request.pty.size.rows or 24, request.pty.size.cols or 80)
        return w.Empty()


def endpoints(service: ProcessService) -> dict[str, Endpoint[Any, Any]]:
    p, stream = w.PROCESS, StreamType.SERVER_STREAM
    return dict(
        [
            endpoint(p, "Start", w.StartRequest, w.EventResponse, service.start, stream),
            endpoint(p, "Connect", w.ConnectRequest, w.EventResponse, service.connect, stream),
            endpoint(p, "List", w.Empty, w.ListResponse, service.list),
            endpoint(p, "SendInput", w.SendInputRequest, w.Empty, service.send_input),
            endpoint(
                p,
                "StreamInput",
                w.StreamInputRequest,
                w.Empty,
                service.stream_input,
                StreamType.CLIENT_STREAM,
            ),
            endpoint(p, "CloseStdin", w.SelectorRequest, w.Empty, service.close_stdin),
            endpoint(p, "SendSignal", w.SendSignalRequest, w.Empty, service.send_signal),
            endpoint(p, "Update", w.UpdateRequest, w.Empty, service.update),
        ]
    )
