"""`kiln check`'s metrics against hand computations, and its tolerance table against the schemes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln.compiler import SCHEMES
from kiln.runtime.check import (TOLERANCES, CheckReport, PromptResult, max_logit_error, tolerance_for, top1_agreement,
                                topk_kl)

pytestmark = pytest.mark.unit

# two positions, vocab 5, top-2 golden
TOP_IDS = np.array([[3, 1], [0, 4]])
TOP_VALUES = np.array([[2.0, 1.0], [0.5, 0.0]], np.float32)
LOGITS = np.array([[0.0, 1.5, 0.0, 2.0, 0.0],        # top-1 agrees; id 1 off by 0.5
                   [0.4, 0.0, 0.0, 0.0, 0.9]],       # argmax 4, golden says 0
                  np.float32)


def test_max_logit_error_is_over_the_golden_ids_only():
    assert max_logit_error(TOP_IDS, TOP_VALUES, LOGITS) == pytest.approx(0.9)     # position 1, id 4: 0.9 vs 0.0


def test_top1_agreement_is_the_fraction_of_positions():
    assert top1_agreement(TOP_IDS, LOGITS) == 0.5


def test_topk_kl_by_hand():
    def kl(p_logits, q_logits):
        p = [math.exp(x) / sum(math.exp(y) for y in p_logits) for x in p_logits]
        q = [math.exp(x) / sum(math.exp(y) for y in q_logits) for x in q_logits]
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    expected = (kl([2.0, 1.0], [2.0, 1.5]) + kl([0.5, 0.0], [0.4, 0.9])) / 2
    assert topk_kl(TOP_IDS, TOP_VALUES, LOGITS) == pytest.approx(expected, rel=1e-6)   # float32 inputs


def test_identical_logits_score_zero():
    vals = np.take_along_axis(LOGITS, TOP_IDS, -1)
    assert max_logit_error(TOP_IDS, vals, LOGITS) == 0.0
    assert topk_kl(TOP_IDS, vals, LOGITS) == pytest.approx(0.0, abs=1e-15)


def test_kl_ignores_a_common_shift():
    """Renormalised over the top-k: logits shifted by a constant have the same distribution."""
    assert topk_kl(TOP_IDS, TOP_VALUES, LOGITS + 7.0) == pytest.approx(topk_kl(TOP_IDS, TOP_VALUES, LOGITS))


def test_every_scheme_has_a_tolerance_and_they_loosen_with_fewer_bits():
    assert set(SCHEMES) <= set(TOLERANCES)
    f32, f16, q4 = tolerance_for("q0f32"), tolerance_for("q0f16"), tolerance_for("q4f32")
    assert f32.max_logit_error <= 1e-3
    assert f32.max_logit_error < f16.max_logit_error < q4.max_logit_error and f32.kl < f16.kl < q4.kl


def test_report_fails_with_one_line_beyond_the_tolerance():
    tol = tolerance_for("q0f32")
    good = PromptResult(8, 1e-5, 1.0, 1e-12)
    bad = PromptResult(12, 0.3, 0.75, 1e-3)
    report = CheckReport("a", "q0f32", "ref", "cpu", tol, (good, bad))
    assert not report.ok and len(report.failures) == 3
    assert "\n" not in report.reason() and "prompt 1: max logit error 0.3" in report.reason()
    assert CheckReport("a", "q0f32", "ref", "cpu", tol, (good,)).ok
    assert report.table().splitlines()[-1].endswith("FAILED")
