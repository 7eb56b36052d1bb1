"""PageAccountant: page counts through allocate/append/fork/free, mirroring TVM's fork semantics."""

from __future__ import annotations

import pytest

from kiln.runtime.kv_pages import PageAccountant

pytestmark = pytest.mark.unit


def test_allocate_append_free_count_pages():
    acc = PageAccountant(total_pages=10, page_size=16)
    assert acc.pages_needed(0) == 0 and acc.pages_needed(1) == 1 and acc.pages_needed(16) == 1
    assert acc.pages_needed(17) == 2
    acc.allocate(1, 20)                                   # 2 pages
    assert (acc.used_pages, acc.free_pages, acc.num_tokens(1)) == (2, 8, 20)
    acc.append(1, 12)                                     # 32 tokens: still 2 pages
    assert acc.used_pages == 2
    acc.append(1, 1)                                      # crosses the boundary
    assert acc.used_pages == 3 and acc.num_tokens(1) == 33
    assert 1 in acc and 2 not in acc
    acc.free(1)
    assert (acc.used_pages, acc.free_pages) == (0, 10) and 1 not in acc
    acc.check()


def test_capacity_checks():
    acc = PageAccountant(total_pages=4, page_size=8)
    assert acc.can_allocate(32) and not acc.can_allocate(33)
    acc.allocate(1, 24)
    assert acc.can_append(1, 8) and not acc.can_append(1, 9)
    with pytest.raises(RuntimeError, match="needs 2 pages, 1 free"):
        acc.allocate(2, 9)
    with pytest.raises(RuntimeError):
        acc.append(1, 9)
    assert acc.num_tokens(1) == 24 and acc.used_pages == 3     # a failed change changes nothing
    assert not acc.try_append(1, 9) and acc.num_tokens(1) == 24 and acc.used_pages == 3
    assert acc.try_append(1, 1) and (acc.num_tokens(1), acc.used_pages) == (25, 4)
    assert acc.try_append(1, 7) and (acc.num_tokens(1), acc.used_pages) == (32, 4)   # within the page: none taken
    with pytest.raises(KeyError, match="sequence 7"):
        acc.try_append(7, 1)
    acc.check()


def test_misuse_raises_clear_errors():
    acc = PageAccountant(total_pages=4, page_size=8)
    acc.allocate(1, 5)
    with pytest.raises(RuntimeError, match="already holds pages"):
        acc.allocate(1, 5)
    with pytest.raises(KeyError, match="sequence 7"):
        acc.free(7)
    with pytest.raises(KeyError):
        acc.append(7, 1)
    with pytest.raises(RuntimeError, match="outside parent"):
        acc.fork(1, 2, 6)
    with pytest.raises(ValueError):
        PageAccountant(0, 16)


def test_fork_shares_full_pages_and_copies_the_partial_one():
    acc = PageAccountant(total_pages=20, page_size=16)
    acc.allocate(1, 40)                                   # pages A B C (C partly filled)
    parent = acc.pages_of(1)
    acc.fork(1, 2, 20)                                    # A shared; B's first 4 tokens copied
    child = acc.pages_of(2)
    assert child[0] == parent[0] and child[1] not in parent
    assert acc.used_pages == 4 and acc.num_tokens(2) == 20
    acc.fork(1, 3, 32)                                    # page aligned: A and B shared, nothing copied
    assert acc.pages_of(3) == parent[:2] and acc.used_pages == 4
    acc.append(3, 1)                                      # the child's next token takes its own page
    assert acc.used_pages == 5 and acc.pages_of(3)[2] not in parent
    acc.check()


def test_fork_then_free_parent_then_children_returns_every_page():
    acc = PageAccountant(total_pages=20, page_size=16)
    acc.allocate(1, 40)
    acc.fork(1, 2, 40)                                    # A B shared, C copied
    acc.fork(2, 3, 16)                                    # A shared again
    assert acc.used_pages == 4                            # shared pages count once
    acc.free(1)
    assert acc.used_pages == 3                            # A, B (held by 2), 2's copy
    acc.free(2)
    assert acc.used_pages == 1                            # A (held by 3)
    acc.free(3)
    assert acc.used_pages == 0 and acc.free_pages == 20
    acc.check()


def test_can_fork_counts_only_the_unshared_pages():
    acc = PageAccountant(total_pages=6, page_size=16)
    acc.allocate(1, 64)                                   # 4 pages, 2 free
    assert acc.can_fork(1, 64, 96)                        # shares 4, needs 2 more
    assert not acc.can_fork(1, 64, 97)
    assert acc.can_fork(1, 50, 80)                        # shares 3; 5 - 3 = 2
    assert not acc.can_fork(1, 40, 80)                    # shares 2; 5 - 2 = 3
    acc.fork(1, 2, 50)
    acc.append(2, 30)
    assert acc.free_pages == 0
    acc.check()


def test_pop_gives_back_the_pages_the_last_tokens_alone_filled():
    acc = PageAccountant(total_pages=10, page_size=16)
    acc.allocate(1, 20)
    acc.append(1, 13)                                     # 33 tokens, 3 pages
    acc.pop(1, 2)                                         # 31: the third page is free again
    assert (acc.num_tokens(1), acc.used_pages) == (31, 2)
    acc.pop(1, 0)
    acc.pop(1, 14)                                        # 17 tokens: still 2 pages
    assert (acc.num_tokens(1), acc.used_pages) == (17, 2)
    acc.check()
    acc.allocate(2, 32)                                   # two full pages, shared by a child at 32
    acc.fork(2, 3, 32)
    acc.append(3, 5)                                      # its own third page
    acc.pop(3, 5)
    assert acc.used_pages == 4 and acc.num_tokens(3) == 32
    with pytest.raises(RuntimeError, match="shared"):
        acc.pop(3, 16)                                    # would leave a page its parent holds too
    with pytest.raises(RuntimeError, match="cannot pop 40"):
        acc.pop(3, 40)
    acc.check()
    for seq in (1, 2, 3):
        acc.free(seq)
    assert acc.free_pages == 10
    acc.check()


def test_rename_moves_pages_and_tokens():
    acc = PageAccountant(total_pages=8, page_size=4)
    acc.allocate(1, 6)
    pages = acc.pages_of(1)
    acc.rename(1, 2)
    assert 1 not in acc and acc.pages_of(2) == pages and acc.num_tokens(2) == 6 and acc.free_pages == 6
    acc.allocate(3, 1)
    with pytest.raises(RuntimeError, match="already holds pages"):
        acc.rename(2, 3)
    with pytest.raises(KeyError, match="holds no pages"):
        acc.rename(1, 4)
    acc.check()
