"""KV cache capacity given as memory (`kiln serve --kv-cache-memory`): whole pages that fit, and clear refusals."""

from __future__ import annotations

import click
import pytest

import kiln
from kiln.cli_info import parse_size


def test_sizes_parse_in_decimal_and_binary_units():
    assert parse_size("2GiB", "--x") == 2 * 1024**3
    assert parse_size("512MB", "--x") == 512 * 1000**2
    assert parse_size("1.5g", "--x") == 1_500_000_000
    assert parse_size("4096", "--x") == 4096
    for bad in ("lots", "-1GB", "2 parsecs", "0"):
        with pytest.raises(click.BadParameter, match="not a size"):
            parse_size(bad, "--kv-cache-memory")


def test_kv_cache_memory_becomes_whole_pages(tiny_artifacts):
    art = kiln.Artifact.load(tiny_artifacts["tied"])
    layout = art.config.kv_cache
    per_page = 2 * layout.num_layers * layout.num_kv_heads * layout.head_dim * 4 * layout.page_size
    assert layout.bytes_per_token * layout.page_size == per_page
    engine = kiln.Engine(tiny_artifacts["tied"], kiln.EngineConfig(kv_cache_bytes=40 * per_page + per_page // 2))
    assert engine.runner.max_total_tokens == 40 * layout.page_size
    assert engine.generate([5, 6, 7], kiln.SamplingParams(max_tokens=3, temperature=0)).token_ids


def test_kv_cache_memory_refusals(tiny_artifacts):
    with pytest.raises(ValueError, match="holds no .*page"):
        kiln.Engine(tiny_artifacts["tied"], kiln.EngineConfig(kv_cache_bytes=100))
    with pytest.raises(ValueError, match="give the KV cache size once"):
        kiln.Engine(tiny_artifacts["tied"], kiln.EngineConfig(kv_cache_bytes=10**8, max_total_tokens=512))
