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
match is then the longest cached sequence whose tokens are all a prefix of the query (a
multi-turn chat's next prompt extends the last conversation). Entries may then end inside
the tree too (a checkpoint: a state copied where prompts were seen to part, e.g. after a
shared system prompt), no entry is released for another that extends it (each state
answers different queries), and common() says how far a query agrees with the tree
whether or not an entry ends there (where the scheduler places the next checkpoint).

Salts (vLLM's cache_salt): a sequence with a salt is cached under that salt's own root, so only requests
with the same salt share its prefix (a tenant's prompts cannot be probed by another's timing); unsalted
sequences share the common root. Recency and eviction span every root.

Recency: each entry stores its latest use and each node the latest use of any
entry below it (a logical clock), so match() can walk to the most recently used
sequence covering the matched prefix, and evict_lru() drops the least recently
used sequence.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


class _Node:
    __slots__ = ("key", "children", "parent", "seq_id", "used", "last_used")

    def __init__(self, key: list[int], parent: _Node | None, seq_id: int | None = None, last_used: int = 0):
        self.key = key                            # token ids on the edge from the parent
        self.children: dict[int, _Node] = {}      # first token of the child's key -> child
        self.parent = parent
        self.seq_id = seq_id                      # the cached sequence ending here: every leaf has one (whole:
                                                  # some inner nodes too)
        self.used = 0                             # that entry's latest use
        self.last_used = last_used                # max over the subtree's entries


class PrefixCache:
    def __init__(self, whole: bool = False) -> None:
        self.whole = whole                        # match whole cached sequences only (see the module's docstring)
        self._roots: dict[str | None, _Node] = {None: _Node([], None)}   # per cache salt (None: unsalted)
        self._entries: dict[int, _Node] = {}      # cached seq id -> the node it ends at (a leaf; whole, or inner)
        self._clock = 0
        self.hit_tokens = 0                       # tokens match() found cached
        self.queried_tokens = 0                   # tokens match() was asked about
        self.cached_tokens = 0                    # distinct tokens in the tree (shared prefixes once)

    @property
    def num_cached_seqs(self) -> int:
        return len(self._entries)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def seq_ids(self) -> list[int]:
        return list(self._entries)

    # -- lookups ----------------------------------------------------------------------
    def peek(self, token_ids: Sequence[int], salt: str | None = None) -> tuple[int | None, int]:
        """Like match() but changes nothing: no recency update, no counters."""
        if self.whole:
            return self._deepest_entry(token_ids, salt)
        node, matched = self._walk(token_ids, salt)
        if matched == 0:
            return None, 0
        return self._freshest_leaf(node).seq_id, matched

    def common(self, token_ids: Sequence[int], salt: str | None = None) -> int:
        """How many leading tokens of token_ids some cached sequence holds (whether or not one ends there)."""
        return self._walk(token_ids, salt)[1]

    def match(self, token_ids: Sequence[int], salt: str | None = None) -> tuple[int | None, int]:
        """(cached seq id, length) for the longest cached prefix of token_ids; (None, 0) on a miss.

        The id is the most recently used sequence that holds the whole matched prefix:
        fork it at `length` to reuse that KV. The returned sequence becomes the most
        recently used. Only sequences cached with the same ``salt`` match.
        """
        seq_id, matched = self.peek(token_ids, salt)
        self.queried_tokens += len(token_ids)
        self.hit_tokens += matched
        if seq_id is not None:
            self._touch(self._entries[seq_id])
        return seq_id, matched

    # -- changes ----------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], seq_id: int, salt: str | None = None) -> list[int]:
        """Record that `seq_id` holds KV for exactly `token_ids` (under ``salt``); returns the seq ids released.

        [seq_id] when the tokens are already covered by a cached sequence (nothing kept);
        otherwise the ids of cached sequences the new one makes redundant (usually []).
        Whole: [seq_id] only when a cached sequence ends exactly there; nothing else is released.
        The caller frees every released id's pages and removes it from the KV cache.
        """
        if seq_id in self._entries:
            raise ValueError(f"sequence {seq_id} is already in the prefix cache")
        root = self._roots.get(salt) or self._roots.setdefault(salt, _Node([], None))
        released = self._insert(list(token_ids), seq_id, root)
        if salt is not None and not root.children:       # nothing kept under a new salt: no root for it
            del self._roots[salt]
        return released

    def _insert(self, tokens: list[int], seq_id: int, root: _Node) -> list[int]:
        node, i = root, 0
        for child, start, common in self._descend(tokens, root):
            if common < len(child.key):
                if start + common == len(tokens) and not self.whole:
                    return [seq_id]                      # ends inside an edge: covered
                node, i = self._split(child, common), start + common
                break
            node, i = child, start + common
        if i == len(tokens):                             # ends at a node: covered (or empty) ...
            if not self.whole or node.seq_id is not None or node is root:
                return [seq_id]
            node.seq_id = seq_id                         # ... but for a state: an entry inside the tree
            self._entries[seq_id] = node
            self._touch(node)
            return []
        self.cached_tokens += len(tokens) - i
        if node.seq_id is not None and not self.whole:   # a cached leaf the new tokens extend
            released = node.seq_id
            del self._entries[released]
            node.key = node.key + tokens[i:]
            node.seq_id = seq_id
            self._entries[seq_id] = node
            self._touch(node)
            return [released]
        leaf = _Node(tokens[i:], node, seq_id)
        node.children[tokens[i]] = leaf
        self._entries[seq_id] = leaf
        self._touch(leaf)
        return []

    def evict_lru(self, exclude: Collection[int] = ()) -> int | None:
        """Drop the least recently used cached sequence (skipping `exclude`); returns its id, or None.

        The caller frees its pages and removes it from the KV cache.
        """
        candidates = [leaf for sid, leaf in self._entries.items() if sid not in exclude]
        if not candidates:
            return None
        victim = min(candidates, key=lambda leaf: leaf.used).seq_id
        self.remove(victim)
        return victim

    def remove(self, seq_id: int) -> None:
        """Drop one cached sequence from the tree; the others still match as before."""
        node = self._entries.pop(seq_id)
        node.seq_id, node.used = None, 0
        if not node.children:                            # a leaf: its edge goes
            parent = node.parent
            del parent.children[node.key[0]]
            self.cached_tokens -= len(node.key)
            node = parent
        if node.parent is not None and node.seq_id is None and len(node.children) == 1:
            (only,) = node.children.values()             # merge: a node without an entry never has one child
            only.key = node.key + only.key
            only.parent = node.parent
            node.parent.children[only.key[0]] = only
            node = only.parent
        while node is not None:                          # recency maxima may have dropped
            node.last_used = max([node.used, *(c.last_used for c in node.children.values())])
            if node.parent is None and not node.children:
                for salt in [k for k, root in self._roots.items() if root is node and k is not None]:
                    del self._roots[salt]                # a salt with nothing cached keeps no root
            node = node.parent

    def clear(self) -> list[int]:
        """Drop everything; returns the ids released."""
        released = list(self._entries)
        self._roots, self._entries, self.cached_tokens = {None: _Node([], None)}, {}, 0
        return released

    # -- internals --------------------------------------------------------------------
    def _descend(self, tokens: Sequence[int], root: _Node | None):
        """The walk down a salt's tree (``root``: none yet, nothing to walk) along tokens: (edge's node, tokens
        matched before it, how many of its key match) for each edge entered; it ends after an edge matched in part."""
        node, i = root, 0
        if node is None:
            return
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                return
            common = _common_prefix(child.key, tokens, i)
            yield child, i, common
            if common < len(child.key):
                return
            node, i = child, i + common

    def _walk(self, tokens: Sequence[int], salt: str | None) -> tuple[_Node | None, int]:
        """(node, matched): every leaf under `node` holds tokens[:matched], the longest cached prefix."""
        node, matched = self._roots.get(salt), 0
        for child, start, common in self._descend(tokens, node):
            node, matched = child, start + common
        return node, matched

    def _deepest_entry(self, tokens: Sequence[int], salt: str | None) -> tuple[int | None, int]:
        """(seq id, length) of the longest cached sequence that is a prefix of tokens; (None, 0) if none."""
        best: tuple[int | None, int] = (None, 0)
        for child, start, common in self._descend(tokens, self._roots.get(salt)):
            if common == len(child.key) and child.seq_id is not None:
                best = (child.seq_id, start + common)
        return best

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

    def _touch(self, entry: _Node) -> None:
        self._clock += 1
        entry.used = self._clock
        node: _Node | None = entry
        while node is not None:
            node.last_used = self._clock
            node = node.parent


def _common_prefix(key: list[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of key and tokens[start:]."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == list(tokens[start:start + n]):
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i
