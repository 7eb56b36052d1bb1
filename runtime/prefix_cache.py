"""PrefixCache: a radix tree over token ids naming finished sequences whose KV is kept.

RadixAttention style: a finished sequence donates its KV instead of freeing it.
The sequence stays alive in TVM's paged KV cache, frozen (never appended
again), and the tree records which token ids it holds. A new request that
starts with the same tokens forks that sequence at the matched length instead
of recomputing them.

Shape of the tree: edges are labelled with runs of token ids; every cached
sequence ends at a leaf, and every leaf is exactly one cached sequence. That
holds because the cache keeps no redundant entries:
  - inserting tokens that some cached sequence already covers (equal to, or a
    prefix of, its tokens) keeps nothing: the donated sequence is released;
  - inserting tokens that extend a cached sequence releases the shorter one,
    since the new sequence answers every match the old one could.
insert() returns the ids it released; the caller frees their pages and
removes them from the KV cache.

Whole entries only (`whole=True`, models with recurrent layers): a recurrent state holds
a sequence's every token, so a cached sequence can only be continued from its end. A
match is then a cached sequence whose tokens are all a prefix of the query (a multi-turn
chat's next prompt extends the last conversation), and nothing shorter.

Recency: each node stores the latest use of any leaf below it (a logical
clock), so match() can walk to the most recently used sequence covering the
matched prefix, and evict_lru() drops the least recently used sequence.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


class _Node:
    __slots__ = ("key", "children", "parent", "seq_id", "last_used")

    def __init__(self, key: list[int], parent: _Node | None, seq_id: int | None = None, last_used: int = 0):
        self.key = key                            # token ids on the edge from the parent
        self.children: dict[int, _Node] = {}      # first token of the child's key -> child
        self.parent = parent
        self.seq_id = seq_id                      # set on leaves only: the cached sequence ending here
        self.last_used = last_used                # max over the subtree's leaves


class PrefixCache:
    def __init__(self, whole: bool = False) -> None:
        self.whole = whole                        # match whole cached sequences only (see the module's docstring)
        self._root = _Node([], None)
        self._leaves: dict[int, _Node] = {}       # cached seq id -> its leaf
        self._clock = 0
        self.hit_tokens = 0                       # tokens match() found cached
        self.queried_tokens = 0                   # tokens match() was asked about
        self.cached_tokens = 0                    # distinct tokens in the tree (shared prefixes once)

    @property
    def num_cached_seqs(self) -> int:
        return len(self._leaves)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._leaves

    def __len__(self) -> int:
        return len(self._leaves)

    def seq_ids(self) -> list[int]:
        return list(self._leaves)

    # -- lookups ----------------------------------------------------------------------
    def peek(self, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """Like match() but changes nothing: no recency update, no counters."""
        node, matched = self._walk(token_ids)
        if matched == 0:
            return None, 0
        if self.whole:
            return (node.seq_id, matched) if node.seq_id is not None and _depth(node) == matched else (None, 0)
        return self._freshest_leaf(node).seq_id, matched

    def match(self, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """(cached seq id, length) for the longest cached prefix of token_ids; (None, 0) on a miss.

        The id is the most recently used sequence that holds the whole matched prefix:
        fork it at `length` to reuse that KV. The returned sequence becomes the most
        recently used.
        """
        seq_id, matched = self.peek(token_ids)
        self.queried_tokens += len(token_ids)
        self.hit_tokens += matched
        if seq_id is not None:
            self._touch(self._leaves[seq_id])
        return seq_id, matched

    # -- changes ----------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], seq_id: int) -> list[int]:
        """Record that `seq_id` holds KV for exactly `token_ids`; returns the seq ids released.

        [seq_id] when the tokens are already covered by a cached sequence (nothing kept);
        otherwise the ids of cached sequences the new one makes redundant (usually []).
        The caller frees every released id's pages and removes it from the KV cache.
        """
        if seq_id in self._leaves:
            raise ValueError(f"sequence {seq_id} is already in the prefix cache")
        tokens = list(token_ids)
        node, i = self._root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            common = _common_prefix(child.key, tokens, i)
            if common < len(child.key):
                if i + common == len(tokens):
                    return [seq_id]                      # ends inside an edge: covered
                node, i = self._split(child, common), i + common
                break
            node, i = child, i + common
        if i == len(tokens):
            return [seq_id]                              # ends at a node: covered (or empty)
        self.cached_tokens += len(tokens) - i
        if node.seq_id is not None:                      # a cached leaf the new tokens extend
            released = node.seq_id
            del self._leaves[released]
            node.key = node.key + tokens[i:]
            node.seq_id = seq_id
            self._leaves[seq_id] = node
            self._touch(node)
            return [released]
        leaf = _Node(tokens[i:], node, seq_id)
        node.children[tokens[i]] = leaf
        self._leaves[seq_id] = leaf
        self._touch(leaf)
        return []

    def evict_lru(self, exclude: Collection[int] = ()) -> int | None:
        """Drop the least recently used cached sequence (skipping `exclude`); returns its id, or None.

        The caller frees its pages and removes it from the KV cache.
        """
        candidates = [leaf for sid, leaf in self._leaves.items() if sid not in exclude]
        if not candidates:
            return None
        victim = min(candidates, key=lambda leaf: leaf.last_used)
        self.remove(victim.seq_id)
        return victim.seq_id

    def remove(self, seq_id: int) -> None:
        """Drop one cached sequence from the tree; the others still match as before."""
        leaf = self._leaves.pop(seq_id)
        parent = leaf.parent
        del parent.children[leaf.key[0]]
        self.cached_tokens -= len(leaf.key)
        if parent is not self._root and len(parent.children) == 1:
            (only,) = parent.children.values()           # merge: a radix node never has one child
            only.key = parent.key + only.key
            only.parent = parent.parent
            parent.parent.children[only.key[0]] = only
            parent = only.parent
        while parent is not None:                        # recency maxima may have dropped
            parent.last_used = max((c.last_used for c in parent.children.values()), default=0)
            parent = parent.parent

    def clear(self) -> list[int]:
        """Drop everything; returns the ids released."""
        released = list(self._leaves)
        self._root, self._leaves, self.cached_tokens = _Node([], None), {}, 0
        return released

    # -- internals --------------------------------------------------------------------
    def _walk(self, tokens: Sequence[int]) -> tuple[_Node, int]:
        """(node, matched): every leaf under `node` holds tokens[:matched], the longest cached prefix."""
        node, i = self._root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            common = _common_prefix(child.key, tokens, i)
            node, i = child, i + common
            if common < len(child.key):
                break
        return node, i

    def _freshest_leaf(self, node: _Node) -> _Node:
        while node.children:
            node = max(node.children.values(), key=lambda c: c.last_used)
        return node

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut child's edge after `at` tokens; returns the new middle node."""
        parent = child.parent
        mid = _Node(child.key[:at], parent, last_used=child.last_used)
        parent.children[mid.key[0]] = mid
        child.key = child.key[at:]
        child.parent = mid
        mid.children[child.key[0]] = child
        return mid

    def _touch(self, leaf: _Node) -> None:
        self._clock += 1
        node: _Node | None = leaf
        while node is not None:
            node.last_used = self._clock
            node = node.parent


def _depth(node: _Node) -> int:
    """Tokens from the root to the end of node's edge."""
    depth = 0
    while node is not None:
        depth, node = depth + len(node.key), node.parent
    return depth


def _common_prefix(key: list[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of key and tokens[start:]."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == list(tokens[start:start + n]):
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i
