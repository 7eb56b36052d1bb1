"""GGUF files laid out the way llama.cpp's converter writes them, one per architecture kiln reads,
compiled q0f32 for the CPU: the logits equal transformers' on the Hugging Face model the GGUF was
written from (every prefill position, the last-token prefill, 5 decode steps) within 1e-4, and pass
`kiln check`.

The configs stay within what a GGUF can say (llama.cpp fixes Gemma's layer pattern and
query_pre_attn_scalar = head_dim), and each case exercises its architecture's quirk: Q/K row permutation
and Llama 3 RoPE factors (llama), the sliding window (mistral), QK norms (qwen3), YaRN as rope.scaling.*
(qwen2-yarn), +1 norms (gemma), and soft-capping (gemma2), per-layer RoPE bases with linear scaling
(gemma3), fused tensors and LongRoPE factor tensors (phi3; Phi-4's partial rotary as
rope.dimension_count), transposed Conv1D and the copied head (gpt2), the four multipliers (granite),
post-norms and whole-width q/k norms (olmo2), NoPE every 4th layer with nothing in the file saying so
(smollm3), LayerNorm biases and partial rotary (stablelm), one norm before attention and MLP side by
side and the head's bias (phi2), the plain GELU MLP's names (starcoder2), q/k/v regrouped by kind
(gpt-neox), experts stacked in 3-D ffn_*_exps tensors with the router as ffn_gate_inp (mixtral: as
llama; qwen2-moe with its shared expert; qwen3-moe), RoPE on adjacent pairs kept as stored with biases
everywhere (ernie4_5), partial adjacent-pair RoPE and fused gate/up behind post-norms (glm4), one
bias-free LayerNorm and the logit scale (cohere; per-head q/k norm weights: command-r-plus; cohere2's
window and global layers without RoPE, the layer pattern written nowhere), experts without a shared one and whole-width q/k norms (olmoe), OLMo 3
as llama.cpp's olmo2 with its window and per-layer pattern (olmo3), the same pattern with per-head q/k
norms and global layers without RoPE (exaone4), EXAONE 3's GPT-2-like names with q/k rows not permuted and Llama
3 RoPE factors (exaone), q/k/v biases and the pre-MLP norm's other name
(seed_oss), q/k norms after RoPE under their GGUF names and the NTK-alpha base (hunyuan), one kv head
and Linear weights under GPT-2's names (gpt-bigcode), q/k/v regrouped from kv groups with one norm
(falcon-7b) or ln_attn / ln_mlp stored as attn_norm_2 / attn_norm (falcon-40b), no norm tensors and
clip_qkv as clamp_kqv (olmo), experts' gate/up split from input_linear into ffn_gate_exps / ffn_up_exps
and joined back, and the shared MLP likewise (granitemoe, granitemoeshared), LayerNorm1P stored + 1 with
partial rotary (nemotron), LayerNorm with biases (jais2), q/k rows permuted with YaRN and an ungated
relu^2 MLP (arcee); DeepSeek-V3's router read from the keys llama.cpp's converters write (sigmoid
scores, the choice bias as exp_probs_b.bias, groups, a leading dense layer, the routed scale) with
shared experts and partial rotary, block_count counting a multi-token-prediction layer (glm4-moe), the
same router and per-head q/k norms (dots1), EXAONE 4.0's window pattern with it (exaone-moe), Mixtral's
expert names with whole-width q/k norms (minimax-m2), softmax scores with a choice bias and the
converter's odd shared-expert width (ernie4_5-moe), a shared MLP beside softmax experts (hunyuan-moe);
latent attention with kv_b_proj split by heads into attn_k_b / attn_v_b and read back joined, YaRN's mscale as
yarn_log_multiplier and V3's router (deepseek2-v3), V2's softmax router without q_lora (deepseek2-v2), GLM-4.7-Flash
read as V3 (deepseek2-glm4-moe-lite), no experts (deepseek2-youtu), kv_b_proj whole with RoPE on halves, LongRoPE
factor tensors and llama.cpp's fixed scales (minicpm3), Granite 4.0 without Mamba layers as the converter writes it
now (granite4: granite, its shared MLP as the dense one; granite4-moe: granitemoe) and did before (granitehybrid,
granitehybrid-moe: no RoPE, a kv head count a layer), Ministral 3 as mistral3 (YaRN's betas, its log multiplier read
as mscale_all_dim, the queries' temperature), AFMoE (Trinity: the attention gate, four norms, every 4th layer global),
Llama 4 (experts split and transposed, a shared expert, dense layers between, NoPE every 4th layer), Cohere's MoE
(each layer's kind as a pattern, the dense prefix rotating, softmax or sigmoid scores, shared experts averaged in).
"""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest

import kiln
from gguf_writer import write_gguf
from kiln.models.gguf import load_gguf
from kiln.runtime import Artifact
from test_families import CASES as HF_CASES
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
IDS = np.random.default_rng(6).integers(0, 512, size=19).tolist()
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, tie_word_embeddings=False)
FALCON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256, bos_token_id=1,
              parallel_attn=True)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=16, hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None,
             tie_word_embeddings=True)

PHIMOE_MSCALE = math.sqrt(1 + math.log(512 / 128) / math.log(128))    # Phi3MiniModel's from the context lengths


def _hf_case(case: str, **extra) -> tuple[str, str, dict]:
    """A case of tests/numerics/test_families.py, its config overridden by `extra`."""
    model_cls, config_cls, overrides = HF_CASES[case]
    return model_cls, config_cls, dict(overrides, **extra)


# case -> (transformers model class, config class, config overrides)
CASES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "llama3-rope": ("LlamaForCausalLM", "LlamaConfig", dict(rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=8.0,
        original_max_position_embeddings=1024))),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=128)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=24, tie_word_embeddings=True)),
    "qwen2-yarn": ("Qwen2ForCausalLM", "Qwen2Config", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64))),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=16, hidden_act="gelu_pytorch_tanh",
                                                       tie_word_embeddings=True)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(GEMMA, final_logit_softcapping=3.0, sliding_window=4096,
                                                         attn_logit_softcapping=2.0)),   # small: the cap bites
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        GEMMA, num_hidden_layers=6, sliding_window=4096,     # llama.cpp's pattern: layer 5 global
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(
        num_key_value_heads=4, max_position_embeddings=512, original_max_position_embeddings=128, pad_token_id=0,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0 + 0.25 * i for i in range(8)],
                             long_factor=[4.0] * 8, original_max_position_embeddings=128))),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=None,
                                                   activation_function="gelu_new")),
    "phi4-partial-rotary": ("Phi3ForCausalLM", "Phi3Config", dict(
        num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=128, pad_token_id=0,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0 + 0.25 * i for i in range(6)],
                             long_factor=[4.0] * 6, original_max_position_embeddings=128, partial_rotary_factor=0.75))),
    "granite": ("GraniteForCausalLM", "GraniteConfig", dict(embedding_multiplier=6.0, attention_multiplier=0.4,
                                                            residual_multiplier=0.3, logits_scaling=4.0)),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(pad_token_id=0)),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(num_hidden_layers=4, pad_token_id=0)),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", dict(use_qkv_bias=True, partial_rotary_factor=0.25)),
    "phi2": ("PhiForCausalLM", "PhiConfig", dict(num_key_value_heads=4, partial_rotary_factor=0.5)),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(tie_word_embeddings=True)),
    "gpt-neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(num_key_value_heads=4)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=96,
        tie_word_embeddings=True)),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=3,
                                                                moe_intermediate_size=48, norm_topk_prob=True)),
    "ernie4_5": ("Ernie4_5ForCausalLM", "Ernie4_5Config", dict(head_dim=24, use_bias=True, tie_word_embeddings=True)),
    "glm4": ("Glm4ForCausalLM", "Glm4Config", dict(head_dim=16, pad_token_id=0)),
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(logit_scale=0.3, tie_word_embeddings=True, pad_token_id=0)),
    "command-r-plus": ("CohereForCausalLM", "CohereConfig", dict(logit_scale=0.3, tie_word_embeddings=True,
                                                                 use_qk_norm=True, pad_token_id=0)),
    "cohere2": ("Cohere2ForCausalLM", "Cohere2Config", dict(num_hidden_layers=4, sliding_window=32, logit_scale=0.5,
                                                            tie_word_embeddings=True, pad_token_id=0)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    # its sliding layers by a base of their own (rope.freq_base_swa)
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", dict(num_hidden_layers=4, sliding_window=32, pad_token_id=0,
                                                      rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    "exaone": ("LlamaForCausalLM", "ExaoneConfig", dict(pad_token_id=0, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=8.0,
        original_max_position_embeddings=1024))),
    "exaone4": ("Exaone4ForCausalLM", "Exaone4Config", dict(num_hidden_layers=4, sliding_window=32, pad_token_id=0)),
    "seed_oss": ("SeedOssForCausalLM", "SeedOssConfig", dict(head_dim=24, attention_bias=True, attention_dropout=0.0,
                                                             residual_dropout=0.0)),
    "granitemoe": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=6.0, attention_multiplier=0.4,
        residual_multiplier=0.3, logits_scaling=4.0)),
    "granitemoeshared": ("GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=96)),
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", dict(attention_bias=True, mlp_bias=True, pad_token_id=0)),
    "jais2": ("Jais2ForCausalLM", "Jais2Config", dict(head_dim=16, pad_token_id=0)),
    "arcee": ("ArceeForCausalLM", "ArceeConfig", dict(pad_token_id=0, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=2.0, original_max_position_embeddings=128))),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(clip_qkv=0.5, pad_token_id=0)),
    "gpt-bigcode": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    # without multi_query: the converter still writes head_count_kv 1, attn_qkv's rows say otherwise
    "gpt-bigcode-mha": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4,
                                                                          n_positions=256, multi_query=False)),
    "falcon-7b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=True)),
    "falcon-40b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, new_decoder_architecture=True, num_kv_heads=2)),
    "hunyuan": ("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", dict(
        head_dim=16, pad_token_id=0, rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, alpha=50.0,
                                                          factor=1.0))),
    # the routers' scoring_func, as released configs write it (transformers' configs leave it out); Hunyuan's
    # converter takes one top k for every layer
    "glm4-moe": _hf_case("glm4-moe"),
    "dots1": _hf_case("dots1", scoring_func="sigmoid"),
    "exaone-moe": _hf_case("exaone-moe", scoring_func="sigmoid"),
    "minimax-m2": _hf_case("minimax-m2", scoring_func="sigmoid"),
    "ernie4_5-moe": _hf_case("ernie4_5-moe"),
    "hunyuan-moe": _hf_case("hunyuan-moe", moe_topk=[3, 3]),
    # latent attention as deepseek2 (RoPE on adjacent pairs, the only kind llama.cpp's graph runs; V2 without groups,
    # which llama.cpp would score otherwise) and minicpm3 (llama.cpp's fixed scales and pretraining context)
    "deepseek2-v3": _hf_case("deepseek-v3", scoring_func="sigmoid"),
    "deepseek2-v2": _hf_case("deepseek-v2", topk_method="greedy", n_group=1, topk_group=1, scoring_func="softmax"),
    "deepseek2-glm4-moe-lite": _hf_case("glm4-moe-lite", rope_interleave=True, scoring_func="sigmoid",
                                        mlp_layer_types=["dense", "sparse", "sparse"], first_k_dense_replace=1),
    "deepseek2-youtu": _hf_case("youtu"),
    # DeepSeek-V3.2 and GLM-5 (the indexer's tensors and top k written, read as V3 within it)
    "deepseek32": _hf_case("deepseek-v32", scoring_func="sigmoid"),
    "glm-dsa": _hf_case("glm5-dsa", scoring_func="sigmoid", first_k_dense_replace=1),
    "minicpm3": _hf_case("minicpm3", scale_emb=12.0, scale_depth=1.4, dim_model_base=256, rope_parameters=dict(
        HF_CASES["minicpm3"][2]["rope_parameters"], original_max_position_embeddings=512)),
    # Granite 4.0 without Mamba layers, as the converter writes it now (granite, granitemoe: RoPE) and did before
    # (granitehybrid: none)
    # YaRN's betas and log multiplier (as mscale_all_dim), the queries' temperature past the pretraining context
    "mistral3": _hf_case("ministral3", rope_parameters=dict(HF_CASES["ministral3"][2]["rope_parameters"],
                                                            mscale_all_dim=0.7, beta_fast=16.0)),
    # the attention gate, norms after attention and MLP, experts behind a dense layer, layer 3 global without RoPE
    "afmoe": _hf_case("afmoe", num_hidden_layers=4, global_attn_every_n_layers=4),
    "granite4": _hf_case("granite4", num_experts_per_tok=0, intermediate_size=96),
    "granite4-moe": _hf_case("granite4-moe-nope", position_embedding_type="rope"),
    "granitehybrid": _hf_case("granite4", num_experts_per_tok=0, intermediate_size=96, position_embedding_type=None),
    "granitehybrid-moe": _hf_case("granite4-moe-nope"),
    # sinks, experts split from the interleaved gate_up_proj and transposed, with biases; YaRN untruncated; the
    # SwiGLU's clamp at gpt-oss's 7, which llama.cpp's graph fixes (the file has no key for it)
    "gpt-oss": _hf_case("gpt-oss", swiglu_limit=7.0),
    # Llama 4: the experts' gate_up_proj split and down_proj transposed, a shared expert, dense layers between,
    # NoPE every 4th layer and the chunk and temperature constants llama.cpp's loader fixes (the file has no keys)
    "llama4": _hf_case("llama4", attention_chunk_size=8192, floor_scale=8192, attn_scale=0.1),
    # Cohere's MoE: softmax renormalised, the shared expert averaged in, a dense first layer (global and rotating);
    # sigmoid scores with RMSNorm and two shared experts' width, two dense layers, global and rotating (llama.cpp
    # rotates the dense prefix whatever its kind: transformers' model does so where the prefix pattern is 1)
    "cohere2moe": _hf_case("cohere2-moe"),
    # Tencent Hy V3: its own router, choice bias and shared MLP names, the dense first layer known by its tensors
    "hy_v3": _hf_case("hy-v3"),
    # Mellum: each layer's kind and the sliding layers' RoPE base; every MLP experts (llama.cpp's graph has no dense)
    "mellum": _hf_case("mellum", mlp_layer_types=["sparse"] * 3),
    # Apertus: xIELU's parameters as metadata arrays, per-head q/k norms, Llama 3 RoPE factors as rope_freqs
    "apertus": _hf_case("apertus"),
    # Mistral 4: DeepSeek's latent attention, softmax scores in groups, renormalised and scaled, its 3-D experts as
    # stored, Llama 4's query temperature past 8 positions (as the Mistral-format converter writes it)
    "mistral4": _hf_case("mistral4", norm_topk_prob=True, routed_scaling_factor=2.0),
    # Phi-3.5-MoE: LayerNorms and every bias, LongRoPE's factors with cos / sin's factor as the converter computes it
    # (its mscales, which the file does not hold), the sparsemixer at the released threshold
    "phimoe": _hf_case("phimoe", router_jitter_noise=0.01, rope_parameters=dict(
        HF_CASES["phimoe"][2]["rope_parameters"], short_mscale=PHIMOE_MSCALE, long_mscale=PHIMOE_MSCALE)),
    # Granite with sliding layers and sinks, a layer without RoPE as no_rope_layers says (rope_pattern); its MoE
    # with the experts' gate / up rows and the shared MLP's fused as stored
    "granite-swa": _hf_case("granite-swa", layer_rope_theta=[10000.0, 0, 10000.0], no_rope_layers=[1, 0, 1]),
    "granitemoe-swa": _hf_case("granitemoe-swa"),
    # MiMo-V2-Flash: a KV head count a layer and three multi-token-prediction layers counted in every array, values
    # narrower than keys and scaled, sinks on sliding layers, a RoPE base a layer kind on a third of each head, the
    # window (the file's, one short of transformers') shorter than the prompt
    "mimo2": _hf_case("mimo-v2-flash", attention_value_scale=0.5, sliding_window=8, rope_parameters={
        kind: {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.334}
        for kind, theta in (("full_attention", 5e6), ("sliding_attention", 1e4))}),
    # GLM-4-9B / ChatGLM3 as chatglm: q, k and v fused with biases (read back split), RoPE on half of each head
    "chatglm": _hf_case("glm", head_dim=16),
    # DBRX: q/k/v fused and clamped, LayerNorms without bias, every expert's w1 / v1 / w2 viewed 3-D (w2 transposed)
    "dbrx": _hf_case("dbrx"),
    "cohere2moe-sigmoid": _hf_case("cohere2-moe-sigmoid", shared_expert_combination_strategy="average",
                                   prefix_dense_sliding_window_pattern=1),
    # Qwen2-VL / Qwen3-VL / Qwen3-VL-MoE text models as their converters write them: Qwen2 / Qwen3 / Qwen3-MoE
    # tensors with M-RoPE sections (and Qwen3-VL's deepstack count), which turn a text prompt as plain RoPE does
    # (tests/numerics/test_qwen_vl.py compares kiln with transformers' VL classes themselves)
    # GLM-4.1V's text model as its converter writes it: GLM-4's tensors, q/k rows in NeoX order for M-RoPE
    "glm4v": ("Glm4ForCausalLM", "Glm4Config", dict(head_dim=16, pad_token_id=0, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1]))),
    "qwen2vl": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "qwen3vl": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=24, tie_word_embeddings=True)),
    "qwen3vlmoe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=48, norm_topk_prob=True)),
}
# cases the converter writes as another HF family computes them, and what kiln reads them as
READ_AS = {"deepseek2-glm4-moe-lite": "deepseek_v3", "granite4": "granite", "granite4-moe": "granitemoeshared"}
WRITTEN_AS = {"granitehybrid": "granitehybrid", "granitehybrid-moe": "granitehybrid",    # by an older converter
              "qwen2vl": "qwen2vl", "qwen3vl": "qwen3vl", "qwen3vlmoe": "qwen3vlmoe"}      # a VL model's text


def write_hf(case: str, dest, seed: int = 0):
    """The case's transformers model with widened random weights, saved with a tokenizer."""
    model_cls, config_cls, overrides = CASES[case]
    own = case in ("gpt2", "dbrx") or case.startswith(("gpt-bigcode", "falcon"))   # configs that take no SMALL fields
    cfg = dict(vocab_size=512, eos_token_id=2, **overrides) if own else dict(SMALL, **overrides)
    return write_widened(model_cls, config_cls, cfg, dest, seed)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_family_matches_transformers(case, tmp_path):
    ref = write_hf(case, tmp_path / "hf")
    path = write_gguf(tmp_path / "hf", tmp_path / f"{case}.gguf", arch=WRITTEN_AS.get(case))
    source = load_gguf(path)
    assert source.hf_config["model_type"] == READ_AS.get(case, ref.config.model_type)
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)        # golden: transformers on the config and tensors kiln read from the GGUF
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_bailingmoe2_reads_as_the_model_it_came_from(tmp_path):
    """Ling 2.0's GGUF (bailingmoe2, as BailingMoeV2Model writes it: q/k/v fused, RoPE on half of each head as
    rope.dimension_count, the shared expert's width, the expert bias as exp_probs_b.bias) from a checkpoint in
    Ling's own format (test_families' bailing-moe-v2: transformers' Sarvam MoE computes it) gives its logits."""
    from test_families import write_family
    ref = write_family("bailing-moe-v2", tmp_path / "hf", seed=2)
    path = write_gguf(tmp_path / "hf", tmp_path / "ling.gguf")
    config = load_gguf(path).hf_config
    assert (config["model_type"], config["partial_rotary_factor"]) == ("bailing_moe_v2", 0.5)
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_quantized_experts_are_kept_as_stored(tmp_path):
    """A Qwen3-MoE GGUF whose expert gate and up tensors are Q4_1 (3-D, 8 experts): --quant auto keeps their
    codes, scales and mins exactly (q4m with float16 scales), the expert matmul reads each token's experts'
    rows from them, and the logits equal transformers' on the tensors as kiln reads them."""
    write_hf("qwen3-moe", tmp_path / "hf")
    path = write_gguf(tmp_path / "hf", tmp_path / "m.gguf", types={"ffn_gate_exps": "Q4_1", "ffn_up_exps": "Q4_1"})
    art = kiln.compile(str(path), target="cpu", quant="auto", output=tmp_path / "art")
    formats = Artifact.load(art).config.quantization["formats"]
    assert formats["q4m-f16scales"]["weights"] == 2                      # each layer's experts' gate/up rows
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    assert max(p.max_logit_error for p in report.prompts) < TOL, report.table()


def test_a_layer_pattern_of_another_length_and_unjoinable_halves_are_refused(tmp_path):
    """An EXAONE 4 GGUF whose sliding_window_pattern lists 3 layers for 4, and a Granite MoE GGUF whose
    ffn_gate_exps and ffn_up_exps (one input_linear, split by the converter) differ in type: each refused in
    one line naming the tensor or key and the fix, before anything is compiled."""
    import json

    from kiln.models.source import ModelLoadError
    write_hf("exaone4", tmp_path / "exaone4")
    cfg_path = tmp_path / "exaone4" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, layer_types=cfg["layer_types"][:3])))
    with pytest.raises(ModelLoadError, match="sliding_window_pattern lists 3 layers for 4; re-convert"):
        load_gguf(write_gguf(tmp_path / "exaone4", tmp_path / "exaone4.gguf"))
    write_hf("granitemoe", tmp_path / "granitemoe")
    path = write_gguf(tmp_path / "granitemoe", tmp_path / "granitemoe.gguf", types={"ffn_gate_exps": "Q8_0"})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_gate_exps\.weight \(Q8_0\) needs blk\.0\.ffn_up_exps of "
                                             r"the same type .* \(found: F32\); re-quantize"):
        load_gguf(path)


@pytest.mark.parametrize("case, mlp", [("glm4-moe", "ffn_gate_exps"), ("exaone4", "ffn_gate")])
def test_multi_token_prediction_layer_is_left_unread(case, mlp, tmp_path):
    """A GLM-4.5 (or EXAONE 4.5) checkpoint's multi-token-prediction layer (model.layers.<n>: a decoder layer with
    eh_proj, enorm, hnorm and shared_head.norm) converted after the last as blk.<n> (block_count n + 1,
    nextn_predict_layers 1; EXAONE 4.5's window pattern lists the n layers): kiln reads n layers and lists every
    blk.<n> tensor as skipped."""
    from safetensors.numpy import load_file, save_file
    ref = write_hf(case, tmp_path / "hf")
    hf_path, config = tmp_path / "hf" / "model.safetensors", tmp_path / "hf" / "config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), num_nextn_predict_layers=1)))
    hf = load_file(str(hf_path))
    n, width = ref.config.num_hidden_layers, SMALL["hidden_size"]
    mtp = {k.replace(f".{n - 1}.", f".{n}.", 1): v for k, v in hf.items() if k.startswith(f"model.layers.{n - 1}.")}
    mtp.update({f"model.layers.{n}.eh_proj.weight": np.zeros((width, 2 * width), np.float32),
                **{f"model.layers.{n}.{norm}.weight": np.ones(width, np.float32)
                   for norm in ("enorm", "hnorm", "shared_head.norm")}})
    save_file({**hf, **mtp}, str(hf_path), metadata={"format": "pt"})
    path = write_gguf(tmp_path / "hf", tmp_path / "m.gguf")
    source = load_gguf(path)
    assert source.hf_config["num_hidden_layers"] == n
    assert not [name for name in source.weights.names() if name.startswith(f"model.layers.{n}.")]
    mtp_tensors = {t.name for t in gguf.GGUFReader(path).tensors if t.name.startswith(f"blk.{n}.")}
    assert {f"blk.{n}.nextn.eh_proj.weight", f"blk.{n}.{mlp}.weight"} <= mtp_tensors
    assert mtp_tensors == set(source.weights.unmapped)


@pytest.mark.parametrize("case, change, refusal", [
    ("dots1", dict(scoring_func="softmax"), r"expert_gating_func is 1, but the Hugging Face model scores experts "
                                            r"by sigmoid only \(2\); re-convert"),
    ("hunyuan-moe", dict(n_group=2, topk_group=1), r"chooses experts in 2 groups \(expert_group_count\), which its "
                                                  r"Hugging Face model does not"),
    ("deepseek2-v2", dict(norm_topk_prob=True, n_group=2), r"routes by softmax with expert_weights_norm, "
                                                           r"expert_group_count, which llama.cpp runs as DeepSeek-V2"),
    ("cohere2moe", dict(norm_topk_prob=False), r"\(gating 1, weights norm False, .* is not a Cohere MoE"),
])
def test_a_router_the_hf_model_cannot_run_is_refused(case, change, refusal, tmp_path):
    """A GGUF whose router llama.cpp would run otherwise than the Hugging Face family can (softmax scores for
    dots.llm1's sigmoid router; expert groups for Hunyuan MoE, which has none; DeepSeek-V2's softmax renormalised
    and in groups scored by their two best experts; Cohere's MoE scored by a softmax llama.cpp does not renormalise,
    where transformers' always does) is refused on load, naming the key and the fix."""
    _assert_refused(case, change, refusal, tmp_path)


@pytest.mark.parametrize("case, change, arch, refusal", [
    ("granite4", dict(layer_types=["attention", "mamba"]), "granite",
     r"this granite GGUF has Mamba layers \(1: attention.head_count_kv 0\), which its architecture does not run"),
    ("deepseek2-v3", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                               original_max_position_embeddings=64)), None,
     r"scales RoPE by yarn without deepseek2.rope.scaling.yarn_log_multiplier"),
    ("afmoe", dict(scoring_func="softmax"), None, r"afmoe GGUF \(gating 1, .*not the sigmoid-routed"),
    ("llama4", dict(layer_types=["full_attention"] * 4), None, r"sets its own attention pattern \(attention.sliding"),
    ("hy_v3", dict(route_norm=False), None, r"does not renormalise its experts' weights \(expert_weights_norm\)"),
])
def test_what_no_hf_model_computes_as_llama_cpp_is_refused(case, change, arch, refusal, tmp_path):
    """A granite GGUF that says a layer is Mamba (head_count_kv 0 there: only granitehybrid has them), a
    DeepSeek GGUF with YaRN but no yarn_log_multiplier (llama.cpp then scales cos / sin and the softmax both) and an
    AFMoE routed by softmax (transformers' model has only sigmoid scores), a Llama 4 without chunks (MobileLLM's:
    llama.cpp's graph then rotates every layer but the last) and a Hy V3 whose weights are not renormalised
    (transformers' always are) are refused on load, naming the key and
    the fix."""
    _assert_refused(case, change, refusal, tmp_path, arch)


def _assert_refused(case: str, change: dict, refusal: str, tmp_path, arch: str | None = None) -> None:
    """write_hf's `case` with its config.json changed, as a GGUF (of `arch`): refused on load, matching `refusal`."""
    import json

    from kiln.models.source import ModelLoadError
    write_hf(case, tmp_path / "hf")
    cfg_path = tmp_path / "hf" / "config.json"
    cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), **change)))
    with pytest.raises(ModelLoadError, match=refusal):
        load_gguf(write_gguf(tmp_path / "hf", tmp_path / "m.gguf", arch=arch))
