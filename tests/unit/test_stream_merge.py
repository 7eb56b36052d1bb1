"""protocol.merge_ready (deltas that reached a caller together, one per run of a stream's deltas) and
GrowingText (a reply's text, added to a piece at a time)."""

from __future__ import annotations

from kiln.runtime.protocol import GrowingText, StreamDelta, TokenLogprob, merge_ready


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, [(token, -0.5)])


def test_runs_of_one_stream_join_their_text_ids_and_logprobs():
    ready = [StreamDelta(0, "He", [1], None, [lp(1)]), StreamDelta(0, "llo", [2], None, [lp(2)]),
             StreamDelta(0, "!", [3], "stop", [lp(3)])]
    (merged,) = merge_ready(ready)
    assert (merged.index, merged.text, merged.token_ids, merged.finish_reason) == (0, "Hello!", [1, 2, 3], "stop")
    assert [x.token_id for x in merged.logprobs] == [1, 2, 3]


def test_streams_interleaved_keep_their_order_and_a_finished_delta_ends_its_run():
    ready = [StreamDelta(0, "a", [1]), StreamDelta(0, "b", [2]), StreamDelta(1, "x", [7]), StreamDelta(1, "y", [8], "length"),
             StreamDelta(1, "", [], "abort"), StreamDelta(0, "c", [3])]
    merged = merge_ready(ready)
    assert [(d.index, d.text, d.token_ids, d.finish_reason) for d in merged] == [
        (0, "ab", [1, 2], None), (1, "xy", [7, 8], "length"), (1, "", [], "abort"), (0, "c", [3], None)]


def test_a_delta_with_prompt_logprobs_starts_a_run_and_no_logprobs_stay_none():
    scored = StreamDelta(0, "b", [2], prompt_logprobs=[None, lp(5)])
    merged = merge_ready([StreamDelta(0, "a", [1]), scored, StreamDelta(0, "c", [3])])
    assert [(d.text, d.token_ids, d.logprobs) for d in merged] == [("a", [1], None), ("bc", [2, 3], None)]
    assert merged[1].prompt_logprobs == [None, lp(5)]


def test_growing_text_reads_as_its_pieces_joined_however_often_it_is_read():
    text = GrowingText()
    assert str(text) == ""
    for piece in ["Hel", "", "lo", ", ", "wörld"]:
        text.add(piece)
        assert str(text) == str(text)                 # a read joins once and keeps the join
    text.add("!")
    assert str(text) == "Hello, wörld!"
