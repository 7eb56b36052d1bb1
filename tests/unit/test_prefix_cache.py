"""PrefixCache: radix-tree insert/match/evict, LRU order, hit counters, dedup; checked against brute force."""

from __future__ import annotations

import random

import pytest

from kiln.runtime.prefix_cache import PrefixCache

pytestmark = pytest.mark.unit


def brute_force_match(entries: dict[int, list[int]], query: list[int]) -> int:
    """Longest common prefix of the query with any cached token list."""
    best = 0
    for tokens in entries.values():
        n = 0
        while n < min(len(tokens), len(query)) and tokens[n] == query[n]:
            n += 1
        best = max(best, n)
    return best


def test_match_returns_longest_prefix_and_a_seq_that_holds_it():
    cache = PrefixCache()
    assert cache.match([1, 2, 3]) == (None, 0)
    assert cache.insert([1, 2, 3, 4, 5], seq_id=10) == []
    assert cache.insert([1, 2, 3, 9], seq_id=11) == []
    assert cache.insert([7, 8], seq_id=12) == []
    assert cache.match([1, 2, 3, 4, 5, 6]) == (10, 5)
    assert cache.match([1, 2, 3, 9, 9]) == (11, 4)
    assert cache.match([1, 2, 3, 4, 0]) == (10, 4)       # ends inside an edge
    sid, n = cache.match([1, 2, 0])                      # both hold [1, 2]
    assert sid in (10, 11) and n == 2
    assert cache.match([7]) == (12, 1)
    assert cache.match([5, 1]) == (None, 0)
    assert cache.num_cached_seqs == 3
    assert cache.cached_tokens == 5 + 1 + 2              # shared prefix [1, 2, 3] counted once


def test_counters_and_peek():
    cache = PrefixCache()
    cache.insert([1, 2, 3, 4], seq_id=1)
    assert cache.peek([1, 2, 3, 0]) == (1, 3)
    assert (cache.hit_tokens, cache.queried_tokens) == (0, 0)      # peek records nothing
    cache.match([1, 2, 3, 0])
    cache.match([9, 9])
    assert (cache.hit_tokens, cache.queried_tokens) == (3, 6)
    assert cache.hit_rate == 0.5


def test_dedup_covered_tokens_are_not_kept():
    cache = PrefixCache()
    cache.insert([1, 2, 3, 4], seq_id=1)
    assert cache.insert([1, 2, 3, 4], seq_id=2) == [2]   # identical
    assert cache.insert([1, 2], seq_id=3) == [3]         # a prefix of a cached seq
    assert cache.insert([], seq_id=4) == [4]
    assert cache.seq_ids() == [1] and cache.cached_tokens == 4
    with pytest.raises(ValueError, match="already in the prefix cache"):
        cache.insert([5], seq_id=1)


def test_extending_a_cached_seq_releases_the_shorter_one():
    cache = PrefixCache()
    cache.insert([1, 2, 3], seq_id=1)                    # turn 1 of a chat
    cache.insert([1, 2, 9], seq_id=2)
    assert cache.insert([1, 2, 3, 4, 5], seq_id=3) == [1]  # turn 2 extends turn 1
    assert 1 not in cache and cache.num_cached_seqs == 2
    assert cache.match([1, 2, 3, 0]) == (3, 3)
    assert cache.cached_tokens == 2 + 3 + 1


def test_lru_eviction_order_and_touch():
    cache = PrefixCache()
    for sid, tokens in enumerate([[1, 1], [2, 2], [3, 3]]):
        cache.insert(tokens, sid)
    cache.match([1, 1])                                  # 0 becomes the most recently used
    assert cache.evict_lru(exclude={1}) == 2
    assert cache.evict_lru() == 1
    assert cache.evict_lru() == 0
    assert cache.evict_lru() is None
    assert cache.num_cached_seqs == 0 and cache.cached_tokens == 0


def test_match_prefers_the_most_recently_used_holder():
    cache = PrefixCache()
    cache.insert([1, 2, 3, 4], seq_id=1)
    cache.insert([1, 2, 5, 6], seq_id=2)
    assert cache.match([1, 2, 7]) == (2, 2)              # 2 was inserted last
    cache.match([1, 2, 3])                               # touches 1
    assert cache.match([1, 2, 7]) == (1, 2)


def test_eviction_keeps_matches_right_for_the_others():
    cache = PrefixCache()
    cache.insert([1, 2, 3, 4], seq_id=1)
    cache.insert([1, 2, 3, 5], seq_id=2)
    cache.insert([1, 2, 6], seq_id=3)
    cache.remove(2)                                      # merges [3] with [4]
    assert cache.match([1, 2, 3, 5]) == (1, 3)
    assert cache.match([1, 2, 6, 6]) == (3, 3)
    cache.remove(1)
    assert cache.match([1, 2, 3]) == (3, 2)
    assert cache.cached_tokens == 3
    assert cache.clear() == [3] and cache.num_cached_seqs == 0


def test_randomized_against_brute_force():
    rng = random.Random(0)
    cache, entries = PrefixCache(), {}
    for sid in range(400):
        op = rng.random()
        if op < 0.5:
            base = rng.choice(list(entries.values())) if entries and rng.random() < 0.7 else []
            tokens = base[:rng.randint(0, len(base))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 6))]
            covered = brute_force_match(entries, tokens) == len(tokens)
            extended = [s for s, t in entries.items() if tokens[:len(t)] == t]
            assert cache.insert(tokens, sid) == ([sid] if covered else extended)
            if not covered:
                for s in extended:
                    del entries[s]
                entries[sid] = tokens
        elif op < 0.65 and entries:
            victim = cache.evict_lru()
            del entries[victim]
        else:
            query = [rng.randint(0, 3) for _ in range(rng.randint(0, 8))]
            got_sid, got_len = cache.match(query)
            assert got_len == brute_force_match(entries, query)
            if got_len:
                assert entries[got_sid][:got_len] == query[:got_len]
        assert set(cache.seq_ids()) == set(entries)
        assert cache.cached_tokens == len({tuple(t[:i]) for t in entries.values() for i in range(1, len(t) + 1)})
        assert all(not (a != b and tb[:len(ta)] == ta) for a, ta in entries.items() for b, tb in entries.items())


def test_whole_mode_matches_only_entries_the_query_contains():
    cache = PrefixCache(whole=True)                      # recurrent layers: a state is its sequence's end
    assert cache.insert([1, 2, 3, 4], seq_id=1) == [] and cache.insert([1, 2, 9], seq_id=2) == []
    assert cache.match([1, 2, 3, 4, 5, 6]) == (1, 4)     # entry 1 is a prefix of the query
    assert cache.match([1, 2, 9]) == (2, 3)
    assert cache.match([1, 2, 3]) == (None, 0)           # ends inside entry 1: its state is past it
    assert cache.match([1, 2]) == (None, 0)              # ends at a branch: no state there
    assert cache.common([1, 2, 3, 7]) == 3 and cache.common([5]) == 0
    assert cache.peek([1, 2, 9, 9]) == (2, 3) and (cache.hit_tokens, cache.queried_tokens) == (7, 14)
    assert cache.insert([1, 2, 9, 9, 7], seq_id=3) == []     # extends entry 2: both kept (different states)
    assert cache.match([1, 2, 9, 9]) == (2, 3) and cache.match([1, 2, 9, 9, 7, 0]) == (3, 5)
    assert cache.insert([1, 2], seq_id=4) == [] and cache.insert([1, 2, 3], seq_id=5) == []   # checkpoints inside
    assert cache.insert([1, 2, 3], seq_id=6) == [6] and cache.insert([], seq_id=7) == [7]     # one there already
    assert cache.match([1, 2, 5]) == (4, 2) and cache.match([1, 2, 3, 8]) == (5, 3)
    assert cache.cached_tokens == 4 + 1 + 2
    cache.remove(5)                                      # an inner entry: the edge stays, merged
    assert cache.match([1, 2, 3, 8]) == (4, 2) and cache.match([1, 2, 3, 4]) == (1, 4)
    cache.remove(1)
    cache.remove(4)
    assert cache.match([1, 2, 9, 9, 7]) == (3, 5) and cache.cached_tokens == 5 and cache.seq_ids() == [2, 3]


def test_whole_mode_randomized_against_brute_force():
    rng = random.Random(1)
    cache, entries = PrefixCache(whole=True), {}
    for sid in range(600):
        op = rng.random()
        if op < 0.45:
            base = rng.choice(list(entries.values())) if entries and rng.random() < 0.7 else []
            tokens = base[:rng.randint(0, len(base))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 4))]
            dup = not tokens or tokens in entries.values()
            assert cache.insert(tokens, sid) == ([sid] if dup else [])
            if not dup:
                entries[sid] = tokens
        elif op < 0.6 and entries:
            victim = cache.evict_lru() if rng.random() < 0.5 else rng.choice(list(entries))
            if victim in cache:
                cache.remove(victim)
            del entries[victim]
        else:
            query = [rng.randint(0, 3) for _ in range(rng.randint(0, 8))]
            held = [(len(t), s) for s, t in entries.items() if t and query[:len(t)] == t]
            got = cache.match(query)
            assert got == ((max(held)[1], max(held)[0]) if held else (None, 0))
            assert cache.common(query) == brute_force_match(entries, query)
        assert set(cache.seq_ids()) == set(entries)
        assert cache.cached_tokens == len({tuple(t[:i]) for t in entries.values() for i in range(1, len(t) + 1)})


def test_a_salt_shares_its_prefixes_only_with_the_same_salt():
    """vLLM's cache_salt: each salt's sequences match only its own requests, unsalted ones the unsalted; eviction
    is least recently used over every salt, and a salt with nothing cached keeps no tree."""
    cache = PrefixCache()
    assert cache.insert([1, 2, 3], seq_id=1, salt="a") == []
    assert cache.match([1, 2, 3, 4]) == (None, 0) and cache.match([1, 2, 3, 4], "b") == (None, 0)
    assert cache.match([1, 2, 3, 4], "a") == (1, 3) and cache.common([1, 2, 9], "a") == 2
    assert cache.insert([1, 2], seq_id=2, salt="a") == [2]                 # covered within its salt ...
    assert cache.insert([1, 2], seq_id=3) == [] and cache.match([1, 2, 3]) == (3, 2)   # ... not across salts
    assert cache.insert([1, 2, 3, 4], seq_id=4, salt="b") == [] and cache.cached_tokens == 3 + 2 + 4
    assert cache.evict_lru() == 1 and cache.match([1, 2, 3], "a") == (None, 0)         # "a" used longest ago
    assert set(cache._roots) == {None, "b"}                                 # "a" emptied: its tree is gone
    assert cache.insert([5], seq_id=5, salt="c") == [] and cache.peek([5], "c") == (5, 1)
    assert sorted(cache.clear()) == [3, 4, 5] and set(cache._roots) == {None}


def test_salted_whole_mode_keeps_states_apart():
    cache = PrefixCache(whole=True)
    assert cache.insert([1, 2, 3], seq_id=1, salt="a") == [] and cache.insert([1, 2, 3], seq_id=2) == []
    assert cache.match([1, 2, 3, 4], "a") == (1, 3) and cache.match([1, 2, 3, 4]) == (2, 3)
    cache.remove(2)
    assert cache.match([1, 2, 3, 4]) == (None, 0) and cache.match([1, 2, 3, 4], "a") == (1, 3)
