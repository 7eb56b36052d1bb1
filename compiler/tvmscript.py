"""TVMScript's parser without its cost of reading the call stack's source.

TVMScript calls inspect.stack() for every `@T.prim_func` it parses and inspect.getouterframes()
for every `T.macro` call (to find the parser in a caller's globals). Both read the source line of
every frame on the stack, and each line costs inspect.getmodule, which scans sys.modules (~3,800
with torch and transformers loaded) for a frame of no module, as the parser's eval'd expressions
are. Measured on the tiny Llama, a warm process, a 2-core host: the schedule phase 13.3 s at
q4f32 (4.2 s at q0f32), export 1.9 s (the KV cache's kernels parse there); under quick_frames
4.5 s, 1.9 s and 1.1 s.

quick_frames() swaps both for versions that walk the frames and take each line from linecache
(what inspect reads too, less the module lookup): the same FrameInfo fields, for one line of
context (any other goes to inspect's own). It counts its users, so threads that compile at once
(the library builds on its own thread while the weights convert) install it once, and the last one
out restores inspect's own.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
import threading
from types import FrameType

_lock = threading.Lock()
_users = 0
_saved: tuple = ()


def _frames(frame: FrameType | None) -> list[inspect.FrameInfo]:
    """inspect.getouterframes(frame, context=1), each line from linecache."""
    frames = []
    while frame is not None:
        code, lineno = frame.f_code, frame.f_lineno
        # No lookup for a frame of no file ("<string>", "<frozen ...>"): inspect finds no source for
        # one either, and linecache would search sys.path for it on every call.
        named = not (code.co_filename.startswith("<") and code.co_filename.endswith(">"))
        line = linecache.getline(code.co_filename, lineno, frame.f_globals) if named else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


def _stack(context: int = 1) -> list[inspect.FrameInfo]:
    if context != 1:
        return _saved[1](sys._getframe(1), context)
    return _frames(sys._getframe(1))


def _getouterframes(frame: FrameType, context: int = 1) -> list[inspect.FrameInfo]:
    return _frames(frame) if context == 1 else _saved[1](frame, context)


@contextlib.contextmanager
def quick_frames():
    """inspect.stack and inspect.getouterframes without the module lookups, while the block runs
    (anywhere in the process: TVM calls them through the inspect module)."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = (inspect.stack, inspect.getouterframes)
            inspect.stack, inspect.getouterframes = _stack, _getouterframes
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                inspect.stack, inspect.getouterframes = _saved
