"""tools/kv_probe.py: a paged KV cache whose pages and page tables are the forward's arguments (the
append written in place into the layer's pages) gives TVM's PagedKVCache's outputs, and both give a
numpy reference's, through prefills of several lengths and decode steps of several sequences
across page boundaries. Built for the CPU with kiln's kernels and with TVM's. With attention sinks
(what TVM's cache cannot apply: gpt-oss, Granite SWA, Flint, MiMo-V2-Flash), the graph's outputs give
the reference's with the sinks in every softmax."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.compiler

PROBE = Path(__file__).parents[2] / "tools" / "kv_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("kv_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules["kv_probe"] = module                  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    yield module
    sys.modules.pop("kv_probe", None)


@pytest.mark.parametrize("kernels", ["kiln", "tvm"])
def test_the_in_graph_cache_gives_tvm_caches_outputs(probe, kernels):
    # 3 sequences (20, 7 and 33 tokens: pages part-filled, one past two pages), then 12 decode steps
    # of all three (7 -> 19 crosses into a second page, 20 -> 32 fills one).
    result = probe.run_both(probe.SHAPES["tiny"], "cpu", [20, 7, 33], decode_steps=12, timed_steps=0,
                            kiln=kernels == "kiln")
    assert result["graph_vs_tvm"]["decode_max_diff"] == 0.0     # the same kernels over the same pages
    assert result["graph_vs_tvm"]["prefill_max_diff"] < 1e-5    # TVM's ragged kernel against the paged one
    assert max(result["vs_numpy"].values()) < 1e-5


def test_page_tables_point_each_token_at_its_sequences_pages(probe):
    tables = probe.PageTables(num_pages=6, page_size=4)
    tables.add(0)
    tables.add(1)
    first = tables.forward([0, 1], [5, 2])
    assert first["q_indptr"].tolist() == [0, 5, 7]
    assert first["page_indptr"].tolist() == [0, 2, 3]
    assert first["page_values"].tolist() == [0, 1, 2]
    assert first["last_len"].tolist() == [1, 2]
    assert first["positions"].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert first["slots"].tolist() == [0, 1, 2, 3, 4, 8, 9]
    step = tables.forward([1, 0], [1, 1])
    assert step["page_values"].tolist() == [2, 0, 1]
    assert step["positions"].tolist() == [2, 5]
    assert step["slots"].tolist() == [10, 5]
    assert step["last_len"].tolist() == [3, 2]
    with pytest.raises(RuntimeError, match="pages are full"):
        tables.forward([0], [20])
    assert np.array_equal(tables.forward([1], [2])["last_len"], [1])    # 5 tokens: a second page, one in it


@pytest.mark.parametrize("kernels", ["kiln", "tvm"])
def test_attention_sinks_in_the_graph_match_the_reference(probe, kernels):
    # the sink logits (+-1.5) move these outputs by up to 2.6 against the same attention without them
    result = probe.run_both(probe.SHAPES["tiny-sinks"], "cpu", [20, 7, 33], decode_steps=12, timed_steps=0,
                            kiln=kernels == "kiln")
    assert "graph_vs_tvm" not in result                        # TVM's cache has no way to apply them
    assert result["vs_numpy"]["graph"] < 1e-5
