"""NVIDIA's Nemotron-NAS (DeciLM) layers against a PyTorch reference built from transformers' own Llama modules
(the checkpoints' modeling_decilm.py is remote code, not in transformers): per layer its KV heads, a Linear in
attention's or the MLP's place, no attention or no MLP at all, the MLP's width from ffn_mult; Llama 3's RoPE."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import kiln
from kiln.runtime import Artifact

from tiny_models import assert_prefill_and_decode_match, widen, write_tokenizer

pytestmark = pytest.mark.numerics

QUICK_LLVM = True
TOL = 1e-4
IDS = np.random.default_rng(11).integers(0, 512, size=17).tolist()


def block(heads_in_group=None, linear_attention=False, no_attention=False, ffn_mult=None, linear_mlp=False,
          no_mlp=False) -> dict:
    return {"attention": {"n_heads_in_group": heads_in_group, "no_op": no_attention,
                          "replace_with_linear": linear_attention, "window_length": None, "num_sink_tokens": None,
                          "sparsify": None, "unshifted_sink": False, "use_prefill_window_in_sink_attention": False},
            "ffn": {"ffn_mult": ffn_mult, "no_op": no_mlp, "replace_with_linear": linear_mlp, "sparsify": None}}


BLOCKS = [block(2, ffn_mult=1.5),                   # 2 KV heads, a 256-wide MLP
          block(4, no_mlp=True),                    # 1 KV head, no MLP
          block(no_attention=True, ffn_mult=13.0),  # no attention, a 768-wide MLP
          block(linear_attention=True, linear_mlp=True),
          block(1, ffn_mult=1.0)]                   # 4 KV heads
CONFIG = dict(model_type="nemotron-nas", architectures=["DeciLMForCausalLM"], vocab_size=512, hidden_size=64,
              num_hidden_layers=len(BLOCKS), num_attention_heads=4, rms_norm_eps=1e-5, hidden_act="silu",
              max_position_embeddings=256, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=1,
              eos_token_id=2, block_configs=BLOCKS,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64})


def reference(config: dict):
    """DeciLMForCausalLM as modeling_decilm.py builds it, from transformers' LlamaAttention, LlamaMLP, LlamaRMSNorm
    and LlamaRotaryEmbedding (each layer's own LlamaConfig: its KV heads, its MLP width); random weights widened so
    a 1e-4 tolerance bites."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as ml

    base = LlamaConfig(**{k: v for k, v in config.items() if k not in ("block_configs", "architectures", "model_type")},
                       num_key_value_heads=4, intermediate_size=64, attn_implementation="eager")
    hidden = base.hidden_size

    class Linear(torch.nn.Module):
        def __init__(self, name: str):
            super().__init__()
            setattr(self, name, torch.nn.Linear(hidden, hidden, bias=False))
            self.name = name

        def forward(self, x, *_):
            return getattr(self, self.name)(x)

    class Layer(torch.nn.Module):
        def __init__(self, i: int, b: dict):
            super().__init__()
            a, f = b["attention"], b["ffn"]
            if not a["no_op"]:
                self.input_layernorm = ml.LlamaRMSNorm(hidden, base.rms_norm_eps)
                if a["replace_with_linear"]:
                    self.self_attn = Linear("linear_attn")
                else:
                    own = copy.copy(base)
                    own.num_key_value_heads = base.num_attention_heads // a["n_heads_in_group"]
                    self.self_attn = ml.LlamaAttention(own, i)
            if not f["no_op"]:
                self.post_attention_layernorm = ml.LlamaRMSNorm(hidden, base.rms_norm_eps)
                if f["replace_with_linear"]:
                    self.mlp = Linear("linear_mlp")
                else:
                    own = copy.copy(base)
                    own.intermediate_size = -(-int(2 * f["ffn_mult"] * hidden / 3) // 256) * 256   # modeling_decilm's
                    self.mlp = ml.LlamaMLP(own)

        def forward(self, x, rope, mask):
            if hasattr(self, "self_attn"):
                normed = self.input_layernorm(x)
                x = x + (self.self_attn(normed, rope, mask)[0] if isinstance(self.self_attn, ml.LlamaAttention)
                         else self.self_attn(normed))
            if hasattr(self, "mlp"):
                x = x + self.mlp(self.post_attention_layernorm(x))
            return x

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(base.vocab_size, hidden)
            self.layers = torch.nn.ModuleList([Layer(i, b) for i, b in enumerate(config["block_configs"])])
            self.norm = ml.LlamaRMSNorm(hidden, base.rms_norm_eps)
            self.rotary = ml.LlamaRotaryEmbedding(base)

    class ForCausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = torch.nn.Linear(hidden, base.vocab_size, bias=False)

        def forward(self, ids):
            x = self.model.embed_tokens(ids)
            s = ids.shape[1]
            rope = self.model.rotary(x, torch.arange(s)[None])
            mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
            for layer in self.model.layers:
                x = layer(x, rope, mask)
            return type("Output", (), {"logits": self.lm_head(self.model.norm(x))})

    torch.manual_seed(0)
    model = ForCausalLM()
    widen(model)
    return model.eval()


def test_mlp_widths_follow_ffn_mult():
    from kiln.models.deci import ffn_width
    # Llama-3.3-Nemotron-Super-49B: hidden 8192; ffn_mult 5.25 is Llama 3 70B's 28,672, 2.625 half of it
    assert (ffn_width(5.25, 8192), ffn_width(2.625, 8192), ffn_width(1.5, 64), ffn_width(13.0, 64)) == \
        (28672, 14336, 256, 768)


def write_deci(dest, config: dict = CONFIG, tokenizer=write_tokenizer):
    from safetensors.torch import save_file
    model = reference(config)
    dest.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if "rotary" not in k},
              str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config))
    tokenizer(dest, config["vocab_size"])
    return model


# What llama.cpp's converter takes (tests/numerics/test_gguf_converter.py): no Linear in an MLP's place (it has no
# tensor name for one), a SentencePiece-shaped tokenizer (its deci reads one unless the vocabulary is Llama 3's),
# no rope_scaling (transformers 5 cannot read this config's Llama 3 scaling without its remote code, which the
# converter's tokenizer load tries).
CONVERTER_BLOCKS = BLOCKS[:3] + [block(linear_attention=True, ffn_mult=1.0)] + BLOCKS[4:]
CONVERTER_CONFIG = {k: v for k, v in dict(CONFIG, block_configs=CONVERTER_BLOCKS).items() if k != "rope_scaling"}


def write_for_the_converter(dest):
    from tiny_models import write_gemma_tokenizer
    write_deci(dest, CONVERTER_CONFIG, write_gemma_tokenizer)
    path = dest / "tokenizer_config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), tokenizer_class="PreTrainedTokenizerFast")))


def test_nemotron_nas_layers_match_their_reference(tmp_path):
    ref = write_deci(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    kv = Artifact.load(art).config.kv_cache
    assert kv.owner == "kiln" and [tuple(s) for s in kv.layer_kv] == [(2, 16), (1, 16), (1, 1), (1, 1), (4, 16)]


@pytest.mark.parametrize("change, message", [
    (dict(block_configs=BLOCKS[:2]), r"block_configs must list one entry a layer \(5\)"),
    (dict(block_configs=[block(3, ffn_mult=1.0)] + BLOCKS[1:]), r"n_heads_in_group 3 must divide"),
    (dict(block_configs=[block(2)] + BLOCKS[1:]), r"block_configs\[0\]\.ffn\.ffn_mult None must be a positive"),
    (dict(block_configs=[dict(block(2, ffn_mult=1.0), attention=dict(block(2)["attention"], window_length=64))]
          + BLOCKS[1:]), r"block_configs\[0\]\.attention sets window_length 64"),
    (dict(hidden_act="relu"), "hidden_act 'relu'"),
    (dict(block_configs=None), r"block_configs must list one entry a layer"),
])
def test_nemotron_nas_configs_kiln_cannot_run_are_refused_by_name(change, message):
    from kiln.models.deci import DeciConfig
    config = {k: v for k, v in dict(CONFIG, **change).items()}
    with pytest.raises(ValueError, match=message):
        DeciConfig.from_hf(config)


def test_decilm_7b_reads_its_kv_heads_by_layer_and_tvm_cache_is_refused():
    """DeciLM-7B's config (deci: num_key_value_heads_per_layer, dynamic NTK RoPE unscaled within the context); a model
    whose layers differ in KV heads cannot run over TVM's paged KV cache, and says so by name."""
    from kiln.models import registry
    from kiln.models.deci import DeciConfig, DeciForCausalLM
    config = DeciConfig.from_hf(dict(model_type="deci", vocab_size=512, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=3, num_attention_heads=4,
                                     num_key_value_heads_per_layer=[4, 2, 1], max_position_embeddings=256,
                                     rope_scaling={"type": "dynamic", "factor": 2.0}))
    assert [config.layer_kv_heads(i) for i in range(3)] == [4, 2, 1] and config.rope_scaling is None
    assert any("dynamic NTK" in n for n in config.notes)
    assert {b.intermediate_size for b in config.blocks} == {96}
    assert "differ in KV head size" in DeciForCausalLM(config).tvm_cache_problem()
    assert registry.find_architecture({"architectures": ["DeciLMForCausalLM"], "model_type": "deci"}).name == "deci"
