"""Mamba-2 hybrids (models/mamba2.py) against transformers: tiny random-init models compiled q0f32 for the CPU give
transformers' logits within 1e-4 (every prefill position, the last-token prefill, greedy decode steps, each Mamba-2
layer's conv and scan state carried in its slot of the KV cache kiln owns): Granite 4.0-H (MoE beside the shared MLP,
no RoPE, two groups of B and C), a dense Granite 4.0-H with RoPE, Bamba (RoPE on half of each head), Nemotron-H
(Mamba-2, attention and MLP blocks), Nemotron-H MoE (squared-ReLU experts without a gate, routed by sigmoid
scores with a choice bias in groups), Mamba-2 alone (no attention layer) and Falcon-H1 (attention and Mamba-2 side
by side in every layer, its multipliers folded into the weights; the gated norm absent or before the gate); the
engine's chunked prefill, batches and n > 1 give a plain run's tokens; GGUFs as llama.cpp's converter writes them
(granitehybrid, Bamba as granitehybrid: no multipliers, RoPE on half of each head; nemotron_h, mamba2, falcon-h1 with
its multipliers folded in) read back into the models they came from."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(8).integers(3, 500, size=30).tolist()
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
GRANITE = dict(SMALL, num_hidden_layers=4, embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5,
               logits_scaling=3.0, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
               shared_intermediate_size=48, layer_types=["mamba", "attention", "mamba", "mamba"])
FALCON_H1 = dict(SMALL, num_hidden_layers=3, head_dim=16, mamba_d_ssm=96, mamba_n_heads=6, mamba_n_groups=2,
                 mamba_d_state=16, ssm_multipliers=[0.5, 1.5, 0.7, 1.3, 0.9], mlp_multipliers=[0.8, 1.2],
                 key_multiplier=0.6, attention_in_multiplier=1.1, attention_out_multiplier=0.9, ssm_in_multiplier=1.2,
                 ssm_out_multiplier=0.8, embedding_multiplier=2.0, lm_head_multiplier=0.5, rope_theta=1e6)
FAMILIES = {
    "granite4-h-dense-rope": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(
        GRANITE, num_local_experts=0, mamba_n_groups=1, mamba_d_head="auto", position_embedding_type="rope",
        layer_types=["attention", "mamba", "mamba", "attention"])),
    "bamba": ("BambaForCausalLM", "BambaConfig", dict(
        SMALL, num_hidden_layers=4, attn_layer_indices=[2], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16)),
    "nemotron-h": ("NemotronHForCausalLM", "NemotronHConfig", dict(
        SMALL, head_dim=16, num_hidden_layers=6, layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16)),
    "nemotron-h-moe": ("NemotronHForCausalLM", "NemotronHConfig", dict(         # Nemotron 3 Nano's blocks
        SMALL, head_dim=16, num_hidden_layers=4, layers_block_type=["mamba", "moe", "attention", "moe"],
        mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2,
        topk_group=1, routed_scaling_factor=2.5)),
    "mamba2": ("Mamba2ForCausalLM", "Mamba2Config", dict(                        # no attention layer at all
        SMALL, num_hidden_layers=3, num_heads=8, head_dim=16, state_size=16, n_groups=2, expand=2)),
    "falcon-h1": ("FalconH1ForCausalLM", "FalconH1Config", FALCON_H1),            # released: no gated norm
    "falcon-h1-norm-before-gate": ("FalconH1ForCausalLM", "FalconH1Config", dict(
        FALCON_H1, mamba_rms_norm=True, mamba_norm_before_gate=True, mamba_n_groups=1)),
}
# (granitehybrid's: test_granite4_hybrid_gguf_matches_transformers)
GGUF = ("bamba", "nemotron-h", "nemotron-h-moe", "mamba2", "falcon-h1")   # bamba: as granitehybrid


@pytest.fixture(scope="module")
def granite4h(tmp_path_factory):
    root = tmp_path_factory.mktemp("granite4h")
    cfg = dict(GRANITE, num_local_experts=4, num_experts_per_tok=2)
    ref = write_widened("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", cfg, root / "hf", seed=1)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref, root


def test_granite4_hybrid_matches_transformers(granite4h):
    art, ref, _ = granite4h
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    loaded = Artifact.load(art).config
    layout = loaded.kv_cache
    # xBC: 128 inner + 2 groups x 2 x 16 state channels, 3 kept; S [4 heads, 16 state, 32 head dim]
    assert layout.owners == [1] and layout.states == [(192, 3), (4, 16, 32)] * 3
    assert layout.rewind_problem() and "state_slots" in layout.tables


def test_engine_chunks_batches_forks_and_continues_turns(granite4h):
    assert_recurrent_engine(granite4h[0])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mamba2_hybrid_matches_transformers(family, tmp_path):
    model_cls, config_cls, cfg = FAMILIES[family]
    ref = write_widened(model_cls, config_cls, cfg, tmp_path / "hf", seed=2)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS[:16], 1e-4)
    if family in GGUF:              # nemotron_h's: a kv head count and an MLP width a layer say each block's kind
        from gguf_writer import write_gguf
        path = write_gguf(tmp_path / "hf", tmp_path / f"{family}.gguf")
        art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "gguf")
        assert_prefill_and_decode_match(art, ref, IDS[:16], 1e-4)


def test_granite4_hybrid_gguf_matches_transformers(granite4h, tmp_path):
    """granitehybrid with Mamba-2 layers (head_count_kv 0), as llama.cpp's converter writes it (A as -exp(A_log), A
    and D as [heads, 1], the gated norm as [groups, width], the conv squeezed): read back into the model it came
    from; Q8_0 kept exactly, the Mamba-2 projections among the q8 matrices."""
    import torch

    from gguf_writer import write_gguf
    from kiln.models.gguf import load_gguf
    _, ref, root = granite4h
    path = write_gguf(root / "hf", tmp_path / "granite4h.gguf")
    source = load_gguf(path)
    assert source.hf_config["layer_types"] == ["mamba", "attention", "mamba", "mamba"]
    assert source.weights.unmapped == []
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    q8 = write_gguf(root / "hf", tmp_path / "granite4h-q8.gguf", default="Q8_0")
    art = kiln.compile(str(q8), target="cpu", quant="auto", output=tmp_path / "q8")
    formats = Artifact.load(art).config.quantization["tensors"]
    assert formats["model.layers.0.self_attn.in_proj.weight"] == "q8-f16scales"
    weights = load_gguf(q8).weights             # (under transformers 4's names for Granite MoE's experts and router)
    v4 = {"experts.gate_up_proj": "input_linear.weight", "experts.down_proj": "output_linear.weight",
          "router.weight": "router.layer.weight"}
    state = {k: torch.from_numpy(weights.get(next((k.replace(a, b) for a, b in v4.items() if k.endswith(a)), k))
                                 .astype(np.float32)) for k in ref.state_dict()}
    on_file = copy.deepcopy(ref)
    on_file.load_state_dict(state)
    assert_prefill_and_decode_match(art, on_file.eval(), IDS, 1e-4)


def test_mamba2_layers_geometry_is_checked():
    from kiln.models.mamba2 import NemotronHConfig
    c = NemotronHConfig.from_hf(dict(FAMILIES["nemotron-h"][2], hybrid_override_pattern="M-*-M-",
                                     layers_block_type=None, num_hidden_layers=None, time_step_limit=[0.0, 0.1]))
    assert c.block_kinds == ("mamba", "mlp", "attention", "mlp", "mamba", "mlp") and c.mamba_layers == (0, 4)
    assert c.dt_limit == (0.0, 0.1) and c.conv_channels() == 64 + 2 * 2 * 16
    with pytest.raises(ValueError, match="mamba_n_groups .3. must divide the 4 Mamba heads"):
        NemotronHConfig.from_hf(dict(FAMILIES["nemotron-h"][2], n_groups=3))
    with pytest.raises(ValueError, match="lists 3 blocks for 6 layers"):
        NemotronHConfig.from_hf(dict(FAMILIES["nemotron-h"][2], layers_block_type=["mamba", "mlp", "attention"]))
    assert c.kv_layers() == (((1, 1), (2, 16), (2, 16), (2, 16), (1, 1), (2, 16)), tuple(range(6)))


def test_falcon_h1_and_mamba2_inner_widths_are_checked():
    from kiln.models.falcon_h1 import FalconH1Config
    from kiln.models.mamba2 import Mamba2Config
    c = FalconH1Config.from_hf(FALCON_H1)
    assert c.mamba_head_dim == 16 and c.kv_layers() == (((2, 16),) * 3 + ((1, 1),) * 3, tuple(range(6)))
    with pytest.raises(ValueError, match=r"heads x head size \(6 x 32\) must be mamba_d_ssm \(96\)"):
        FalconH1Config.from_hf(dict(FALCON_H1, mamba_d_head=32))
    with pytest.raises(ValueError, match=r"heads x head size \(8 x 32\) must be expand x hidden_size \(128\)"):
        Mamba2Config.from_hf(dict(FAMILIES["mamba2"][2], head_dim=32))
