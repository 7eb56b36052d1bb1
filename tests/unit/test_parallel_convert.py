"""Weight conversion on every core: results in order, bounded work ahead, errors raised; the
source's content hash, its blocks hashed on every core."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from kiln.compiler.build import _in_order


def test_parallel_conversion_keeps_order_bounds_work_ahead_and_raises():
    started, lock = [], threading.Lock()

    def fn(x):
        with lock:
            started.append(x)
        time.sleep(0.001 * (x % 3))
        if x == 7:
            raise ValueError("bad weight 7")
        return x * x

    gen = _in_order(fn, list(range(10)), workers=3)
    assert [next(gen) for _ in range(2)] == [0, 1]
    time.sleep(0.05)
    assert len(started) <= 2 + 3                              # consumed + at most `workers` ahead
    with pytest.raises(ValueError, match="bad weight 7"):
        list(gen)


def test_content_hash_is_sha256_of_names_and_block_digests(tmp_path, monkeypatch):
    from kiln.models import source
    monkeypatch.setattr(source, "_HASH_BLOCK", 1000)
    data = bytes(range(256)) * 10                                  # 2560 bytes: 3 blocks, a partial last
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "b.json").write_bytes(b"")
    files = [tmp_path / "a.bin", tmp_path / "b.json"]
    want = hashlib.sha256()
    want.update(b"a.bin")
    for start in (0, 1000, 2000):
        want.update(hashlib.sha256(data[start:start + 1000]).digest())
    want.update(b"b.json")
    want.update(hashlib.sha256(b"").digest())
    assert source.content_hash(files) == want.hexdigest()
    (tmp_path / "a.bin").write_bytes(data[:2500] + b"x" + data[2501:])   # one byte in the last block
    assert source.content_hash(files) != want.hexdigest()
