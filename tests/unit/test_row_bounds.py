"""The runner's split of a forward into calls within the artifact's planned logit rows, and its refusal of
more sequences than the artifact was compiled for."""

from __future__ import annotations

import pytest

from kiln.runtime.forward_split import row_bounded
from kiln.runtime.model_runner import ModelRunner


def _calls(items, bound):
    return [[(i, list(t), f) for i, t, f in part] for part in row_bounded(items, bound)]


def test_single_row_items_share_one_call_and_full_items_fill_the_rest():
    items = [(0, [1, 2, 3], True), (1, [4, 5], False), (2, [6], False)]
    assert _calls(items, 4) == [[(1, [4, 5], False), (2, [6], False), (0, [1, 2], True)], [(0, [3], True)]]


def test_every_call_within_the_bound_each_sequence_once_in_order():
    items = [(0, list(range(10)), True), (1, [7], False), (2, list(range(20, 27)), True)]
    calls = _calls(items, 4)
    for part in calls:
        assert sum(len(t) if f else 1 for _, t, f in part) <= 4
        assert len({i for i, _, _ in part}) == len(part)
    for i, toks, _ in items:
        assert [x for part in calls for j, t, _ in part if j == i for x in t] == toks


def test_more_sequences_than_compiled_for_is_refused(tiny_artifacts):
    from kiln.runtime.artifact import Artifact
    art = Artifact.load(tiny_artifacts["tied"])
    with pytest.raises(ValueError, match=r"1 to 32 sequences.*--max-batch-size"):
        ModelRunner(art, max_num_seqs=art.config.max_batch_size + 1)

