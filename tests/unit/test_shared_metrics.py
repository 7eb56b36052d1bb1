"""`kiln serve --api-processes N`'s shared request metrics: another HTTP process's metrics file, created an
instant ago and not yet sized, neither breaks registering the collector nor a scrape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from kiln.runtime import metrics
from kiln.runtime.metrics import _SharedCollector

pytestmark = pytest.mark.unit


def test_a_file_created_but_not_yet_sized_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    starting = tmp_path / "counter_4242.db"
    starting.touch()                                 # what MmapedDict's open() leaves before its truncate()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_SharedCollector())            # reads nothing: once this raised struct.error

    waits = []

    def size_it(seconds):
        """The other process sizes and writes its file while the scrape waits (its first wait, whole:
        a writer thread racing the retries could be read between MmapedDict's truncate and its write)."""
        waits.append(seconds)
        if len(waits) == 1:
            d = MmapedDict(str(starting))            # as a Counter's first inc() in that process writes it
            d.write_value(mmap_key("kiln_prompt_tokens", "kiln_prompt_tokens_total", (), (), "Prompt tokens."),
                          7.0, 0.0)
            d.close()
    monkeypatch.setattr(metrics, "time", SimpleNamespace(sleep=size_it))
    families = {f.name: f for f in _SharedCollector().collect()}      # waits instead of raising
    assert waits == [0.002]                          # the empty file was met once, then read sized
    assert [s.value for s in families["kiln_prompt_tokens"].samples] == [7.0]


def test_a_file_that_stays_empty_still_raises_in_the_end(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "counter_4243.db").touch()
    monkeypatch.setattr(_SharedCollector, "TRIES", 3)
    with pytest.raises(Exception, match="unpack_from requires a buffer"):
        _SharedCollector().collect()
