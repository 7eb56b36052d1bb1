"""A draft model for speculative decoding: a smaller model with the served model's tokenizer, run on
the same device, whose greedy tokens after a request's text are that request's draft. The
Speculator checks them in the served model's forward as it checks prompt lookup's, so greedy
requests keep their tokens and sampled ones their distribution (runtime/speculative.py).

Unlike prompt lookup it drafts where text does not repeat, at the cost of the draft model's
forwards: for a step's requests one forward that catches each up with its text (its prompt the
first time, then the one or two tokens the last step kept beyond its draft) and picks the first
draft token, then one decode step for each further token. That pays where a served model's step
costs many of the draft model's: a GPU reading an 8B model's weights for every token, against a
1B draft's.

The draft model keeps its own paged KV cache: each request's tokens, then the draft tokens it
computed. Before drafting again it keeps the draft tokens the request kept, pops the others and
appends what it lacks. Requests it has not drafted for lately give their place up (oldest first)
when another needs it, and are computed again if they draft later. The Engine loads it before the
served model, so that on a GPU the served model's KV cache is sized from what the draft leaves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from .artifact import Artifact
from .kv_pages import PageAccountant
from .model_runner import ModelRunner
from .speculative import SPECULATE_UP_TO

if TYPE_CHECKING:
    from .sequence import Sequence


def pairing_problem(draft: Artifact, served: Artifact) -> str | None:
    """Why `draft` cannot draft for `served`, or None: it must run on the same device, share the
    tokenizer (the same token for every id) and hold its KV cache without a sliding window (a
    rejected draft token must be popped)."""
    if draft.device != served.device:
        return (f"it is compiled for {draft.device} and the served model for {served.device}; compile the draft "
                f"model for the same target")
    if draft.config.kv_cache.sliding_window is not None:
        return "it has a sliding-window KV cache, which cannot give back rejected draft tokens"
    if draft.config.kv_cache.states:
        return "it has recurrent layers, whose state cannot give back rejected draft tokens"
    files = [a.path / "tokenizer.json" for a in (draft, served)]
    if not all(f.is_file() for f in files):
        return "one of the two artifacts has no tokenizer.json to compare; a draft model must share the tokenizer"
    from tokenizers import Tokenizer
    mine, theirs = (Tokenizer.from_file(str(f)).get_vocab(with_added_tokens=True) for f in files)
    if mine != theirs:
        differ = len(set(mine.items()) ^ set(theirs.items()))
        return (f"its tokenizer is not the served model's ({len(mine)} and {len(theirs)} tokens, {differ} entries "
                f"differ); a draft model must share it, e.g. a smaller model of the same family")
    return None


class DraftModel:
    """The draft model's runner and KV cache, and the drafts it proposes for a step."""

    def __init__(self, artifact: Artifact, served: Artifact, max_num_seqs: int, served_tokens: int | None,
                 most: int):
        """Loaded before the served model (so that on a GPU, where the served model's KV cache gets a share
        of the memory the device still has, the draft model's is counted in): `served_tokens` is the
        served model's KV capacity where it is known beforehand (given, or a CPU's default), else None."""
        why = pairing_problem(artifact, served)
        if why is not None:
            raise ValueError(f"{artifact.path} cannot be the draft model: {why}")
        cfg = artifact.config
        seqs = min(cfg.max_batch_size, max_num_seqs)
        # A full context for each of the most requests that draft at once, within the served model's
        # cache, plus each sequence's draft and partly filled page.
        tokens = SPECULATE_UP_TO * min(artifact.context_window, served.context_window)
        tokens = min(tokens, served_tokens or tokens) + seqs * (cfg.kv_cache.page_size + most)
        try:
            self.runner = ModelRunner(artifact, seqs, tokens)
        except RuntimeError as e:        # TVM's errors: on a GPU, most likely out of memory
            last = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
            raise ValueError(f"the draft model {artifact.path} could not be loaded ({last}); free the device or "
                             "choose a smaller draft model") from e
        self.pages = PageAccountant(self.runner.free_pages(), self.runner.page_size)
        self.vocab_size = served.vocab_size          # a draft token at or past it is cut off
        # seq id -> the draft tokens at the end of its cache (computed, not yet known to be kept);
        # in the order the sequences last drafted, oldest first.
        self._drafted: dict[int, list[int]] = {}
        self.calls, self.seconds = 0, 0.0               # propose() calls that drafted, and their time

    def propose(self, seqs: Seq[Sequence], most: Seq[int]) -> list[list[int]]:
        """Each sequence's draft: up to most[i] greedy tokens of the draft model after its tokens ([]
        where most[i] is 0 or its KV cache has no room for them)."""
        start, runner = time.perf_counter(), self.runner
        ids, feeds, wants = [], [], []
        batch = {s.seq_id for s, k in zip(seqs, most) if k > 0}
        for seq, k in zip(seqs, most):
            k = min(k, runner.context_window - seq.num_tokens)
            if k > 0 and len(ids) < runner.max_batch_size:
                feed = self._catch_up(seq, k, batch)
                if feed is not None:
                    ids.append(seq.seq_id)
                    feeds.append(feed)
                    wants.append(k)
        drafts: dict[int, list[int]] = {s: [] for s in ids}
        if ids:
            for s, token in zip(ids, self._first_tokens(ids, feeds)):
                drafts[s].append(int(token))
        for step in range(1, max(wants, default=0)):
            going = [s for s, k in zip(ids, wants) if k > step]
            for s, token in zip(going, runner.next_tokens(going, [[drafts[s][-1]] for s in going])):
                drafts[s].append(int(token))
        out = []
        for seq in seqs:
            draft = drafts.get(seq.seq_id, [])
            if draft:
                self._drafted[seq.seq_id] = draft[:-1]      # fed to the draft model: all but the last
            cut = next((i for i, t in enumerate(draft) if t >= self.vocab_size), len(draft))
            out.append(draft[:cut])
        if ids:
            self.calls += 1
            self.seconds += time.perf_counter() - start
        return out

    def _catch_up(self, seq: Sequence, k: int, batch: set[int]) -> list[int] | None:
        """The tokens the draft model appends for `seq` before drafting k tokens, with the pages for them
        and the k - 1 draft tokens fed after them reserved, once the draft tokens the request did not
        keep are popped. None where no room can be made."""
        sid = seq.seq_id
        if sid in self._drafted:
            drafted = self._drafted.pop(sid)                # reinserted below: the latest to draft
            held = self.pages.num_tokens(sid) - len(drafted)
            kept = seq.token_ids(held, min(held + len(drafted), seq.num_tokens))
            same = next((i for i, (a, b) in enumerate(zip(kept, drafted)) if a != b), min(len(kept), len(drafted)))
            same = min(same, seq.num_tokens - 1 - held)     # its newest token is fed again: its logits draft
            if len(drafted) > same:
                self.runner.pop_tokens(sid, len(drafted) - same)
                self.pages.pop(sid, len(drafted) - same)
            held += same
        else:
            if not self._make_room(seats=1, pages=0, batch=batch):
                return None
            self.runner.add_sequence(sid)
            self.pages.allocate(sid, 0)
            held = 0
        self._drafted[sid] = []
        need = seq.num_tokens - held + k - 1
        have = self.pages.num_tokens(sid)
        pages = self.pages.pages_needed(have + need) - self.pages.pages_needed(have)
        if not self._make_room(seats=0, pages=pages, batch=batch):
            return None
        self.pages.append(sid, need)
        return seq.token_ids(held, seq.num_tokens)

    def _make_room(self, seats: int, pages: int, batch: set[int]) -> bool:
        """At least `seats` free sequence slots and `pages` free pages, made by dropping the sequences that
        drafted longest ago (none of this step's) where needed; False, dropping none, where they cannot."""
        free_seats, free_pages = self.runner.max_num_seqs - len(self._drafted), self.pages.free_pages
        drop = []
        for s in (s for s in self._drafted if s not in batch):
            if free_seats >= seats and free_pages >= pages:
                break
            drop.append(s)
            free_seats += 1
            free_pages += len(self.pages.pages_of(s))
        if free_seats < seats or free_pages < pages:
            return False
        for s in drop:
            del self._drafted[s]
            self.runner.remove_sequence(s)
            self.pages.free(s)
        return True

    def _first_tokens(self, ids: list[int], feeds: list[list[int]]):
        """The draft model's greedy token after each sequence's feed: one forward where the feeds fit one,
        else their heads first (prefill chunks) and their last tokens as one decode step."""
        runner = self.runner
        if sum(map(len, feeds)) <= runner.prefill_chunk:
            return runner.next_tokens(ids, feeds)
        heads = [(s, f[:-1]) for s, f in zip(ids, feeds) if len(f) > 1]
        runner.prefill([s for s, _ in heads], [h for _, h in heads])
        return runner.next_tokens(ids, [f[-1:] for f in feeds])
