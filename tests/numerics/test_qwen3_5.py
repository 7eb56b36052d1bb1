"""Qwen3.5 (models/qwen3_5.py) against transformers: a tiny random-init model of gated DeltaNet and gated attention
layers, compiled q0f32 for the CPU, gives transformers' logits within 2e-4 (every prefill position, the last-token
prefill, greedy decode steps, each DeltaNet layer's state carried in its slot of the KV cache kiln owns); the engine's
chunked prefill, batches and n > 1 give the tokens a plain run gives, a conversation's next turn continues its cached
state, and speculation is refused for it; the MoE variant, the multimodal checkpoint's text, Qwen3-Next and GGUFs
(qwen35, qwen3next) read; the kernels build for CUDA."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=256, eos_token_id=2,
              bos_token_id=None, pad_token_id=0, rms_norm_eps=1e-6, tie_word_embeddings=False)
IDS = np.random.default_rng(8).integers(3, 500, size=30).tolist()
# transformers runs a whole sequence through the chunked delta rule (a triangular solve a chunk of 64), kiln token
# by token: apart in float32 by up to 1.4e-4 on some seeds' logits (about 2 in size)
CHUNKED = 2e-4


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    ref = write_widened("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", CONFIG, root / "hf", seed=1)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref, root


def test_qwen35_matches_transformers(qwen35):
    art, ref, _ = qwen35
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    layout = Artifact.load(art).config.kv_cache
    assert layout.owners == [3] and layout.states == [(64, 3), (4, 8, 8)] * 3
    assert layout.rewind_problem() and "state_slots" in layout.tables


def test_engine_chunks_batches_forks_and_continues_turns(qwen35):
    assert_recurrent_engine(qwen35[0])


def test_state_slots_follow_their_sequences(qwen35):
    """runtime/kv_caches.py OwnedCache over a recurrent layout: a slot a sequence from add to remove, a fork at the
    end copies the parent's state into the child's slot, and a fork mid-sequence, a pop or one sequence too many is
    refused by name."""
    import tvm
    from kiln.runtime.kv_caches import OwnedCache
    layout = Artifact.load(qwen35[0]).config.kv_cache
    cache = OwnedCache(layout, tvm.cpu(), 64, lambda name, a: tvm.runtime.tensor(a), max_seqs=2)
    assert [s.shape for s in cache.states] == [(2, 64, 3), (2, 4, 8, 8)] * 3
    cache.add(7)
    cache.begin([7], [5])
    for i, state in enumerate(cache.states):
        state.copyfrom(np.arange(np.prod(state.shape), dtype=np.float32).reshape(state.shape) + i)
    with pytest.raises(ValueError, match="recurrent layers' state holds them all"):
        cache.fork(7, 8, 3)
    cache.fork(7, 8)
    for state in cache.states:
        np.testing.assert_array_equal(state.numpy()[cache._slot[8]], state.numpy()[cache._slot[7]])
    assert cache.length(8) == 5 and cache._slot[8] != cache._slot[7]
    with pytest.raises(RuntimeError, match="every recurrent state slot"):
        cache.add(9)
    with pytest.raises(ValueError, match="cannot pop tokens from sequence 8"):
        cache.pop(8, 1)
    slot = cache._slot[8]
    cache.remove(8)
    cache.add(9)
    assert cache._slot[9] == slot
    tables = cache.begin([9, 7], [2, 1])[-1].numpy()                  # state_slots, the last table
    np.testing.assert_array_equal(tables, [cache._slot[9], cache._slot[7]])


def test_qwen35_moe_and_the_multimodal_checkpoint(tmp_path):
    moe = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48)
    moe.pop("intermediate_size")
    ref = write_widened("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", moe, tmp_path / "moe", seed=2)
    art = kiln.compile(str(tmp_path / "moe"), target="cpu", quant="q0f32", output=tmp_path / "moe-art")
    assert_prefill_and_decode_match(art, ref, IDS[:12], CHUNKED)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64)
    ref = write_widened("Qwen3_5ForConditionalGeneration", "Qwen3_5Config",
                        dict(text_config=CONFIG, vision_config=vision), tmp_path / "vl", seed=3)
    art = kiln.compile(str(tmp_path / "vl"), target="cpu", quant="q0f32", output=tmp_path / "vl-art")
    assert Artifact.load(art).config.model.config["weight_prefix"] == "model.language_model"
    assert_prefill_and_decode_match(art, ref, IDS[:12], CHUNKED)


def test_q8_qwen35_equals_transformers_on_its_q8_weights(qwen35):
    """q8f32: the artifact's logits equal transformers' with every weight kiln quantized (the DeltaNet's
    projections among them) replaced by its q8 values (kiln's own packer); its conv, decay and norm weights stay
    float."""
    import torch

    from kiln.compiler.quant_modules import QuantFormat
    from kiln.compiler.quant_pack import dequantize, quantize
    from kiln.models.qwen3_5 import Qwen35Config, weight_map
    _, ref, root = qwen35
    art = kiln.compile(str(root / "hf"), target="cpu", quant="q8f32", output=root / "q8")
    wmap = weight_map(Qwen35Config.from_hf(json.loads((root / "hf" / "config.json").read_text())))
    fmt, state = QuantFormat("q8", 32, "float32"), {k: v.clone() for k, v in ref.state_dict().items()}
    matrices = [n for n, hf in wmap.items() if isinstance(hf, list) and all(state[h].ndim == 2 for h in hf)]
    assert Artifact.load(art).config.quantization["formats"] == {    # every matrix, the embedding and head too
        "q8": {"kind": "q8", "bits": 8, "group_size": 32, "scale_dtype": "float32", "value": "q * scale",
               "weights": len(matrices)}}
    for name in matrices:
        for hf in wmap[name]:
            state[hf] = torch.from_numpy(dequantize(fmt, quantize(fmt, state[hf].numpy())))
    q8 = copy.deepcopy(ref)
    q8.load_state_dict(state)
    assert_prefill_and_decode_match(art, q8.eval(), IDS, CHUNKED)


def test_qwen3_next_matches_transformers(tmp_path):
    """Qwen3-Next: the first layer's MLP dense (mlp_only_layers), the rest 4 experts (2 a token) beside a gated shared
    expert; in_proj_qkvz and in_proj_ba, fused a key head, split at load."""
    cfg = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48, mlp_only_layers=[0], decoder_sparse_step=1)
    ref = write_widened("Qwen3NextForCausalLM", "Qwen3NextConfig", cfg, tmp_path / "hf", seed=4)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert Artifact.load(art).config.model.arch == "qwen3_next"
    assert_prefill_and_decode_match(art, ref, IDS[:16], CHUNKED)


def test_qwen3_next_gguf_matches_transformers(tmp_path):
    """A qwen3next GGUF as llama.cpp's converter writes it (in_proj_qkvz split into attn_qkv and attn_gate, in_proj_ba
    as it is, no V heads tiled; experts in every layer, as llama.cpp runs it) read as Qwen3.5-MoE: transformers'
    Qwen3-Next logits."""
    from gguf_writer import write_gguf
    cfg = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48, mlp_only_layers=[], decoder_sparse_step=1)
    ref = write_widened("Qwen3NextForCausalLM", "Qwen3NextConfig", cfg, tmp_path / "hf", seed=5)
    path = write_gguf(tmp_path / "hf", tmp_path / "next.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert Artifact.load(art).config.model.arch == "qwen3_5_moe"
    assert_prefill_and_decode_match(art, ref, IDS[:16], CHUNKED)


def test_qwen35_gguf_matches_transformers(qwen35, tmp_path):
    """As llama.cpp's converter writes it (tests/gguf_writer.py: A as -exp(A_log), the conv squeezed, norms + 1 but
    the DeltaNet's, the 4 value heads tiled over the 2 key heads in attn_qkv, attn_gate, ssm_alpha / beta / a / dt,
    the conv and ssm_out's columns; the qwen35 pre-tokenizer): read back into the model it came from; Q8_0 kept
    exactly (transformers on the values kiln reads from the file) but ssm_out, whose reordered columns are no whole
    blocks: re-quantized to q8 (transformers on those values there)."""
    import torch

    from gguf_writer import write_gguf
    from kiln.compiler.quant_modules import QuantFormat
    from kiln.compiler.quant_pack import dequantize, quantize
    from kiln.models.gguf import load_gguf
    _, ref, root = qwen35
    path = write_gguf(root / "hf", tmp_path / "qwen35.gguf")
    source = load_gguf(path)
    config = source.hf_config
    assert (config["model_type"], config["linear_num_key_heads"], config["linear_num_value_heads"],
            config["partial_rotary_factor"]) == ("qwen3_5_text", 2, 4, 0.25)
    assert source.weights.unmapped == []
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED)
    q8 = write_gguf(root / "hf", tmp_path / "qwen35-q8.gguf", default="Q8_0")
    art = kiln.compile(str(q8), target="cpu", quant="auto", output=tmp_path / "q8")
    formats = Artifact.load(art).config.quantization["tensors"]
    assert [n for n, f in formats.items() if f != "q8-f16scales"] == [f"model.layers.{i}.mixer.out_proj.weight"
                                                                      for i in range(3)]
    weights, fmt = load_gguf(q8).weights, QuantFormat("q8", 32, "float32")
    assert set(ref.state_dict()) <= set(weights.names())
    state = {k: torch.from_numpy(weights.get(k).astype(np.float32)) for k in ref.state_dict()}
    for k in (k for k in state if k.endswith("linear_attn.out_proj.weight")):
        state[k] = torch.from_numpy(dequantize(fmt, quantize(fmt, state[k].numpy())))
    on_file = copy.deepcopy(ref)
    on_file.load_state_dict(state)
    assert_prefill_and_decode_match(art, on_file.eval(), IDS, CHUNKED)


def test_qwen35_moe_gguf_matches_transformers(tmp_path):
    """qwen35moe: qwen35's layers with qwen2moe's stacked experts, shared expert and its gate; the layers' kinds in
    no period, as attention.recurrent_layers (full_attention_interval written as 4 beside it, which llama.cpp's
    loader, and kiln, read only where recurrent_layers is not written)."""
    from gguf_writer import write_gguf
    moe = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48,
               layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"])
    moe.pop("intermediate_size")
    ref = write_widened("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", moe, tmp_path / "moe", seed=2)
    path = write_gguf(tmp_path / "moe", tmp_path / "moe.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS[:12], CHUNKED)


def test_recurrent_kernels_build_for_cuda():
    """The conv and delta-rule kernels' GPU forms (their numerics: tests/compiler/test_opencl_kernels.py) through
    nvcc for an H100, at Qwen3.5-9B's sizes (8192 conv channels, 16 key heads and 32 value heads of 128), Kimi
    Linear's KDA (32 heads of 128, a decay a key channel), the Mamba-2 scan at Granite-4.0-H-Small's (128 heads of 64 over one group's 128-wide state) and Mamba-1's at Falcon
    Mamba 7B's (8192 channels of 16)."""
    import tvm

    from kiln.targets.recurrent import gated_delta, selective_scan, state_conv
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for name, func in (("conv", state_conv(8192, 4, "float16", gpu=True)),
                       ("delta", gated_delta(16, 32, 128, 128, gpu=True)),
                       ("kda", gated_delta(32, 32, 128, 128, gpu=True, channels=True)),
                       ("scan", gated_delta(1, 128, 128, 64, gpu=True, delta=False)),
                       ("selective_scan", selective_scan(8192, 16, gpu=True))):
        lib = tvm.compile(tvm.IRModule({name: func}), target=target)
        assert "__global__" in lib.mod.imports[0].inspect_source()
