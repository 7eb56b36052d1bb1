"""compiler/tvmscript.quick_frames: inspect's frame lists as TVMScript reads them, without the
module lookups, installed once however many threads compile, and inspect's own back after."""

from __future__ import annotations

import inspect
import threading

import pytest

from kiln.compiler.tvmscript import quick_frames

pytestmark = pytest.mark.unit


def _fields(frames):
    return [(f.frame, f.filename, f.lineno, f.function, f.code_context, f.index) for f in frames]


def test_the_frames_are_inspects_own():
    def inner():
        own = inspect.stack(), inspect.getouterframes(inspect.currentframe())
        with quick_frames():
            quick = inspect.stack(), inspect.getouterframes(inspect.currentframe())
        return own, quick

    (own_stack, own_outer), (quick_stack, quick_outer) = inner()
    # Each list was taken on its own line of inner(): the first frame differs in its line alone.
    for own, quick in ((own_stack, quick_stack), (own_outer, quick_outer)):
        assert len(own) == len(quick) > 3
        assert _fields(own[1:]) == _fields(quick[1:])
        assert own[0].function == quick[0].function == "inner"
        assert quick[0].code_context and "quick_frames" not in quick[0].code_context[0]
        assert "inspect.stack()" in quick[0].code_context[0]


def test_a_frame_of_no_file_has_no_line():
    with quick_frames():
        frames = eval("inspect.stack()")            # noqa: S307 - a frame whose file is "<string>"
    assert frames[0].filename == "<string>" and frames[0].code_context is None and frames[0].index is None


def test_a_tvmscript_macro_parses_under_it():
    from tvm.script import tirx as T

    @T.macro
    def add_one(b, i):
        b[i] = b[i] + T.float32(1)

    def build():
        @T.prim_func(private=True)
        def f(a: T.Buffer((4,), "float32")):
            for i in range(4):
                add_one(a, i)
        return f

    plain = build()
    with quick_frames():
        quick = build()
    assert plain.script() == quick.script()


def test_threads_install_it_once_and_the_last_restores_inspect():
    import time

    from kiln.compiler import tvmscript
    deadline = time.monotonic() + 120      # a compile an earlier test abandoned may still build on its own thread
    while tvmscript._users and time.monotonic() < deadline:
        time.sleep(0.05)
    own = inspect.stack, inspect.getouterframes
    inside, release = threading.Barrier(3), threading.Event()
    seen = []

    def compile_like():
        with quick_frames():
            inside.wait()
            seen.append(inspect.stack is not own[0])
            release.wait()

    threads = [threading.Thread(target=compile_like) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert inspect.stack is not own[0]
    release.set()
    for t in threads:
        t.join()
    assert seen == [True, True]
    assert (inspect.stack, inspect.getouterframes) == own
