"""GPTQ, AWQ and compressed-tensors checkpoints written from a float Hugging Face folder, for tests.

Each decoder Linear is rounded to 4 bits (or 8: GPTQ's and compressed-tensors' Int8, 4 codes a word where 4-bit
pack 8), a scale and a zero point per group of G inputs (round to
nearest: the file format is what kiln reads, not how GPTQ or AWQ chose the codes), and packed as
gptqmodel, AutoAWQ and llm-compressor store it (packing written here from their formats,
independently of models/prequantized.py's unpacking; checked once against gptqmodel 7.7's
TorchQuantLinear dequantization, AutoAWQ 0.2.9's dequantize_gemm and compressed-tensors 0.20.1's
unpack_from_int32). `write_prequantized` also writes the float
folder of exactly the values the codes stand for, which transformers reads as the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def round_to_codes(w: np.ndarray, group: int, sym: bool, rng: np.random.Generator, lowest_zero: int = 0,
                   bits: int = 4):
    """float [N, K] -> codes [K, N] uint8, zeros [G', N] int, scales [G', N] float16 (G' = ceil(K / group));
    asymmetric zeros from `lowest_zero` to the top code, each of them somewhere."""
    n, k = w.shape
    top, middle = (1 << bits) - 1, 1 << (bits - 1)
    groups = -(-k // group)
    padded = np.zeros((n, groups * group), np.float32)
    padded[:, :k] = w
    g = padded.reshape(n, groups, group)
    if sym:
        scale = np.abs(g).max(-1) / (middle - 0.5)
        zero = np.full((n, groups), middle)
    else:
        lo, hi = g.min(-1), g.max(-1)
        scale = (hi - lo) / top
        zero = np.clip(np.rint(-lo / np.where(scale == 0, 1, scale)), lowest_zero, top).astype(int)
        zero[:, ::3] = rng.integers(lowest_zero, top + 1, zero[:, ::3].shape)
    scale = np.where(scale == 0, 1e-3, scale).astype(np.float16)
    codes = np.clip(np.rint(g / scale.astype(np.float32)[..., None] + zero[..., None]), 0, top).astype(np.uint8)
    codes = codes.reshape(n, -1)[:, :k]
    return codes.T.copy(), zero.T.copy(), scale.T.copy()


def _pack_along_rows(fields: np.ndarray, bits: int = 4) -> np.ndarray:
    """uint [R, C] of 4-bit fields -> int32 [R / 8, C]: row 8i + j at bits 4j of word row i (8-bit fields:
    4 a word, row 4i + j at bits 8j)."""
    r, c = fields.shape
    per = 32 // bits
    words = np.zeros((r // per, c), np.uint32)
    for j in range(per):
        words |= fields[j::per].astype(np.uint32) << np.uint32(bits * j)
    return words.view(np.int32)


def _pack_along_cols(fields: np.ndarray, order=tuple(range(8)), bits: int = 4) -> np.ndarray:
    """uint [R, C] -> int32 [R, C / 8]: column 8c + order[j] at bits 4j of word c (8-bit: 4 a word)."""
    r, c = fields.shape
    per = 32 // bits
    words = np.zeros((r, c // per), np.uint32)
    for j in range(per):
        words |= fields[:, order[j]::per].astype(np.uint32) << np.uint32(bits * j)
    return words.view(np.int32)


def pack(method: str, codes, zeros, scales, g_idx, zeros_minus_one: bool = True,
         sym: bool = False, bits: int = 4) -> dict[str, np.ndarray]:
    """One Linear's tensors, as `method` ("gptq", "awq", "compressed-tensors") stores them. AutoGPTQ's
    format (zeros_minus_one) cannot hold a zero of 0 (stored as 15, read back as 16), as in real checkpoints."""
    if method == "compressed-tensors":         # signed codes c - 8 stored as c, packed along K; [N, ...] layout
        scale = scales.T.contiguous() if hasattr(scales, "contiguous") else scales.T.copy()     # torch (bf16) or numpy
        out = {"weight_packed": _pack_along_cols(codes.T, bits=bits), "weight_scale": scale,
               "weight_shape": np.array(codes.T.shape, np.int64)}
        if not sym:                            # signed zero points z - 8 stored as z, packed along N
            out["weight_zero_point"] = _pack_along_rows(np.ascontiguousarray(zeros.T), bits)
        return out
    if method == "awq":
        return {"qweight": _pack_along_cols(codes, AWQ_ORDER), "qzeros": _pack_along_cols(zeros, AWQ_ORDER),
                "scales": scales}
    stored = (zeros - 1) & ((1 << bits) - 1) if zeros_minus_one else zeros
    return {"qweight": _pack_along_rows(codes, bits), "qzeros": _pack_along_cols(stored, bits=bits),
            "scales": scales, "g_idx": g_idx.astype(np.int32)}


def dequantized(codes, zeros, scales, g_idx) -> np.ndarray:
    """The float [N, K] the codes stand for."""
    return ((codes.astype(np.float32) - zeros[g_idx]) * scales.astype(np.float32)[g_idx]).T.copy()


def write_prequantized(float_dir: Path, dest: Path, reference: Path, method: str, group: int = 128,
                       sym: bool = False, checkpoint_format: str = "gptq", desc_act: bool = False,
                       bf16_scales: bool = False, seed: int = 0, bits: int = 4) -> None:
    """`float_dir`'s model with its decoder Linears stored `method`-quantized at `dest`, and the float
    model of the same values at `reference`. bf16_scales: scales stored as bfloat16 (compressed-tensors
    from a bfloat16 model)."""
    import torch
    rng = np.random.default_rng(seed)
    packed, values = {}, {}
    for name, prefix, w in _decoder_linears(float_dir, packed, values):
        k = w.shape[1]
        g_idx = np.arange(k) // group
        if desc_act:                               # act-order: inputs quantized in a shuffled order
            g_idx = g_idx[rng.permutation(k)]
        v1 = method == "gptq" and checkpoint_format == "gptq"
        codes, zeros, scales = round_to_codes(w.astype(np.float32), group, sym, rng, lowest_zero=int(v1), bits=bits)
        if desc_act:                                # codes of input k rounded in group g_idx[k]
            g = w.astype(np.float32).T                                          # [K, N]
            codes = np.clip(np.rint(g / scales.astype(np.float32)[g_idx] + zeros[g_idx]), 0,
                            (1 << bits) - 1).astype(np.uint8)
        if bf16_scales:
            scales = torch.from_numpy(scales.astype(np.float32)).bfloat16()
        packed.update({f"{prefix}.{p}": a for p, a in
                       pack(method, codes, zeros, scales, g_idx, v1, sym, bits).items()})
        if bf16_scales:
            scales = scales.float().numpy()
        values[name] = dequantized(codes, zeros, scales, g_idx).astype(np.float32)
    _write_folder(float_dir, dest, packed, _quantization_config(method, group, sym, checkpoint_format, desc_act,
                                                                bits))
    _write_folder(float_dir, reference, values, None)


def _decoder_linears(float_dir: Path, packed: dict, values: dict):
    """(name, prefix, weight) of each decoder Linear in float_dir's model.safetensors; every other tensor goes into
    `packed` and `values` as it is."""
    from safetensors.numpy import load_file
    for name, w in load_file(str(float_dir / "model.safetensors")).items():
        prefix = name[: -len(".weight")]
        if not name.endswith(".weight") or prefix.rsplit(".", 1)[-1] not in LINEARS:
            packed[name] = values[name] = w
            continue
        yield name, prefix, w


def _write_folder(float_dir: Path, out: Path, tensors: dict, quantization_config: dict | None) -> None:
    """`tensors` (numpy, or torch where numpy has no such dtype: bfloat16, float8) as out/model.safetensors,
    float_dir's config with `quantization_config`, and its tokenizer files."""
    import torch
    from safetensors.numpy import save_file
    from safetensors.torch import save_file as save_torch
    out.mkdir(parents=True, exist_ok=True)
    if any(isinstance(v, torch.Tensor) for v in tensors.values()):
        save_torch({k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
                    for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((float_dir / "config.json").read_text())
    extra = {"quantization_config": quantization_config} if quantization_config else {}
    (out / "config.json").write_text(json.dumps({**config, **extra, "torch_dtype": "float32"}))
    for f in float_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)


def _quantization_config(method: str, group: int, sym: bool, checkpoint_format: str, desc_act: bool,
                         bits: int = 4) -> dict:
    if method == "compressed-tensors":
        weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group", "group_size": group,
                   "dynamic": False, "actorder": None, "observer": "minmax"}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                              "output_activations": None, "format": "pack-quantized"}},
                "ignore": ["lm_head"]}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
            "checkpoint_format": checkpoint_format, "true_sequential": True, "damp_percent": 0.01}


def write_fp8(float_dir: Path, dest: Path, reference: Path, producer: str = "fp8",
              block: tuple[int, int] | None = (128, 128)) -> None:
    """`float_dir`'s model with its decoder Linears stored as float8 e4m3 and scales, as transformers'
    FineGrainedFP8 (producer "fp8": `weight_scale_inv` per block of `block`) or llm-compressor's FP8
    (producer "compressed-tensors": `weight_scale` per block, or per channel where `block` is None) keeps
    them; the float model of the values they stand for (fp8 * scale in float32) at `reference`."""
    import torch
    from safetensors.numpy import load_file
    tensors = load_file(str(float_dir / "model.safetensors"))
    stored, values = {}, {}
    for name, w in tensors.items():
        prefix = name[: -len(".weight")]
        if not name.endswith(".weight") or prefix.rsplit(".", 1)[-1] not in LINEARS:
            stored[name], values[name] = torch.from_numpy(w), w
            continue
        n, k = w.shape
        bn, bk = block or (1, k)
        rows, cols = -(-n // bn), -(-k // bk)
        padded = np.zeros((rows * bn, cols * bk), np.float32)
        padded[:n, :k] = w
        scale = np.abs(padded.reshape(rows, bn, cols, bk)).max(axis=(1, 3)) / 448
        scale = np.where(scale == 0, 1, scale).astype(np.float32)                        # [rows, cols]
        full = np.repeat(np.repeat(scale, bn, axis=0), bk, axis=1)[:n, :k]
        fp8 = torch.from_numpy(w.astype(np.float32) / full).to(torch.float8_e4m3fn)
        stored[name] = fp8
        stored[f"{prefix}.{'weight_scale_inv' if producer == 'fp8' else 'weight_scale'}"] = torch.from_numpy(scale)
        if producer != "fp8":
            stored[f"{prefix}.input_scale"] = torch.ones(1)                                # static activations
        values[name] = (fp8.float() * torch.from_numpy(full)).numpy()
    if producer == "fp8":
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": list(block) if block else None}
    else:
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                   "strategy": "block" if block else "channel", "block_structure": list(block) if block else None}
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": "float-quantized",
                                            "input_activations": {"num_bits": 8, "type": "float", "dynamic": False,
                                                                  "strategy": "tensor"}}},
              "ignore": ["lm_head"]}
    _write_folder(float_dir, dest, stored, qc)
    _write_folder(float_dir, reference, values, None)


# bitsandbytes' 4-bit levels (bitsandbytes.functional.get_4bit_type), as its checkpoints store them in quant_map
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
FP4 = [0.0, 0.0052083334885537624, 0.6666666865348816, 1.0, 0.3333333432674408, 0.5, 0.1666666716337204, 0.25,
       0.0, -0.0052083334885537624, -0.6666666865348816, -1.0, -0.3333333432674408, -0.5, -0.1666666716337204,
       -0.25]


def write_bnb(float_dir: Path, dest: Path, reference: Path, quant_type: str = "nf4", double_quant: bool = True,
              dtype: str = "bfloat16", blocksize: int = 64, nested_blocksize: int = 256) -> None:
    """`float_dir`'s model with its decoder Linears stored as transformers saves a bitsandbytes 4-bit model
    (checked once against bitsandbytes 0.50.2's dequantize_4bit, bit for bit): `.weight` uint8 [N K / 2, 1]
    (the first code in the high nibble), `.weight.absmax`, `.weight.quant_map`, with double quantization
    `.weight.nested_absmax` / `.weight.nested_quant_map` (absmax as uint8 codes of an 8-bit table around its
    mean), and `.weight.quant_state.bitsandbytes__<type>` (JSON bytes). At `reference`, the float model of the
    values bitsandbytes dequantizes them to (in float32, rounded to `dtype`)."""
    import torch
    levels = np.asarray(NF4 if quant_type == "nf4" else FP4, np.float32)
    nested_map = np.linspace(-1.0, 1.0, 256).astype(np.float32)
    packed, values = {}, {}
    for name, _, w in _decoder_linears(float_dir, packed, values):
        flat = w.astype(np.float32).reshape(-1, blocksize)
        absmax = np.abs(flat).max(1).astype(np.float32)
        codes = np.abs(flat[..., None] / absmax[:, None, None] - levels).argmin(-1).astype(np.uint8).reshape(-1)
        state = {"quant_type": quant_type, "blocksize": blocksize, "dtype": dtype, "shape": list(w.shape)}
        out = {"": (codes[0::2] << 4 | codes[1::2]).reshape(-1, 1), ".quant_map": levels}
        if double_quant:
            offset = np.float32(absmax.mean())
            blocks = absmax.size
            centred = np.zeros(-(-blocks // nested_blocksize) * nested_blocksize, np.float32)
            centred[:blocks] = absmax - offset
            centred = centred.reshape(-1, nested_blocksize)                     # the last block ragged
            nested = np.abs(centred).max(1).astype(np.float32)
            stored = np.abs(centred[..., None] / nested[:, None, None] - nested_map).argmin(-1).astype(np.uint8)
            stored = stored.reshape(-1)[:blocks]
            out.update({".absmax": stored, ".nested_absmax": nested, ".nested_quant_map": nested_map})
            state.update(nested_blocksize=nested_blocksize, nested_dtype="float32", nested_offset=float(offset))
            absmax = (nested_map[stored] * np.repeat(nested, nested_blocksize)[:blocks] + offset).astype(np.float32)
        else:
            out[".absmax"] = absmax
        out[f".quant_state.bitsandbytes__{quant_type}"] = np.frombuffer(json.dumps(state).encode(), np.uint8).copy()
        packed.update({f"{name}{suffix}": a for suffix, a in out.items()})
        exact = torch.from_numpy(levels[codes] * np.repeat(absmax, blocksize)).to(getattr(torch, dtype))
        values[name] = exact.float().numpy().reshape(w.shape)
    config = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
              "bnb_4bit_quant_type": quant_type, "bnb_4bit_use_double_quant": double_quant,
              "bnb_4bit_compute_dtype": dtype, "bnb_4bit_quant_storage": "uint8"}
    _write_folder(float_dir, dest, packed, config)
    _write_folder(float_dir, reference, values, None)
