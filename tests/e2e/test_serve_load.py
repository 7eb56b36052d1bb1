"""tools/serve_load.py against `kiln serve` on the tiny model: every stream's tokens come back and
are counted, and the figures it reports are there (the GPU session's "served" row relies on it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from serve_load import serve_and_load  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_serve_load_counts_every_token_of_every_stream(tiny_artifacts, overlap):
    result = serve_and_load(str(tiny_artifacts["tied"]), [1, 3], prompt_len=8, gen_len=12, start_timeout=120,
                            extra=("--overlap", overlap))
    assert [r["concurrency"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["tokens"] == row["concurrency"] * 12          # ignore_eos: each stream runs to max_tokens
        assert row["overall_tok_s"] > 0 and 0 < row["chunks_per_token"] <= 1
        if sys.platform == "linux":
            assert row["loop_us_per_token"] >= 0 and row["other_us_per_token"] >= 0   # /proc: 10 ms ticks
        # the engine's counters from /metrics: a prefill and 11 decodes at least (more where admissions split)
        assert row["forwards"] >= 12 and row["host_gap_us_per_forward"] >= 0
        assert (row["lookahead_share"] > 0) == (overlap == "on")
    assert result["event_loop"] in {"uvloop+httptools", "uvloop+h11", "asyncio+httptools", "asyncio+h11"}
