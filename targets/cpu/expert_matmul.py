"""Mixture-of-experts matmuls on a CPU: the tokens grouped by expert (prefill), the GEMV (decode).

models/moe.py's gathered expert matmul computes, for each token t and each of its k expert slots j,

    out[t, j, c] = sum_r x[t(, j), r] * W[experts[t, j] * rows + c, r]

RowReduction schedules it as it stands: one parallel loop over the outputs, each a dot product that
decodes its weight row, every slot on its own. A prompt of T tokens so decodes T * k rows of weights
where its experts hold E (a 64-token prefill of 64 experts, top 8: each expert's weights 8 times), and
the decode (~14 vector instructions a 16 values) was the cost: the gathered matmuls were 94% of that
prefill and streamed 5.6-6.8 GB/s in decode (tools/synthetic_moe.py, stop 58). GroupedExpertMatmul
takes the function (over a symbolic token count) and branches on the call's slots:

* More slots than experts: grouped (llama.cpp's and vLLM's order). The slots are counted and sorted by
  expert (a serial count sort over T * k slots, the experts chosen listed), then one parallel loop over
  (chosen expert, tile of TILE_ROWS weight rows): the tile is decoded once into a float32 buffer (WORD
  values a vector: every plane of every format is then read contiguously or once, where 16 lanes of
  r // 8 became LLVM gathers; WORDS words a step, the group's scale read once), and the expert's slots
  stream past it SLOTS at a time, each weight vector serving SLOTS slots and each activation vector
  TILE_ROWS rows, the sums in SLOTS x TILE_ROWS vector accumulators. The decode is the function's own
  expression (the matched block's, with the row and column substituted: any format kiln stores), and so
  is each fused epilogue after the sums (the router weight's multiply, a cast). kiln's 4-bit codes
  (q4, q4m: GGUF's Q4_0 / Q4_1 as stored, and q4f32) take a decode of their own: a chunk's 16 code bytes
  widened to 16 lanes, low nibbles its even values and high ones its odd (quant_gemv's split), the tile
  stored in that order and x read through a copy in it (xp, made once a call): 15 vector instructions a
  32 values where the generic decode spends 28, the values exactly the dequantize's.
* Up to a slot an expert (decode, a few sequences: a token's experts are distinct, nothing to share):
  quant_gemv's one-row GEMV, whose arithmetic applies the scale per group, not per weight (one parallel
  loop over every token's, or every slot's where each reads its own input: the down projection, outputs),
  where the weight is a format it takes; else RowReduction's schedule (not on 8-lane targets: see
  schedule()).

Measured (2 Intel Xeon cores (Sapphire Rapids), AVX-512, 2 threads; random Q4_0 experts with float16
scales, kernels alone, ms a call; in brackets the generic decode's). 64 experts of 1536 x 2048 (gate/up),
top 8: 64 tokens 20 (22), 512 tokens 99-100 (100); 128 experts, 64 tokens 30 (34; RowReduction's schedule
of the gathered matmul 177), 1 token (the GEMV) 1.7 (RowReduction 2.1-2.4). Then the codes prefetched
4 KB ahead (prefetch.PREFETCH_BYTES; each tile of 4 rows of 1 KB is a page of its own, where the
CPU's prefetcher starts over): 128 experts, 16 tokens 20.5 -> 13.7, 64 tokens 30.6 -> 28.4; the GEMV at
1 token 1.7 -> 0.66 (20 GB/s of planes), the down projection's (2048 x 768) 0.95 -> 0.76. At 512
tokens the slot passes run at ~87% of the cores' float32 multiply-add peak (73 of 83 GMAC/s a core at
2.6 GHz, measured with every expert chosen: 72-73 from 8 to 128 slots an expert): exact float32
arithmetic is the bound there, and what llama.cpp has beyond it is int8 (activations quantized to Q8).
At 64 tokens of 128 experts (~4 slots an expert) the decode is two thirds of the call (~20 of 30 ms:
every expert's weights, 200 MB, decoded at ~0.2 cycles a value). Tried and not kept: the tile's decode
in chunks of 256-512 columns with partial sums carried (the tile and x in L1; 5-10% slower: the passes
were not waiting on memory), decoding into registers for up to 6 slots an expert instead of the tile
(30 -> 37 ms: each value still scaled and offset, now once a pass; 30 -> 34 with quant_gemv's
arithmetic, the scale per chunk and the zero codes through x's group sums: these calls wait on the
weights' stream, not on instructions), wider or narrower register blocks (4 x 2 to 6 x 4 within 5%).
The float16 scales are widened a tile row at a time (grouped_body): read in the decode, each
conversion went through LLVM's vpinsrw into the register the step before had written, chaining the
steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
import tvm.ir.expr as X
import tvm.ir.prim.expr as P
from tvm import s_tir, tirx
from tvm_ffi import structural_equal
from tvm.s_tir.stmt import SBlock, SBlockRealize
from tvm.script import tirx as T

from ..dequant_match import weight_format
from ..row_dispatch import own_vars, static_int
from . import quant_gemv
from .prefetch import prefetch_read, rows_ahead
from .quant_gemv import nibble_code, nibble_col
from .schedule import KilnCPURule

logger = logging.getLogger(__name__)
_REDUCE, _SPATIAL = tirx.IterVar.CommReduce, tirx.IterVar.DataPar
SLOTS = 3           # slots a pass over a decoded tile serves (their accumulators side by side)
WORD = 8            # values a vector of the tile's decode takes: one 32-bit word of 4-bit codes, so that every
                    # plane of every format is read contiguously or once (16 lanes' (r // 8) LLVM gathers)
WORDS = 4           # words a step of the decode (32 values: a group's scale read once)
NIBBLE_CHUNK = 32   # 4-bit codes: values whose 16 code bytes one vector widens (the tile's and xp's order within)
TILE_ROWS = 4       # weight rows a tile holds: SLOTS x TILE_ROWS accumulators of a vector (<= 1 KB, on the stack)


class GroupedExpertMatmul(KilnCPURule):
    """models/moe.py's expert matmul (block "expert_matmul", with any spatial epilogue over its output)
    over a symbolic token count: more slots than experts take the grouped kernel, fewer the GEMV or
    `few`'s schedule of the same function (module docstring)."""

    def __init__(self, knobs=None, few=None) -> None:
        super().__init__(knobs)
        self.few = few                          # RowReduction: a slot an expert where the GEMV cannot

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        func = sch.mod["main"]
        m = match_expert_matmul(func)
        if m is None or static_int(m.tokens) is not None or m.depth % (WORD * WORDS):
            return None
        try:
            body, gemv = grouped_body(m, self.knobs.vector_lanes), gemv_body(m)
        except Exception as err:            # noqa: BLE001 (a kernel the parser refuses: RowReduction's then)
            logger.warning("GroupedExpertMatmul could not write its kernel: %s", str(err)[:400])
            return None
        # Up to a slot an expert (decode: a token's experts are distinct, nothing to share), the GEMV
        # where it takes the format, else RowReduction's schedule of the function, but only where its
        # vectors differ in width from the grouped kernel's: TVM's common subexpression elimination
        # lifts a vector constant both bodies hold (a decode's lane shifts) above the branch into a
        # variable LLVM cannot see through, and RowReduction's loads became gathers, 4x slower.
        few = _block(gemv, "few_slots") if gemv is not None else None
        if few is None and self.few is not None and self.knobs.vector_lanes != WORD:
            scheduled = self.few.schedule(s_tir.Schedule(func))
            if scheduled is not None:
                root = scheduled.mod["main"].body.block
                few = _block(root.body, "few_slots", root.alloc_buffers)
        body = _block(body, "grouped")
        if few is not None:
            body = tirx.IfThenElse(m.tokens * m.k <= m.experts, few, body)
        return s_tir.Schedule(own_vars(func.with_body(_block(body, "root"))))


def _block(body, name: str, alloc_buffers=()) -> SBlockRealize:
    return SBlockRealize([], True, SBlock([], [], [], name, body, alloc_buffers=list(alloc_buffers)))


def gemv_body(m: "ExpertMatmul") -> tirx.Stmt | None:
    """Decode: each token's experts' rows by quant_gemv's one-row GEMV (the scale applied per group, not
    per weight; one parallel loop over every token's, or every slot's where each reads its own input) where the
    weight is one of kiln's formats it takes (float32 x and sums, K a multiple of 64, groups it takes:
    quant_gemv.takes_group); else None."""
    if m.format is None or m.depth % (2 * quant_gemv.CHUNK):      # (m.format: x_rows too)
        return None
    kind, group, planes = m.format
    scale_dtypes = {p.dtype for p in planes[1:] if p is not None}
    if not quant_gemv.takes_group(kind, group) or not scale_dtypes <= set(quant_gemv.SCALE_DTYPES) \
            or len(scale_dtypes) > 1:
        return None
    k, rows, index, out = m.k, m.rows, m.index, m.out
    if m.per_slot:                  # each expert its own input (the down projection): a part a slot
        parts, count = m.tokens * k, rows
        row_of = lambda p, c: index[p // k, p % k] * rows + c                                   # noqa: E731
    else:                           # one input a token: a part a token, of its experts' rows
        parts, count = m.tokens, k * rows
        row_of = lambda t, o: index[t, o // rows] * rows + o % rows                             # noqa: E731

    @T.macro
    def store_slot(_x, p, c, value):
        out[p // k, p % k, c] = m.finish(p // k, p % k, T.Cast("int64", c), value)

    @T.macro
    def store_token(_x, t, o, value):
        out[t, o // rows, o % rows] = m.finish(t, T.Cast("int64", o // rows), T.Cast("int64", o % rows), value)

    return quant_gemv.expert_gemv_body(kind, m.experts * rows, m.depth, group or quant_gemv.CHUNK,
                                       scale_dtypes.pop() if scale_dtypes else "float32", planes, m.x_rows,
                                       parts, count, row_of, store_slot if m.per_slot else store_token)


@dataclass(frozen=True)
class ExpertMatmul:
    """A matched expert matmul: its sizes, and its arithmetic as functions of new indices."""

    tokens: tirx.PrimExpr       # T (x's first dim)
    k: int                      # slots a token
    experts: int                # E
    rows: int                   # each expert's weight rows (the output's last dim)
    depth: int                  # the reduction's length (x's last dim)
    index: tirx.Buffer          # the router's choices [T, k] (int32)
    x: object                   # (t, j, r) -> x[t(, j), r] as the sums' dtype
    out: tirx.Buffer            # the function's output [T, k, rows]
    finish: object              # (t, j, c, total) -> the value out[t, j, c] takes from the sum
    w_expr: tirx.PrimExpr       # W[row, col] over the two vars below (row: expert row // rows's row % rows)
    row: tirx.Var
    col: tirx.Var
    planes: list                # the buffers the weight's expression reads, in its order
    x_rows: tirx.Buffer | None  # x where the x term is x[t, r] (or x[t, j, r]: per_slot) of a float32
    per_slot: bool              # buffer and the sums are float32, else None
    format: tuple | None        # (kind, group, planes): the weight in one of kiln's formats
                                # (dequant_match.weight_format), where x_rows is; else None


def match_expert_matmul(func: tirx.PrimFunc) -> ExpertMatmul | None:
    """The function's expert matmul if it is models/moe.py's (a reduction block named expert_matmul over
    t, j, c, r, zero-initialised, adding x-term * weight-term, the weight term reading the router's
    choices only in its row, index[t, j] * rows + c) followed by spatial blocks each reading the one
    before at its own point; else None."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if not blocks or not blocks[0].name_hint.startswith("expert_matmul"):
        return None
    main, epilogue = blocks[0], blocks[1:]
    if [iv.iter_type for iv in main.iter_vars] != [_SPATIAL] * 3 + [_REDUCE] or len(main.writes) != 1:
        return None
    v_t, v_j, v_c, v_r = (iv.var for iv in main.iter_vars)
    sums = main.writes[0].source
    store, init = main.body, main.init
    if not (isinstance(store, tirx.BufferStore) and isinstance(init, tirx.BufferStore)
            and isinstance(init.value, P.FloatImm) and init.value.value == 0.0 and _at(store, sums, v_t, v_j, v_c)):
        return None
    value = store.value
    if not (isinstance(value, P.Add) and _is_load(value.a, sums, v_t, v_j, v_c) and isinstance(value.b, P.Mul)):
        return None
    k, rows = static_int(main.iter_vars[1].dom.extent), static_int(main.iter_vars[2].dom.extent)
    depth = static_int(main.iter_vars[3].dom.extent)
    if None in (k, rows, depth):
        return None
    index = next((r.source for r in main.reads if r.source.dtype == "int32" and len(r.source.shape) == 2), None)
    if index is None:
        return None
    terms = (value.b.a, value.b.b)
    reads_index = [_reads(term, index) for term in terms]
    if sorted(reads_index) != [False, True]:
        return None
    x_term, w_term = terms if reads_index[1] else terms[::-1]
    n = tirx.Var("n", "int64")                     # the weight row: index[t, j] * rows + c
    row = index[v_t, v_j].astype("int64") * tirx.const(rows, "int64") + v_c
    try:
        w_by_row = _rewrite(w_term, [], node=lambda e: n if structural_equal(e, row) else None)
        planes = _buffers(w_by_row)
        if _uses(w_by_row, (v_t, v_j, v_c)) or _reads(w_by_row, index) or _uses(x_term, (v_c,)) or not planes:
            return None
        n_total = static_int(planes[0].shape[0])
        if n_total is None or n_total % rows:
            return None
        finish, out = _epilogue(epilogue, sums, (v_t, v_j, v_c))
    except (_Unknown, TypeError):                 # a node it cannot rebuild (TypeError: one rebuilt wrongly)
        return None
    if finish is None:
        return None
    x = lambda t, j, r: _rewrite(x_term, [(v_t, t), (v_j, j), (v_r, r)])                      # noqa: E731
    plain = isinstance(x_term, X.TensorLoad) and x_term.source.dtype == "float32" and sums.dtype == "float32"
    per_slot = plain and _indices_are(x_term, v_t, v_j, v_r)
    x_rows = x_term.source if per_slot or (plain and _indices_are(x_term, v_t, v_r)) else None
    found = weight_format(w_by_row, planes, n_total, depth, "float32", n, v_r) if x_rows is not None else None
    return ExpertMatmul(sums.shape[0], k, n_total // rows, rows, depth, index, x, out, finish,
                        w_by_row, n, v_r, planes, x_rows, per_slot, found)


def _epilogue(blocks, sums, out_vars):
    """(finish(t, j, c, total), output buffer): the spatial blocks after the matmul, each reading the
    one before at its own point and writing [T, k, rows] at it, composed; (None, None) otherwise."""
    steps, prev = [], sums
    for block in blocks:
        if any(iv.iter_type != _SPATIAL for iv in block.iter_vars) or len(block.iter_vars) != 3:
            return None, None
        us = [iv.var for iv in block.iter_vars]
        store = block.body
        if not isinstance(store, tirx.BufferStore) or not _at(store, store.buffer, *us):
            return None, None
        steps.append((us, prev, store.value))
        prev = store.buffer
    out = prev
    if [static_int(d) for d in out.shape[1:]] != [static_int(d) for d in sums.shape[1:]]:
        return None, None
    for us, before, value in steps:                # no other read of the buffer before
        if _reads(_rewrite(value, [], lambda load, b=before, us=us: tirx.FloatImm("float32", 0.0)
                           if load.source.same_as(b) and _indices_are(load, *us) else None), before):
            return None, None

    def finish(t, j, c, total):
        for us, before, value in steps:
            total = _rewrite(value, list(zip(us, (t, j, c))),
                             lambda load, b=before, v=total: v if load.source.same_as(b) else None)
        return total if _dtype(total) == out.dtype else total.astype(out.dtype)
    return finish, out


def grouped_body(m: ExpertMatmul, lanes: int) -> tirx.Stmt:
    """The grouped kernel's statements over the matched function's own buffers (module docstring)."""
    k, experts, rows, depth = m.k, m.experts, m.rows, m.depth
    tile = TILE_ROWS if rows % TILE_ROWS == 0 else 1
    tiles, vectors = rows // tile, depth // lanes
    slots = m.tokens * k
    index, out = m.index, m.out
    # Float16 side planes (a GGUF's scales and mins, a group's value each) widened to float32 a tile row
    # at a time, all of the row's groups in one vector conversion; the decode then reads them as floats.
    # Read in the decode itself, each conversion went through a register the step before had written
    # (LLVM's vpinsrw), chaining the steps.
    sides = [p for p in m.planes if p.dtype == "float16" and len(p.shape) == 2
             and (static_int(p.shape[1]) or depth) < depth]
    sides = sides if len(sides) <= 2 else []
    widths = [static_int(p.shape[1]) for p in sides] + [1] * (2 - len(sides))
    crow = tirx.Var("tile_row", "int64")

    def from_sides(buffers):
        def copy(load):
            """The side plane's value `load` reads, from its float32 copy in `buffers` (None: not a side plane's)."""
            for plane, buffer, width in zip(sides, buffers, widths):
                if load.source.same_as(plane) and load.indices[0].same_as(m.row):
                    return tirx.BufferLoad(buffer, [crow * width + load.indices[1]])
            return None

        def hook(load):                     # where the dequantize reads a float16 plane in float16 (AArch64's
            value = copy(load)              # q4f16), the copy's value rounded back: exactly the plane's
            return value if value is None or load.source.dtype == "float32" else tirx.Cast(load.source.dtype, value)

        def widened(e):                     # a float16 plane's value widened to float32: the copy itself
            if isinstance(e, P.Cast) and _dtype(e) == "float32" and isinstance(e.value, X.TensorLoad):
                return copy(e.value)
            return None
        return _rewrite(m.w_expr, [], load=hook, node=widened)

    def weight(buffers, n, c, col):
        """W[n, col] for the tile's row c, its side planes read from `buffers`, as float32 (a float16 dequantize's
        value widened: what the function's own float32 product takes)."""
        value = _rewrite(from_sides(buffers), [(m.row, n), (m.col, col), (crow, c)])
        return value if _dtype(value) == "float32" else T.Cast("float32", value)

    def chosen(s):
        return T.Cast("int64", index[s // k, s % k])

    # The tile's decode asks for the codes (the first plane: every format's codes) of the rows
    # prefetch.PREFETCH_BYTES on: each tile starts a 4 KB page, where the CPU's prefetcher starts over.
    first_plane = m.planes[0]
    plane_cols = static_int(first_plane.shape[-1]) if len(first_plane.shape) == 2 \
        and static_int(first_plane.shape[0]) == experts * rows else None
    ahead = rows_ahead(plane_cols * tvm.DataType(first_plane.dtype).bits // 8) if plane_cols else 0

    @T.macro
    def prefetch(plane, n, col):
        """Weight row n's codes at column col, `ahead` rows on, asked for."""
        if ahead > 0:
            T.evaluate(prefetch_read(T.address_of(
                plane[T.min(n + ahead, experts * rows - 1), col * plane_cols // depth])))

    # 4-bit codes (kiln's q4 and q4m, whose group is whole chunks of 32): a chunk's 16 code bytes
    # widened to 16 lanes, the low nibbles its even values and the high ones its odd (quant_gemv's
    # split), the tile stored in that order and x read through a copy in it (xp): 15 vector
    # instructions a 32 values where the generic decode spends 28.
    found = m.format
    nibbles = found is not None and found[0] in ("q4", "q4m") and found[1] % NIBBLE_CHUNK == 0
    x_count = slots if m.per_slot else m.tokens
    if nibbles:
        kind, group, (codes, scale_plane, min_plane) = found

        def side(plane, buffers, c, n, col):
            """The scale's (or min's) value at column col of the tile's row c (weight row n), as
            float32: from its widened copy in `buffers` where it is float16."""
            for buffer, each, width in zip(buffers, sides, widths):
                if plane.same_as(each):
                    return buffer[c * width + col // group]
            return plane[n, col // group]

        def nibble(buffers, c, n, byte, col):
            """The tile's row c's value at column col (of weight row n) from its code `byte` (int32):
            exactly the dequantize's, (q - 8) s or q s + m."""
            if kind == "q4":
                return (T.Cast("float32", byte) - T.float32(8)) * side(scale_plane, buffers, c, n, col)
            return T.Cast("float32", byte) * side(scale_plane, buffers, c, n, col) + side(
                min_plane, buffers, c, n, col)

    def x_value(xp, slot, col):
        """x's value the slot's sum takes at column col (4-bit codes: col in xp's order)."""
        if nibbles:
            return xp[(slot if m.per_slot else slot // k) * depth + col]
        return m.x(slot // k, slot % k, col)

    @T.macro
    def slot_pass(acc, w, xp, slot, order, at, width, item):
        """The sums of `width` slots (order[at:], one expert's) with the tile's rows, finished and written."""
        for s in range(T.int64(width)):
            slot[s] = order[at + s]
        for i in T.vectorized(T.int64(width * tile * lanes)):
            acc[i] = T.float32(0)
        for v in range(T.int64(vectors)):
            for s in T.unroll(T.int64(width)):
                for c in T.unroll(T.int64(tile)):
                    for i in T.vectorized(T.int64(lanes)):
                        acc[(s * tile + c) * lanes + i] = acc[(s * tile + c) * lanes + i] + x_value(
                            xp, slot[s], v * lanes + i) * w[c * depth + v * lanes + i]
        for s in range(T.int64(width)):
            for c in range(T.int64(tile)):
                total = T.alloc_buffer((1,), "float32")
                total[0] = T.float32(0)
                for i in range(T.int64(lanes)):
                    total[0] = total[0] + acc[(s * tile + c) * lanes + i]
                out[slot[s] // k, slot[s] % k, item % tiles * tile + c] = m.finish(
                    slot[s] // k, slot[s] % k, item % tiles * tile + c, total[0])

    @T.prim_func(private=True, check_well_formed=False)
    def kernel():
        start = T.alloc_buffer((experts + 1,), "int64")         # start[e]: expert e's first slot in `order`
        fill = T.alloc_buffer((experts,), "int64")
        order = T.alloc_buffer((slots,), "int64")               # the slots by expert (in slot order within one)
        active = T.alloc_buffer((experts,), "int64")            # the experts some slot chose
        used = T.alloc_buffer((1,), "int64")
        for e in range(T.int64(experts + 1)):
            start[e] = T.int64(0)
        for s in range(slots):
            start[chosen(s) + 1] = start[chosen(s) + 1] + T.int64(1)
        used[0] = T.int64(0)
        for e in range(T.int64(experts)):
            if start[e + 1] > T.int64(0):
                active[used[0]] = e
                used[0] = used[0] + T.int64(1)
            start[e + 1] = start[e + 1] + start[e]
            fill[e] = start[e]
        for s in range(slots):
            order[fill[chosen(s)]] = s
            fill[chosen(s)] = fill[chosen(s)] + T.int64(1)
        xp = T.alloc_buffer((x_count * depth if nibbles else 1,), "float32")   # x in the tile's order
        if nibbles:
            X = T.decl_buffer((x_count * depth,), "float32", data=m.x_rows.data)
            for r in T.parallel(x_count):
                for ch in range(T.int64(depth // NIBBLE_CHUNK)):
                    for h in T.unroll(2):
                        for i in T.vectorized(16):
                            xp[r * depth + ch * NIBBLE_CHUNK + h * 16 + i] = X[r * depth + nibble_col(ch, h, i)]
        items = used[0] * T.int64(tiles)
        for item in T.parallel(items):
            e = active[item // tiles]
            first = start[e]
            count = start[e + 1] - first
            w = T.alloc_buffer((tile * depth,), "float32")      # the tile, decoded
            side0 = T.alloc_buffer((tile * widths[0],), "float32")
            side1 = T.alloc_buffer((tile * widths[1],), "float32")
            for c in range(T.int64(tile)):
                if len(sides) > 0:
                    for g in T.vectorized(T.int64(widths[0])):
                        side0[c * widths[0] + g] = T.Cast("float32", sides[0][e * rows + item % tiles * tile + c, g])
                if len(sides) > 1:
                    for g in T.vectorized(T.int64(widths[1])):
                        side1[c * widths[1] + g] = T.Cast("float32", sides[1][e * rows + item % tiles * tile + c, g])
            if nibbles:
                Wb = T.decl_buffer((experts * rows, depth // 2), "uint8", data=codes.data)
                for c in range(T.int64(tile)):
                    n = e * rows + item % tiles * tile + c
                    for ch in range(T.int64(depth // NIBBLE_CHUNK)):
                        prefetch(first_plane, n, ch * NIBBLE_CHUNK)
                        for i in T.vectorized(16):          # (nibble_code's half: a Python int)
                            w[c * depth + ch * NIBBLE_CHUNK + i] = nibble(
                                [side0, side1], c, n, nibble_code(Wb, n, ch, 0, i), nibble_col(ch, 0, i))
                        for i in T.vectorized(16):
                            w[c * depth + ch * NIBBLE_CHUNK + 16 + i] = nibble(
                                [side0, side1], c, n, nibble_code(Wb, n, ch, 1, i), nibble_col(ch, 1, i))
            else:
                for c in range(T.int64(tile)):
                    n = e * rows + item % tiles * tile + c
                    for v in range(T.int64(depth // (WORD * WORDS))):
                        prefetch(first_plane, n, v * (WORD * WORDS))
                        for u in T.unroll(T.int64(WORDS)):
                            for i in T.vectorized(T.int64(WORD)):
                                w[c * depth + (v * WORDS + u) * WORD + i] = weight(
                                    [side0, side1], n, c, (v * WORDS + u) * WORD + i)
            acc = T.alloc_buffer((SLOTS * tile * lanes,), "float32")
            slot = T.alloc_buffer((SLOTS,), "int64")
            for b in range(count // SLOTS):
                slot_pass(acc, w, xp, slot, order, first + b * SLOTS, SLOTS, item)
            if count % SLOTS == 2:          # the rest in one pass (two singles: 2-3% slower at 4 slots an expert)
                slot_pass(acc, w, xp, slot, order, first + count // SLOTS * SLOTS, 2, item)
            else:
                for b in range(count % SLOTS):
                    slot_pass(acc, w, xp, slot, order, first + count // SLOTS * SLOTS + b, 1, item)

    return kernel.body


class _Unknown(Exception):
    """An expression node _rewrite does not rebuild."""


_BINARY = (P.Add, P.Sub, P.Mul, P.Div, P.Mod, P.FloorDiv, P.FloorMod, P.Min, P.Max, P.EQ, P.NE, P.LT, P.LE,
           P.GT, P.GE, P.And, P.Or, P.BitwiseAnd, P.BitwiseOr, P.BitwiseXor, P.LShift, P.RShift)


def _rewrite(expr, vars_, load=lambda node: None, node=lambda e: None):
    """`expr` with each var of the (var, value) pairs replaced, each load for which `load` (given the
    load as it stands) returns a value and each node for which `node` does replaced by it. TVM 0.27's
    Python has no expression mutator (stmt_functor is gone): the node kinds a dequantize or an
    epilogue uses; others raise _Unknown."""
    def go(e):
        hit = node(e)
        if hit is not None:
            return hit
        if isinstance(e, X.Var):
            return next((new for old, new in vars_ if old.same_as(e)), e)
        if isinstance(e, (P.IntImm, P.FloatImm, X.StringImm)):
            return e
        if isinstance(e, X.TensorLoad):
            hit = load(e)
            return hit if hit is not None else tirx.BufferLoad(e.source, [go(i) for i in e.indices])
        if isinstance(e, _BINARY):
            return type(e)(go(e.a), go(e.b))
        if isinstance(e, (P.Not, P.BitwiseNot)):
            return type(e)(go(e.a))
        if isinstance(e, P.Cast):
            return tirx.Cast(_dtype(e), go(e.value))
        if isinstance(e, P.Select):
            return tirx.Select(go(e.condition), go(e.true_value), go(e.false_value))
        if isinstance(e, X.Call):
            return X.Call(e.op, [go(a) for a in e.args], e.attrs, e.ty_args, ret_ty=e.ty)
        raise _Unknown(type(e).__name__)
    return go(expr)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _loads(expr) -> list:
    found = []
    _rewrite(expr, [], lambda node: found.append(node))
    return found


def _reads(expr, buffer) -> bool:
    return any(node.source.same_as(buffer) for node in _loads(expr))


def _buffers(expr) -> list:
    seen = []
    for node in _loads(expr):
        if not any(b.same_as(node.source) for b in seen):
            seen.append(node.source)
    return seen


def _uses(expr, vars_) -> bool:
    return any(any(v.same_as(u) for u in vars_) for v in tirx.analysis.undefined_vars(expr))


def _indices_are(load, *vars_) -> bool:
    return len(load.indices) == len(vars_) and all(i.same_as(v) for i, v in zip(load.indices, vars_))


def _at(store, buffer, *vars_) -> bool:
    return store.buffer.same_as(buffer) and _indices_are(store, *vars_)


def _is_load(expr, buffer, *vars_) -> bool:
    return isinstance(expr, X.TensorLoad) and expr.source.same_as(buffer) and _indices_are(expr, *vars_)


__all__ = ["GroupedExpertMatmul", "match_expert_matmul"]
