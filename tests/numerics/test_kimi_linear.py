"""KDA hybrids (models/kimi_linear.py) against transformers: tiny random-init models of KDA layers (the delta rule
with a decay a key channel) among latent-attention layers, DeepSeek-V3's experts after a dense layer, compiled q0f32
for the CPU, give transformers' logits (every prefill position, the last-token prefill, greedy decode steps) and pass
`kiln check`, saved by transformers and in the released checkpoints' format (their config.json, their tensor
names); the engine batches, chunks and continues cached turns over the state slots and the latent attention's pages
in the cache kiln owns. Kimi Linear (no RoPE; its GGUF too) and Ling 3.0 (bailing_hybrid: full-rank gates, a
bounded decay, RoPE and a gate a head on the MLA, SwiGLU clamps)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
LINEAR = {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 16, "num_heads": 4,
          "short_conv_kernel_size": 4}
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
              qk_nope_head_dim=24, v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1,
              n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1, linear_attn_config=LINEAR,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LING = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
            qk_nope_head_dim=24, v_head_dim=16, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, n_group=2, topk_group=1, layer_group_size=2, first_k_dense_replace=1,
            routed_scaling_factor=2.5, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            num_mtp_layers=0)
IDS = np.random.default_rng(9).integers(3, 500, size=30).tolist()
CHUNKED = 2e-4          # transformers' chunked delta rule against kiln's token-serial one (test_qwen3_5.py)
# config.json keys transformers writes that the released checkpoints' do not
TRANSFORMERS_ONLY = ("linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "layer_types", "mlp_layer_types",
                     "qk_head_dim", "dtype", "transformers_version")


def _rewrite(d, config, tensor_name) -> None:
    """The folder transformers saved rewritten as a released checkpoint: config.json by `config`, tensors renamed
    by `tensor_name` (a name -> its released name)."""
    from safetensors.numpy import load_file, save_file
    path = d / "model.safetensors"
    save_file({tensor_name(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config({k: v for k, v in cfg.items() if k not in TRANSFORMERS_ONLY})))


def _as_moonshot(d) -> None:
    """Moonshot's format: its config keys; a dense layer's MLP under mlp (transformers writes block_sparse_moe)."""
    _rewrite(d, lambda c: dict(c, mla_use_nope=True, moe_router_activation_func="sigmoid", model_type="kimi_linear",
                               auto_map={"AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"}),
             lambda k: k.replace(".block_sparse_moe.", ".mlp.") if k.endswith(
                 ("gate_proj.weight", "up_proj.weight", "down_proj.weight")) and ".shared_experts." not in k else k)


def _as_ling_release(d, kda_layers) -> None:
    """The released Ling 3.0 format (BailingMoeV3ForCausalLM): head_dim the KDA's, a KDA layer's output projection
    attention.o_proj (transformers writes attention.dense, as the MLA's is)."""
    def config(c):
        return dict(c, architectures=["BailingMoeV3ForCausalLM"], model_type="bailing_moe_v3", head_dim=16,
                    no_kda_lora=True, gated_attention_proj_granularity_type="head_wise",
                    moe_shared_expert_intermediate_size=c["moe_intermediate_size"] * c["num_shared_experts"],
                    auto_map={"AutoModelForCausalLM": "modeling_bailing_moe_v3.BailingMoeV3ForCausalLM"})
    _rewrite(d, config, lambda k: k.replace(".attention.dense.", ".attention.o_proj.")
             if any(k.startswith(f"model.layers.{i}.") for i in kda_layers) else k)


def _compiled_and_checked(d, out, arch: str):
    art = kiln.compile(str(d), target="cpu", quant="q0f32", output=out)
    config = Artifact.load(art).config
    assert config.model.arch == arch
    assert config.kv_cache.owners == [1, 3] and config.kv_cache.states == [(192, 3), (4, 16, 16)] * 2
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    return art


@pytest.mark.parametrize("saved", ["transformers", "moonshot"])
def test_kimi_linear_matches_transformers(saved, tmp_path):
    ref = write_widened("KimiLinearForCausalLM", "KimiLinearConfig", CONFIG, tmp_path / "hf", seed=3)
    assert ref.config.layer_types == ["linear_attention", "full_attention"] * 2
    if saved == "moonshot":
        _as_moonshot(tmp_path / "hf")
    art = _compiled_and_checked(tmp_path / "hf", tmp_path / "art", "kimi_linear")
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED, steps=5 if saved == "transformers" else 2)
    if saved == "transformers":
        assert_recurrent_engine(art)


def test_kimi_linear_gguf_matches_transformers(tmp_path):
    """llama.cpp's kimi-linear layout (tests/gguf_writer.py: KimiLinearModel's keys and tensors: KDA's kinds by
    head_count_kv, its convs 4-D, A as -exp(A_log), kv_b_proj split by heads) read back as the model it came from.
    One expert group, as released: the converter writes Moonshot's num_expert_group nowhere."""
    from gguf_writer import write_gguf
    ref = write_widened("KimiLinearForCausalLM", "KimiLinearConfig", dict(CONFIG, n_group=1), tmp_path / "hf", seed=5)
    _as_moonshot(tmp_path / "hf")
    path = write_gguf(tmp_path / "hf", tmp_path / "kimi.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert Artifact.load(art).config.model.arch == "kimi_linear"
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED, steps=2)


def test_kimi_linear_reads_moonshots_config():
    """Moonshot's config.json (its own key names, the layer lists 1-based, no layer_types) reads as transformers
    reads it; what transformers does not run is refused by name."""
    from kiln.models.kimi_linear import KimiLinearConfig
    moonshot = {k: v for k, v in CONFIG.items() if k not in ("num_local_experts", "num_experts_per_tok", "n_group",
                                                             "max_position_embeddings")}
    moonshot.update(num_experts=8, num_experts_per_token=2, num_expert_group=2, moe_renormalize=False,
                    model_max_length=256, mla_use_nope=True, moe_router_activation_func="sigmoid",
                    linear_attn_config=dict(LINEAR, kda_layers=[1, 2, 3], full_attn_layers=[4]))
    c = KimiLinearConfig.from_hf(moonshot)
    assert c.kda_layers == (0, 1, 2) and (c.kda_heads, c.kda_head_dim, c.conv_taps) == (4, 16, 4)
    assert (c.num_experts, c.top_k, c.groups, c.norm_topk_prob, c.context_window_size) == (8, 2, 2, False, 256)
    assert [c.layer_moe(i) is None for i in range(4)] == [True, False, False, False]
    assert not any(a.rope for a in c.layer_attention()) and c.head_dim == 32 and not c.saved_by_transformers
    for key, value in (("mla_use_nope", False), ("moe_router_activation_func", "softmax")):
        with pytest.raises(ValueError, match=key):
            KimiLinearConfig.from_hf(dict(moonshot, **{key: value}))


@pytest.mark.parametrize("variant", ["bounded", "softplus", "released"])
def test_ling3_matches_transformers(variant, tmp_path):
    """Ling 3.0 (bailing_hybrid): full-rank KDA gates with the bounded decay (or softplus's, kda_safe_gate false),
    latent attention with RoPE on pairs and a gate a head, SwiGLU clamps a layer (routed and shared; small enough to
    bite on these widened weights), under Bailing's names; and in the released format (BailingMoeV3ForCausalLM),
    whose reference is transformers' bailing_hybrid class (compiler/golden.py STAND_IN)."""
    cfg = dict(LING, kda_safe_gate=variant != "softplus", expert_swiglu_limit_list=[0, 0.3, 0, 0.2],
               share_expert_swiglu_limit_list=[0, 0.25, 0, 0])
    ref = write_widened("BailingHybridForCausalLM", "BailingHybridConfig", cfg, tmp_path / "hf", seed=7)
    if variant == "released":
        _as_ling_release(tmp_path / "hf", kda_layers=(0, 2))
    art = _compiled_and_checked(tmp_path / "hf", tmp_path / "art", "bailing_hybrid")
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED, steps=2)


def test_ling3_refuses_what_transformers_does_not_run():
    from kiln.models.kimi_linear import BailingHybridConfig
    base = dict(LING, model_type="bailing_hybrid")
    for key, value in (("no_kda_lora", False), ("gated_attention_proj_granularity_type", "element_wise")):
        with pytest.raises(ValueError, match=key):
            BailingHybridConfig.from_hf(dict(base, **{key: value}))
    c = BailingHybridConfig.from_hf(dict(base, num_hidden_layers=5, layer_group_size=2))
    assert c.kda_layers == (0, 2, 4) and any("layers 4-4" in n for n in c.notes)


def test_ling3_gguf_matches_transformers(tmp_path):
    """llama.cpp's bailingmoe3 layout (tests/gguf_writer.py: BailingMoeV3Model's keys and tensors: KDA's kinds by
    head_count_kv, full-rank gates as ssm_f_a / ssm_g_a, A as exp(A_log), the MLA's gate as attn_gate, kv_b_proj split
    by heads, the clamps as arrays) read back as the model it came from."""
    from gguf_writer import write_gguf
    cfg = dict(LING, expert_swiglu_limit_list=[0, 0.3, 0, 0.2], share_expert_swiglu_limit_list=[0, 0.25, 0, 0])
    ref = write_widened("BailingHybridForCausalLM", "BailingHybridConfig", cfg, tmp_path / "hf", seed=11)
    path = write_gguf(tmp_path / "hf", tmp_path / "ling.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert Artifact.load(art).config.model.arch == "bailing_hybrid"
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED, steps=2)
