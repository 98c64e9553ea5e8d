"""The interpreter child of a Python session: one namespace that persists across runs.

This is the code a session's process runs (:func:`child_main`), loaded from
source by :data:`.sessions.CHILD_BOOT`: it runs each piece of code the
agent sends in one namespace, notebook style (the value of a trailing
expression comes back as the result, its rich form as a display item),
sends ``display()`` items and pyplot figures, and turns the agent's SIGINT
into ``KeyboardInterrupt`` without ever tearing a frame in half.

The agent itself never loads this module (it only keeps its source for the
children).  It is stdlib-only and imports nothing outside ``agent/``; its
heavier imports (``ast``, ``traceback``...) happen inside its functions.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional, Set, Tuple

from . import wire
from .limits import (
    BINARY_MIMES,
    DISPLAY_ITEM_LIMIT,
    ERROR_LIMIT,
    MAX_CODE_BYTES,
    MAX_DISPLAY_ITEMS,
    OWN_FILES,
    RESULT_LIMIT,
    RICH_METHODS,
)


class _Full(Exception):
    """The bounded repr has reached its limit."""


#: How repr() shows a container that holds itself.
_RECURSION: Dict[Any, str] = {list: "[...]", dict: "{...}", tuple: "(...)"}
_BRACKETS: Dict[Any, Tuple[str, str]] = {
    list: ("[", "]"),
    dict: ("{", "}"),
    set: ("{", "}"),
    frozenset: ("frozenset({", "})"),
}


def bounded_repr(value: Any, limit: int = RESULT_LIMIT) -> Tuple[str, bool]:
    """``repr(value)`` cut at ``limit`` characters, and whether it was cut.

    Built-in containers, strings and bytes are rendered piece by piece and
    the work stops at the limit, so a huge value never becomes a huge string
    first.  Other objects use their own ``repr``, cut afterwards.  Under the
    limit the text is exactly ``repr(value)``.
    """
    out: List[str] = []
    room = [limit]
    try:
        _repr_into(value, out, room, set(), 0)
    except _Full:
        return "".join(out)[:limit], True
    text = "".join(out)
    if len(text) > limit:
        return text[:limit], True
    return text, False


def _emit(piece: str, out: List[str], room: List[int]) -> None:
    out.append(piece)
    room[0] -= len(piece)
    if room[0] < 0:
        raise _Full()


def _repr_into(value: Any, out: List[str], room: List[int], seen: Set[int], depth: int) -> None:
    kind = type(value)
    if kind in (str, bytes, bytearray):
        if len(value) > room[0]:
            _emit(repr(value[: room[0] + 1]), out, room)
        _emit(repr(value), out, room)
        return
    if kind not in (list, tuple, dict, set, frozenset) or depth > 64:
        _emit(repr(value), out, room)
        return
    if id(value) in seen:  # a container that holds itself, as repr() shows it
        _emit(_RECURSION.get(kind, "{...}"), out, room)
        return
    if not value:
        _emit(repr(value), out, room)
        return
    if kind is tuple:
        opening, closing = "(", ",)" if len(value) == 1 else ")"
    else:
        opening, closing = _BRACKETS[kind]
    seen.add(id(value))
    _emit(opening, out, room)
    first = True
    if kind is dict:
        for key, item in value.items():
            if not first:
                _emit(", ", out, room)
            first = False
            _repr_into(key, out, room, seen, depth + 1)
            _emit(": ", out, room)
            _repr_into(item, out, room, seen, depth + 1)
    else:
        for item in value:
            if not first:
                _emit(", ", out, room)
            first = False
            _repr_into(item, out, room, seen, depth + 1)
    seen.discard(id(value))
    _emit(closing, out, room)


def clip(text: str, limit: int) -> Tuple[str, bool]:
    """Keep a traceback's head and (longer) tail within ``limit`` characters."""
    if len(text) <= limit:
        return text, False
    head = limit // 4
    tail = limit - head - 64
    return "%s\n[... %d characters cut ...]\n%s" % (text[:head], len(text) - head - tail, text[-tail:]), True


def child_main(rfd: int, wfd: int) -> None:
    """Serve runs from the agent until the request pipe closes (in the child)."""
    Interpreter(rfd, wfd).serve()


class Interpreter(object):
    """The persistent namespace and the loop that runs code in it (in the child)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        import builtins
        import faulthandler
        import threading
        import types

        self.rfd = rfd
        self.wfd = wfd
        # pass_fds made them inheritable; os.system() children must not get them.
        os.set_inheritable(rfd, False)
        os.set_inheritable(wfd, False)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.threading = threading
        self.running = False
        self.main_sending = False
        self.pending = False
        self.cells = 0
        self.displays = 0
        self.cut = False
        # Figures displayed during this run (objects, not ids: an id is
        # reused as soon as its object is gone), so none shows twice.
        self.shown: List[Any] = []
        self.loop: Any = None
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        main.__dict__["display"] = self.display
        # Classes and functions defined in the session live in __main__, so
        # pickle and multiprocessing find them as they would in a script.
        sys.modules["__main__"] = main
        self.ns = main.__dict__
        sys.argv = [""]
        for stream in (sys.stdout, sys.stderr):
            try:
                # Whole lines as they are printed (one write each, so one
                # chunk on the host), even under PYTHONUNBUFFERED; partial
                # lines go out on flush() and at the end of every run.
                stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
            except Exception:  # noqa: S110 - not a TextIOWrapper: leave it as it is
                pass
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            faulthandler.enable()  # a crash leaves its traceback on stderr
        except Exception:  # noqa: S110 - stderr may be unusable; the exit status still tells
            pass
        sys.meta_path.insert(0, _PyplotHook(self))

    # -- frames to the agent ----------------------------------------------------------

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not self.running:
            return  # between runs there is nothing to interrupt
        if self.main_sending:
            self.pending = True  # never tear a frame in half; raise once it is out
            return
        raise KeyboardInterrupt

    def send(self, header: Dict[str, Any], body: bytes = b"") -> None:
        if os.getpid() != self.pid:
            return  # a fork of the session (os.fork, multiprocessing) never speaks for it
        data = memoryview(wire.encode(header, body))
        main = self.threading.current_thread() is self.threading.main_thread()
        with self.lock:
            if main:
                self.main_sending = True
            try:
                while data:
                    data = data[os.write(self.wfd, data) :]
            finally:
                if main:
                    self.main_sending = False
        if main and self.pending:
            self.pending = False
            if self.running:
                raise KeyboardInterrupt

    # -- the loop ------------------------------------------------------------------------

    def serve(self) -> None:
        self.send({"t": "ready", "pid": self.pid, "python": "%d.%d.%d" % sys.version_info[:3]})
        decoder = wire.Decoder(max_body_bytes=MAX_CODE_BYTES)
        while True:
            data = os.read(self.rfd, 1024 * 1024)
            if not data:
                os._exit(0)  # the agent is gone or closed the session
            decoder.feed(data)
            for header, body in decoder.frames():
                if header.get("t") == "run":
                    self.run_cell(body)

    def run_cell(self, body: bytes) -> None:
        self.cells += 1
        self.displays = 0
        self.cut = False
        self.shown = []
        filename = "<cell-%d>" % self.cells
        try:
            result, error, interrupted = self._execute(body.decode("utf-8", "surrogatepass"), filename)
        except BaseException as exc:  # an interrupt that slipped in between our own statements
            result, error, interrupted = None, "%s\n" % type(exc).__name__, isinstance(exc, KeyboardInterrupt)
        self.running = False
        self.pending = False
        if os.getpid() != self.pid:
            os._exit(0)  # a fork that ran off the end of the code: not the session
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 - the code may have replaced or closed them
                pass
        if result is not None:
            self.send({"t": "value", "name": "result"}, result.encode("utf-8", "backslashreplace"))
        if error is not None:
            self.send({"t": "value", "name": "error"}, error.encode("utf-8", "backslashreplace"))
        self.send({"t": "ran", "truncated": self.cut, "interrupted": interrupted})

    def _execute(self, text: str, filename: str) -> Tuple[Optional[str], Optional[str], bool]:
        result: Optional[str] = None
        error: Optional[str] = None
        interrupted = False
        self.running = True
        try:
            try:
                value, has_value = self._cell(text, filename)
                if has_value and value is not None:
                    result, cut = bounded_repr(value)
                    self.cut = self.cut or cut
                    rich = self._rich(value)
                    if rich is not None and not self._was_shown(value):
                        self._emit(rich[0], rich[1], main=True)
                        self.shown.append(value)
            except BaseException as exc:
                interrupted = isinstance(exc, KeyboardInterrupt)
                error = self._format(exc)
            # Figures drawn before an error still show, as in a notebook.
            self.flush_figures()
            self.shown = []
        except BaseException as exc:  # the interrupt landed while reporting
            interrupted = interrupted or isinstance(exc, KeyboardInterrupt)
            if error is None:
                error = self._format(exc)
        self.running = False
        return result, error, interrupted

    def _cell(self, text: str, filename: str) -> Tuple[Any, bool]:
        import ast
        import linecache

        # Tracebacks and inspect.getsource() find the code of every cell.
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        # dont_inherit: this module's own __future__ imports must not leak
        # into the session's code.
        tree = compile(text, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec", flags, dont_inherit=True) if tree.body else None
        tail = compile(last, filename, "eval", flags, dont_inherit=True) if last is not None else None
        if body is not None:
            self._eval(body)
        if tail is None:
            return None, False
        return self._eval(tail), True

    def _eval(self, code: Any) -> Any:
        value = eval(code, self.ns)  # noqa: S307 - running the caller's code is the point
        if code.co_flags & 0x80:  # CO_COROUTINE: top-level await
            if self.loop is None:
                import asyncio

                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            value = self.loop.run_until_complete(value)
        return value

    def _format(self, exc: BaseException) -> str:
        import traceback

        tb = exc.__traceback__
        # Start at the session's own code: the interpreter's frames (and
        # asyncio's, for top-level await) are noise to the reader.
        walk = tb
        while walk is not None and not walk.tb_frame.f_code.co_filename.startswith("<cell-"):
            walk = walk.tb_next
        if walk is None:
            while tb is not None and tb.tb_frame.f_code.co_filename.startswith(OWN_FILES):
                tb = tb.tb_next
        else:
            tb = walk
        try:
            report = traceback.TracebackException(type(exc), exc, tb)
            # The SIGINT handler's frame ends an interrupted run's stack.
            report.stack = traceback.StackSummary.from_list(
                [f for f in report.stack if not f.filename.startswith(OWN_FILES)]
            )
            text = "".join(report.format())
        except BaseException:  # a broken __str__ on the exception
            text = "%s (its message could not be formatted)\n" % type(exc).__name__
        text, cut = clip(text, ERROR_LIMIT)
        self.cut = self.cut or cut
        return text

    # -- display -------------------------------------------------------------------------

    def display(self, *objs: Any, **_ignored: Any) -> None:
        """Show objects as rich output (the richest MIME type each offers)."""
        for obj in objs:
            rich = self._rich(obj)
            if rich is None:
                rich = ("text/plain", bounded_repr(obj)[0].encode("utf-8", "backslashreplace"))
            self._emit(rich[0], rich[1])
            self.shown.append(obj)

    def _was_shown(self, obj: Any) -> bool:
        return any(seen is obj for seen in self.shown)

    def _emit(self, mime: str, data: bytes, main: bool = False) -> None:
        if self.displays >= MAX_DISPLAY_ITEMS or len(data) > DISPLAY_ITEM_LIMIT:
            self.cut = True
            return
        self.displays += 1
        header = {"t": "display", "mime": mime}  # type: Dict[str, Any]
        if main:
            header["main"] = True  # the trailing expression's rich form, not a display() call
        self.send(header, data)

    def _rich(self, obj: Any) -> Optional[Tuple[str, bytes]]:
        if isinstance(obj, type):
            return None  # a class has the methods but cannot call them
        png = self._figure_png(obj)
        if png is not None:
            return "image/png", png
        try:
            if hasattr(obj, "_agentnest_no_such_attribute_"):
                return None  # it claims every attribute (a mock, a proxy): trust none
            bundle = getattr(obj, "_repr_mimebundle_", None)
        except Exception:
            return None
        if callable(bundle):
            try:
                got = bundle()
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    for _, mime in RICH_METHODS:
                        if got.get(mime) is not None:
                            data = _payload(mime, got[mime])
                            if data is not None:
                                return mime, data
            except Exception as exc:
                self._warn(obj, "_repr_mimebundle_", exc)
        for method, mime in RICH_METHODS:
            try:
                fn = getattr(obj, method, None)
                if not callable(fn):
                    continue
                got = fn()
            except Exception as exc:
                self._warn(obj, method, exc)
                continue
            if isinstance(got, tuple) and len(got) == 2:
                got = got[0]  # (data, metadata)
            if got is None:
                continue
            data = _payload(mime, got)
            if data is not None:
                return mime, data
        return None

    def _warn(self, obj: Any, method: str, exc: Exception) -> None:
        try:
            sys.stderr.write(
                "display: %s.%s() raised %s: %s\n" % (type(obj).__name__, method, type(exc).__name__, exc)
            )
        except Exception:  # noqa: S110 - nowhere left to say it
            pass

    def _figure_png(self, obj: Any) -> Optional[bytes]:
        figure = sys.modules.get("matplotlib.figure")
        cls = getattr(figure, "Figure", None)
        if not isinstance(cls, type) or not isinstance(obj, cls):
            return None
        import io

        buf = io.BytesIO()
        fig: Any = obj
        fig.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def flush_figures(self, *_args: Any, **_kwargs: Any) -> None:
        """Show every open pyplot figure, then close them (a notebook's inline backend)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            nums = list(plt.get_fignums())
        except Exception:
            return
        try:
            for num in nums:
                fig = plt.figure(num)
                if self._was_shown(fig):
                    continue
                png = self._figure_png(fig)
                if png is not None:
                    self._emit("image/png", png)
        finally:
            plt.close("all")


def _payload(mime: str, data: Any) -> Optional[bytes]:
    """The bytes of one representation, or None if it is not usable."""
    if mime in BINARY_MIMES:
        if isinstance(data, (bytes, bytearray)):
            return bytes(data)
        if isinstance(data, str):  # some libraries hand out base64 text
            import base64
            import binascii

            try:
                return base64.b64decode(data.encode("ascii"), validate=True)
            except (ValueError, binascii.Error):
                return None
        return None
    if mime == "application/json" and not isinstance(data, (str, bytes)):
        try:
            return json.dumps(data, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError):
            return None
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8", "backslashreplace")
    return None


class _PyplotHook(object):
    """Import hook: ``matplotlib.pyplot.show()`` shows and closes the open figures.

    With the Agg backend ``plt.show()`` would only warn; in a notebook it
    displays the figures right away, which matters for code that draws,
    shows, and draws again.  The hook wraps the loader of ``matplotlib.pyplot``
    once, so no matplotlib internals are touched.
    """

    def __init__(self, interp: Interpreter) -> None:
        self.interp = interp

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "matplotlib.pyplot":
            return None
        try:
            sys.meta_path.remove(self)  # one shot
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec
        interp = self.interp

        # A plain function: pyplot sets attributes (__signature__) on it.
        def show(*args: Any, **kwargs: Any) -> None:
            interp.flush_figures()

        def exec_module(module: Any) -> None:
            original(module)
            module.show = show

        try:
            loader.exec_module = exec_module
        except AttributeError:  # a loader with slots: keep the plain behaviour
            pass
        return spec
