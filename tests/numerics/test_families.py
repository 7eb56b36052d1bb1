"""Every family in models/ against transformers: tiny random-init models compiled q0f32 for the CPU give
transformers' logits (every prefill position, the last-token prefill, 5 decode steps) within 1e-4, and
pass `kiln check` against the golden logits the compile stored.

    qwen3    QK norm, explicit head_dim (tied and untied); YaRN context extension (RoPE in the graph)
    gemma    (1+w) RMSNorm, tanh-GELU gating, embedding scale, head_dim apart from hidden / heads, MQA
    gemma2   (1+w) RMSNorm, tanh-GELU gating, sandwich norms, embedding scale, final-logit and
             attention soft-capping, query_pre_attn_scalar
    gemma3   the above with QK norm and per-layer RoPE (local base on sliding layers, linear
             scaling on global ones: RoPE in the graph)
    phi3     fused qkv and gate_up checkpoints, LongRoPE (short factors, cos/sin factor), MHA
    gpt2     LayerNorm, learned positions, plain GELU MLP, biases, Conv1D weights transposed
    phi4     Phi-3 with partial rotary (3/4 of each head) under LongRoPE (RoPE in the graph)
    granite  embedding, attention, residual and logit multipliers
    olmo2    norms after attention and MLP only, q/k RMSNorm over all heads at once
    smollm3  a layer without RoPE (NoPE) among rotating ones (RoPE in the graph), tied head
    stablelm LayerNorm with biases, q/k/v biases, partial rotary (a quarter of each head, in the KV cache)
    starcoder2  LayerNorm, biases, plain GELU MLP, sliding window on every layer (prompt past it)
    phi2     attention and MLP side by side behind one LayerNorm, a biased head, partial rotary
    gpt-neox attention and MLP side by side behind their own LayerNorms (or one after the other),
             q/k/v fused per head (persimmon: one after the other, q and k LayerNormed a head, relu^2)
    ernie4_5 RoPE on adjacent pairs of dims (q/k rows reordered at load), biases on every projection
    glm      adjacent-pair RoPE on the first half of each head, q/k/v biases, gate/up stored fused
    glm4     the above with norms on the attention and MLP outputs
    helium   adjacent-pair RoPE, q/k/v and MLP biases (none on o)
    nemotron LayerNorm with a bias and 1+w, relu^2 MLP not gated, partial rotary, biases
    arcee    relu^2 MLP not gated, YaRN
    cohere   attention and MLP side by side behind one bias-free LayerNorm, scaled logits, adjacent-pair RoPE
             (command-r-plus: q and k LayerNormed per head, each head its own weight, before that RoPE)
    cohere2  the above with sliding-window layers and global ones without RoPE (past the window:
             test_families_sliding.py); cohere2-moe with experts (softmax over the top logits, the shared MLP
             averaged in; or sigmoid weights normalised, summed, RMSNorm) after dense layers of their own width
             and sliding pattern (rotating where global, with pattern 1)
    mixtral, qwen2-moe, qwen3-moe, olmoe  sparse mixtures of experts: top-k routing (renormalised or
             not), a shared expert behind a sigmoid gate and a dense layer among sparse ones (qwen2-moe)
    dbrx     q/k/v fused and clamped, LayerNorm without bias, every layer's experts as w1 / v1 / w2 tensors
             (the down projections transposed), a softmax router renormalised
    mellum   Qwen3-MoE with a dense first layer by mlp_layer_types and sliding layers with a RoPE base of
             their own (RoPE in the graph; past the window: test_families_sliding.py)
    internlm3  q/k/v/o and MLP biases under InternLM 3's own config.json names
    seed_oss q/k/v biases without o's
    exaone   EXAONE 3.x: Llama under GPT-2-like tensor names, LG's config.json names and Llama 3 RoPE
             scaling (exaone-tied: as transformers 5 saves it, model_type exaone over LlamaForCausalLM)
    ministral, cwm  sliding-window layers among full ones, RoPE by the cache (past the window:
             test_families_sliding.py)
    olmo3    OLMo 2 with sliding layers and YaRN on the full ones only (RoPE in the graph)
    exaone4  OLMo 2's norms, per-head q/k norms, sliding layers with RoPE and a global one without
    vaultgemma  Gemma 2 without the output norms
    hyperclovax Granite's multipliers (the logits multiplied), norms on the attention and MLP outputs too
    granitemoe, granitemoeshared  experts stored as 3-D input/output_linear tensors, the multipliers, an
             ungated shared MLP (shared)
    flex_olmo   OLMoE with OLMo 2's norms
    jais2    LayerNorm with biases, relu^2 MLP not gated, biases
    hunyuan  q/k norms after RoPE (RoPE in the graph), NTK-alpha RoPE base
    gpt-bigcode  GPT-2 as Linear weights with one key/value head (and without: c_attn per head)
    falcon   parallel attention and MLP behind one LayerNorm with one kv head (7B), behind ln_attn /
             ln_mlp with kv groups (40B: q/k/v fused per group), or sequential with biases and per-head q/k/v
    opt      learned positions looked up at position + 2, ReLU MLP, LayerNorm, biases (biogpt: GELU, scaled
             embeddings, its own names)
    gptj     one LayerNorm before attention and MLP side by side, partial adjacent-pair RoPE, a biased head
             (codegen: q, k and v in one qkv_proj of 4 shards)
    gpt-neo  unscaled attention scores, learned positions, a local (sliding) layer after a global one
             (past the window: test_families_sliding.py)
    olmo     LayerNorm without weight or bias, q/k/v clamped (clip_qkv)
    ministral3  YaRN, and queries scaled by 1 + beta * log(1 + floor(position / original context))
    apertus  per-head q/k norms, an ungated MLP with xIELU's learned per-layer parameters, Llama 3 RoPE
    nanochat RMSNorm without weight everywhere (the embeddings too), q/k norms after RoPE, relu^2 MLP,
             soft-capped logits
    glm4-moe, solar-open, dots1, minimax-m2, exaone-moe  DeepSeek-V3's router: sigmoid scores, a choice
             bias, the best groups of experts, scaled weights; ungated shared experts, dense first layers;
             partial rotary and q/k biases (GLM-4.5), q/k norms per head or over all heads (MiniMax-M2),
             a global layer without RoPE among sliding ones with it (EXAONE MoE); Hy V3 (hy-v3): the router
             without groups under its own names, per-head q/k norms, the first layer dense; Sarvam MoE and
             Param2 MoE: Bailing's names with q/k/v fused (and biased: param2moe), 2 shared experts (param2moe);
             MiniCPM5-MoE: the attention output gated per head (sigmoid) by q_proj's second half; AFMoE: the
             gate its own Linear, EXAONE 4.0's layers, norms around attention and MLP, muP's embedding scale;
             Laguna: a query head count a layer, YaRN on half of each head on full layers and plain RoPE on all of it on
             sliding ones, a softplus gate a head (laguna-m1: a value dim), a capped router;
             Kolibri 1: experts chosen by logits plus the bias, weighted by their sigmoid; Beam: sliding layers with
             RoPE and a full one without, its queries scaled by position, the output gated with a bias a head,
             depth-scaled residual adds; Ergo: residual gates, relu^2 experts each normed by its own weight, its
             serving layout; aria-text: softmax experts stored as x @ W beside ungated shared ones; Flint: attention
             sinks on every layer (the KV cache kiln owns), sliding layers with RoPE (past their window) among full
             ones without; MiMo-V2-Flash: sinks and twice the KV heads on its sliding layers, values narrower than
             keys and scaled, RoPE on a third of each head with a base a layer kind; gpt-oss: sinks, alternating
             sliding layers, YaRN, experts with biases, interleaved gate/up and a clamped SwiGLU, a biased router;
             granite-swa, granitemoe-swa: Granite's multipliers with sinks, sliding layers and a RoPE base per layer
             (none on one)
    deepseek-v3, deepseek-v2, glm4-moe-lite, youtu  multi-head latent attention (expanded: values padded
             to the key's dims, RoPE on interleaved pairs or halves, YaRN with its softmax mscale); DeepSeek-V3's
             router, V2's softmax one with groups scored by their best expert, dense layers by list; youtu dense;
             sarvam-mla DeepSeek-V3 with Sarvam's defaults, and its original config.json (num_experts,
             rope_scaling deepseek_yarn, vLLM's head_dim)
    longcat-flash  two latent-attention blocks and dense MLPs a layer, the experts a shortcut beside them with
             zero-computation (identity) experts, a softmax router choosing with a bias, q and the KV latent scaled
    minicpm3 the same dense, RoPE on halves under LongRoPE, MiniCPM's embedding, residual and logit scales
    mistral4 latent attention with Llama 4's query temperature (past the pretraining context at 8),
             softmax experts from the best groups without a choice bias
    phimoe   Phi-3.5-MoE: LayerNorm, biases (the head's too), LongRoPE with its short mscale, the sparsemixer
             router (a wide jitter_eps: several logits near the best)
    llama4   RoPE on adjacent pairs with Llama 3 scaling in the graph, then q/k RMS-normed without weight; a
             NoPE layer with its query temperature; input-scaled top-1 experts beside a shared one, every
             other layer; the context capped at the attention chunk
    granite4 Granite 4.0 without Mamba layers: the shared MLP as the dense one, RoPE; with experts and
             without RoPE (position_embedding_type unset)
    ernie4_5-moe  softmax scores with a choice bias (moe_statics), a dense first layer, adjacent-pair RoPE
    hunyuan-moe   a shared MLP beside the experts, each layer's own top-k, q/k norms after RoPE
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.models import build, load
from kiln.runtime import Artifact
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
IDS = np.random.default_rng(5).integers(0, 512, size=19).tolist()
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None)
FALCON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256, bos_token_id=1)
GRANITE = dict(embedding_multiplier=6.0, attention_multiplier=0.4, residual_multiplier=0.3, logits_scaling=4.0)
# rms_norm_eps far from 1e-6: the latent norms keep their own 1e-6 (every MLA family's code), which this bites
MLA = dict(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-2,
           num_key_value_heads=4, pad_token_id=0)
ROUTED = dict(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
              n_shared_experts=1, first_k_dense_replace=1)     # DeepSeek-V3's router: sigmoid, a choice bias, groups
LONGROPE = dict(rope_type="longrope", short_factor=[1.0 + 0.25 * i for i in range(8)],
                long_factor=[4.0] * 8, original_max_position_embeddings=128)

# case -> (transformers model class, config class, config overrides)
CASES = {
    "qwen3-tied": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=24, tie_word_embeddings=True)),
    "qwen3-untied": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=24, tie_word_embeddings=False)),
    "qwen3-yarn": ("Qwen3ForCausalLM", "Qwen3Config", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64))),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=24, hidden_act="gelu_pytorch_tanh",
                                                       num_key_value_heads=1)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(GEMMA, final_logit_softcapping=3.0, sliding_window=4096,
                                                         attn_logit_softcapping=2.0)),   # small: the cap bites
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        GEMMA, num_hidden_layers=3, sliding_window=4096,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(num_key_value_heads=4, max_position_embeddings=512,
                                                     original_max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0,
                                                     rope_parameters=dict(LONGROPE, rope_theta=10000.0))),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=None,
                                                   activation_function="gelu_new")),
    "phi4-partial-rotary": ("Phi3ForCausalLM", "Phi3Config", dict(
        max_position_embeddings=512, original_max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=0,
        rope_parameters=dict(LONGROPE, short_factor=LONGROPE["short_factor"][:6], long_factor=[4.0] * 6,
                             rope_theta=10000.0, partial_rotary_factor=0.75))),
    "granite": ("GraniteForCausalLM", "GraniteConfig", GRANITE),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", {}),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(num_hidden_layers=4, pad_token_id=0)),  # layer 3: no RoPE
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", dict(use_qkv_bias=True, partial_rotary_factor=0.25)),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(sliding_window=20, max_position_embeddings=256)),
    "phi2": ("PhiForCausalLM", "PhiConfig", dict(num_key_value_heads=4, partial_rotary_factor=0.5)),
    # Persimmon: NeoX's fused q/k/v one after the other, q and k LayerNormed a head (weight and bias), relu^2
    "persimmon": ("PersimmonForCausalLM", "PersimmonConfig", dict(num_key_value_heads=4, bos_token_id=1)),
    "gpt-neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(num_key_value_heads=4, hidden_act="gelu")),
    "gpt-neox-sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(num_key_value_heads=4,
                                                                      use_parallel_residual=False)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=96, mlp_only_layers=[1], tie_word_embeddings=True)),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=3,
                                                                moe_intermediate_size=48, norm_topk_prob=True)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    # q/k/v fused and clamped, LayerNorm without bias, w1 / v1 / w2 expert tensors, kv groups
    "dbrx": ("DbrxForCausalLM", "DbrxConfig", dict(
        d_model=64, n_heads=4, n_layers=2, max_seq_len=256, pad_token_id=0, bos_token_id=1,
        attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=10000.0),
        ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2))),
    # a dense layer, then sparse ones; sliding layers with a RoPE base of their own (past the window:
    # test_families_sliding.py)
    "mellum": ("MellumForCausalLM", "MellumConfig", dict(
        head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
        norm_topk_prob=True, sliding_window=64,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=0, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "ernie4_5": ("Ernie4_5ForCausalLM", "Ernie4_5Config", dict(head_dim=24, use_bias=True, tie_word_embeddings=True)),
    "glm": ("GlmForCausalLM", "GlmConfig", dict(pad_token_id=0)),
    "glm4": ("Glm4ForCausalLM", "Glm4Config", dict(pad_token_id=0, tie_word_embeddings=False)),
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(logit_scale=0.3, attention_bias=True, pad_token_id=0)),
    "command-r-plus": ("CohereForCausalLM", "CohereConfig", dict(logit_scale=0.3, use_qk_norm=True, pad_token_id=0)),
    "cohere2": ("Cohere2ForCausalLM", "Cohere2Config", dict(num_hidden_layers=4, sliding_window=32, logit_scale=0.5,
                                                            pad_token_id=0)),     # layer 3 global, no RoPE
    # Cohere's MoE: a dense first layer (global, rotating), softmax over the top 2 logits, the shared expert averaged
    # in; then sigmoid weights normalised, summed with 2 shared experts' width, RMSNorm, the dense layer with the
    # sliding pattern of its own (no RoPE where global)
    "cohere2-moe": ("Cohere2MoeForCausalLM", "Cohere2MoeConfig", dict(
        num_hidden_layers=5, sliding_window=20, logit_scale=0.5, pad_token_id=0, num_experts=8, num_experts_per_tok=2,
        intermediate_size=48, num_shared_experts=1, first_k_dense_replace=1, prefix_dense_intermediate_size=96)),
    "cohere2-moe-sigmoid": ("Cohere2MoeForCausalLM", "Cohere2MoeConfig", dict(
        num_hidden_layers=4, sliding_window=20, logit_scale=0.5, pad_token_id=0, num_experts=8, num_experts_per_tok=3,
        intermediate_size=48, num_shared_experts=2, shared_expert_combination_strategy="sum",
        expert_selection_fn="sigmoid", rms_norm_eps=1e-5, first_k_dense_replace=2, prefix_dense_intermediate_size=64,
        prefix_dense_sliding_window_pattern=2)),
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", dict(attention_bias=True, mlp_bias=True, pad_token_id=0)),
    "arcee": ("ArceeForCausalLM", "ArceeConfig", dict(pad_token_id=0, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=2.0, original_max_position_embeddings=128))),
    "helium": ("HeliumForCausalLM", "HeliumConfig", dict(head_dim=16, attention_bias=True, mlp_bias=True,
                                                          pad_token_id=0)),
    # InternLM 3's own config.json names (qkv_bias, bias) and architecture, written over transformers' (RENAMED)
    "internlm3": ("LlamaForCausalLM", "InternLM3Config", dict(head_dim=24, attention_bias=True, mlp_bias=True)),
    # EXAONE 3.5's config.json (RENAMED); transformers runs and saves it as its Llama under EXAONE's tensor names
    "exaone": ("LlamaForCausalLM", "ExaoneConfig", dict(pad_token_id=0, bos_token_id=1, rope_parameters=dict(
        rope_type="llama3", rope_theta=1e6, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
    "exaone-tied": ("LlamaForCausalLM", "ExaoneConfig", dict(pad_token_id=0, bos_token_id=1, tie_word_embeddings=True)),
    "seed_oss": ("SeedOssForCausalLM", "SeedOssConfig", dict(head_dim=24, attention_bias=True, attention_out_bias=False,
                                                             attention_dropout=0.0, residual_dropout=0.0)),
    "ministral": ("MinistralForCausalLM", "MinistralConfig", dict(head_dim=16, sliding_window=32,
                                                                  layer_types=["sliding_attention", "full_attention"])),
    "cwm": ("CwmForCausalLM", "CwmConfig", dict(head_dim=16, num_hidden_layers=4, sliding_window=32, pad_token_id=0)),
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", dict(num_hidden_layers=4, sliding_window=32, pad_token_id=0,
                                                      rope_parameters={
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        "full_attention": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                               original_max_position_embeddings=64)})),
    "exaone4": ("Exaone4ForCausalLM", "Exaone4Config", dict(num_hidden_layers=4, sliding_window=32, pad_token_id=0)),
    "vaultgemma": ("VaultGemmaForCausalLM", "VaultGemmaConfig", dict(GEMMA, attn_logit_softcapping=2.0,
                                                                     final_logit_softcapping=3.0, sliding_window=4096)),
    "hyperclovax": ("HyperCLOVAXForCausalLM", "HyperCLOVAXConfig", dict(
        head_dim=16, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=0.7, pad_token_id=0)),
    "granitemoe": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=6.0, attention_multiplier=0.4,
        residual_multiplier=0.3, logits_scaling=4.0, pad_token_id=0)),
    "granitemoeshared": ("GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=96, logits_scaling=2.0, pad_token_id=0)),
    "flex_olmo": ("FlexOlmoForCausalLM", "FlexOlmoConfig", dict(num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    "jais2": ("Jais2ForCausalLM", "Jais2Config", dict(head_dim=16, pad_token_id=0)),
    "hunyuan": ("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", dict(
        head_dim=16, pad_token_id=0,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, alpha=50.0, factor=1.0))),
    "gpt-bigcode": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                                                       multi_query=True)),
    "gpt-bigcode-mha": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4,
                                                                           n_positions=256, multi_query=False)),
    "falcon-7b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=True, parallel_attn=True)),
    "falcon-40b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, new_decoder_architecture=True, num_kv_heads=2)),
    "falcon-sequential": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=False, parallel_attn=False,
                                                                    bias=True, tie_word_embeddings=False)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(hidden_size=64, ffn_dim=160, num_hidden_layers=2, num_attention_heads=4,
                                                max_position_embeddings=256, word_embed_proj_dim=64, pad_token_id=1)),
    # BioGPT: OPT's positions with GELU, scaled embeddings, LayerNorms at torch's epsilon (layer_norm_eps unread)
    "biogpt": ("BioGptForCausalLM", "BioGptConfig", dict(num_key_value_heads=4, layer_norm_eps=1e-2, pad_token_id=1)),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256)),
    # CodeGen: GPT-J whose q, k, v are one qkv_proj in 4 shards of (q, v, k) rows each
    "codegen": ("CodeGenForCausalLM", "CodeGenConfig", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                             n_positions=256, n_ctx=256)),
    "gpt-neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(hidden_size=64, num_layers=2, num_heads=4, window_size=32,
                                                          max_position_embeddings=256,
                                                          attention_types=[[["global", "local"], 1]])),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(clip_qkv=0.5, pad_token_id=0)),     # small: the clamp bites
    "ministral3": ("Ministral3ForCausalLM", "Ministral3Config", dict(head_dim=16, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8,   # 8: past it at 8
        llama_4_scaling_beta=0.5, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))),
    "apertus": ("ApertusForCausalLM", "ApertusConfig", dict(head_dim=16, pad_token_id=0, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "nanochat": ("NanoChatForCausalLM", "NanoChatConfig", dict(final_logit_softcapping=3.0, pad_token_id=0)),
    "glm4-moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig", dict(ROUTED, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                             use_qk_norm=True, attention_bias=True, pad_token_id=0)),
    "solar-open": ("SolarOpenForCausalLM", "SolarOpenConfig", dict(ROUTED, norm_topk_prob=False, pad_token_id=0)),
    "dots1": ("Dots1ForCausalLM", "Dots1Config", dict(ROUTED, n_group=2, topk_group=1, head_dim=16, pad_token_id=0)),
    "minimax-m2": ("MiniMaxM2ForCausalLM", "MiniMaxM2Config", dict(
        num_local_experts=8, num_experts_per_tok=3, intermediate_size=48, head_dim=16, bos_token_id=1, pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))),
    # MiniMax-M3's language model: Gemma norms, clamped SwiGLUs (limit small enough to bite), a dense layer and a
    # sparse-attention one whose 16 blocks of 4 keys cover the 64-token context it is capped at
    "minimax-m3": ("MiniMaxM3VLForCausalLM", "MiniMaxM3VLTextConfig", dict(
        num_local_experts=8, num_experts_per_tok=3, intermediate_size=48, dense_intermediate_size=96,
        shared_intermediate_size=32, head_dim=16, rotary_dim=8, swiglu_limit=0.5, routed_scaling_factor=2.0,
        mlp_layer_types=["dense", "sparse"], layer_types=["minimax_m3_sparse", "full_attention"], index_n_heads=2,
        index_head_dim=16, index_block_size=4, index_topk_blocks=16, bos_token_id=1, pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))),
    "ernie4_5-moe": ("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", dict(
        num_hidden_layers=3, moe_num_experts=8, moe_k=3, moe_intermediate_size=48, moe_num_shared_experts=1,
        moe_layer_start_index=1, head_dim=24, tie_word_embeddings=True)),
    "hunyuan-moe": ("HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config", dict(num_experts=8, moe_topk=[2, 3], head_dim=16,
                                                                          intermediate_size=48)),
    "phimoe": ("PhimoeForCausalLM", "PhimoeConfig", dict(
        num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.5, attention_bias=True, lm_head_bias=True,
        max_position_embeddings=512, rope_parameters=dict(LONGROPE, rope_theta=10000.0, short_mscale=1.2,
                                                         long_mscale=1.3))),
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        head_dim=16, intermediate_size=48, intermediate_size_mlp=96, num_hidden_layers=4, num_local_experts=4,
        interleave_moe_layer_step=2, attention_chunk_size=64, floor_scale=4, attn_scale=0.5, rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64))),       # floor_scale 4: the NoPE layer's temperature bites
    "granite4": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(
        GRANITE, num_local_experts=0, shared_intermediate_size=96, layer_types=["attention"] * 2,
        position_embedding_type="rope")),
    "granite4-moe-nope": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(
        GRANITE, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=96,
        layer_types=["attention"] * 2)),
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, n_group=2,
        topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5, num_hidden_layers=3, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64, mscale=1.0,
            mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))),
    # Sarvam's MLA models as transformers saves them, and as the released config.json says it (RENAMED)
    "sarvam-mla": ("DeepseekV3ForCausalLM", "SarvamMLAConfig", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1,
        routed_scaling_factor=2.5, num_hidden_layers=3)),
    "sarvam-mla-original": ("DeepseekV3ForCausalLM", "SarvamMLAConfig", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1,
        routed_scaling_factor=2.5, num_hidden_layers=3, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64, mscale=1.0,
            mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))),
    "deepseek-v2": ("DeepseekV2ForCausalLM", "DeepseekV2Config", dict(
        MLA, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=2,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=1.5,
        num_hidden_layers=3)),
    "glm4-moe-lite": ("Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig", dict(
        MLA, v_head_dim=24, rope_interleave=False, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
        routed_scaling_factor=1.8, mlp_layer_types=["sparse", "dense", "sparse"], num_hidden_layers=3)),
    # DeepSeek-V3.2 / GLM-5: within index_topk tokens (64 here; the context capped there) the indexer picks every
    # key, so transformers' sparse attention is V3's; GLM-5's second layer reuses the first's choice ("shared")
    "deepseek-v32": ("DeepseekV32ForCausalLM", "DeepseekV32Config", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, n_group=2,
        topk_group=1, first_k_dense_replace=1, num_hidden_layers=3, index_topk=64, index_head_dim=16,
        index_n_heads=2)),
    "glm5-dsa": ("GlmMoeDsaForCausalLM", "GlmMoeDsaConfig", dict(
        MLA, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
        mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3, index_topk=64, index_head_dim=16,
        index_n_heads=2, indexer_types=["full", "shared", "full"])),
    # ALiBi (models/alibi.py), six heads (not a power of two: each family's interleaved slopes), over the KV cache
    # kiln owns (tests/numerics/test_alibi.py: the slopes, chunked prefill)
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=96, n_layer=2, n_head=6, bos_token_id=1)),
    "mpt": ("MptForCausalLM", "MptConfig", dict(d_model=96, n_layers=2, n_heads=6, max_seq_len=256, bos_token_id=1,
                                                attn_config=dict(alibi=True, alibi_bias_max=8, clip_qkv=6.0))),
    "minicpm3": ("MiniCPM3ForCausalLM", "MiniCPM3Config", dict(
        MLA, scale_emb=6.0, scale_depth=1.4, dim_model_base=16, bos_token_id=1, max_position_embeddings=512,
        rope_parameters=dict(LONGROPE, short_factor=[1.0 + 0.25 * i for i in range(4)], long_factor=[4.0] * 4,
                             rope_theta=10000.0))),
    "mistral4": ("Mistral4ForCausalLM", "Mistral4Config", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, n_group=2,
        topk_group=1, num_hidden_layers=2, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8, mscale=1.0,
            mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0, llama_4_scaling_beta=0.5))),   # 8: past it at 8
    "youtu": ("YoutuForCausalLM", "YoutuConfig", dict(MLA, bos_token_id=1, pad_token_id=0)),
    # A.X K1: DeepSeek-V3 with a norm on the experts' output (the MoE layers only)
    # LongCat-Flash: two latent-attention blocks and MLPs a layer, the experts a shortcut beside them, 2 of 10 experts
    # identities (zero-computation), a softmax router with a choice bias, unnormalised weights scaled; q and the KV
    # latent scaled
    "longcat-flash": ("LongcatFlashForCausalLM", "LongcatFlashConfig", dict(
        MLA, num_layers=2, head_dim=8, ffn_hidden_size=96, expert_ffn_hidden_size=48, n_routed_experts=8,
        zero_expert_num=2, moe_topk=3, routed_scaling_factor=2.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "axk1": ("AXK1ForCausalLM", "AXK1Config", dict(
        MLA, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, n_group=2,
        topk_group=1, num_hidden_layers=3, mlp_layer_types=["dense", "sparse", "sparse"], bos_token_id=1)),
    "hy-v3": ("HYV3ForCausalLM", "HYV3Config", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, num_shared_experts=1, num_hidden_layers=3,
        head_dim=16, router_scaling_factor=2.5, pad_token_id=0)),
    # DeepSeek-V3's router with 2 groups of 4, attention output gated per head by q_proj's second half
    "minicpm5-moe": ("MiniCPM5MoeForCausalLM", "MiniCPM5MoeConfig", dict(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, num_hidden_layers=3,
        head_dim=16, n_group=2, topk_group=1, routed_scaling_factor=2.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # a dense layer, then sparse ones; sliding with RoPE, global without; norms around attention and MLP; gated output
    "afmoe": ("AfmoeForCausalLM", "AfmoeConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, num_shared_experts=1, num_hidden_layers=3,
        head_dim=16, route_scale=2.0, global_attn_every_n_layers=2, sliding_window=64, mup_enabled=True,
        pad_token_id=0)),
    # Laguna-XS.2's shape: a query head count a layer, a full layer (YaRN on half of each head) then sliding ones
    # (unscaled RoPE on all of it), a softplus gate a head, a capped sigmoid router, a dense first layer
    "laguna": ("LagunaForCausalLM", "LagunaConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=32,
        num_hidden_layers=3, head_dim=16, num_attention_heads_per_layer=[4, 8, 2], sliding_window=8,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        moe_routed_scaling_factor=2.0, moe_router_logit_softcapping=2.0, pad_token_id=0, rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "partial_rotary_factor": 0.5,
                               "factor": 4.0, "original_max_position_embeddings": 64},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}})),
    # Laguna-M.1's: every layer full, a softplus gate a value dim, dense layers by mlp_layer_types
    "laguna-m1": ("LagunaForCausalLM", "LagunaConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=32,
        num_hidden_layers=3, head_dim=16, gating="per-element", mlp_layer_types=["dense", "dense", "sparse"],
        pad_token_id=0)),
    # Beam: sliding (RoPE) / full (no RoPE, queries scaled by position) layers, q/k norms,
    # the output gated with a bias a head, four norms, depth-scaled residual adds, a grouped router, capped logits
    "beam": ("BeamForCausalLM", "BeamConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, num_hidden_layers=3, head_dim=16,
        n_group=2, topk_group=1, routed_scaling_factor=2.0, sliding_window=64, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=0)),
    # Ergo: one wqkv, adjacent-pair RoPE on sliding layers, a full one without it and its scores scaled, residual
    # gates a hidden dim, relu^2 MLPs without gates, each expert's output normed by its own weight, a normed
    # shared expert, the serving layout's tensors (transposed router, experts [experts, in, out])
    "ergo": ("ErgoForCausalLM", "ErgoConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, shared_intermediate_size=32,
        first_dense_intermediate_size=96, num_hidden_layers=3, global_attention_every_n_layers=2, sliding_window=64,
        global_attention_scale=2.0, rms_norm_eps=1e-5, max_position_embeddings=256, pad_token_id=0)),
    # Aria's language model: every MLP experts (fc1 / fc2 as x @ W) beside 2 shared ones, added ungated
    "aria-text": ("AriaTextForCausalLM", "AriaTextConfig", dict(
        moe_num_experts=8, moe_topk=3, moe_num_shared_experts=2, intermediate_size=48, pad_token_id=0)),
    # ModernBERT's decoder (Ettin): the embeddings normed, the first layer without a norm before attention, global
    # layers by one RoPE base and sliding ones by another (past the window: test_families_sliding), GeGLU fused in Wi,
    # LayerNorms without bias, a dense -> GELU -> LayerNorm head before the tied decoder and its bias
    "modernbert-decoder": ("ModernBertDecoderForCausalLM", "ModernBertDecoderConfig", dict(
        num_hidden_layers=4, num_key_value_heads=None, local_attention=64, global_attn_every_n_layers=3,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        pad_token_id=0, bos_token_id=1, cls_token_id=1, sep_token_id=2, tie_word_embeddings=True)),
    # MiMo-V2-Flash: a full layer, then sliding ones with sinks and twice the KV heads (the KV cache kiln owns), RoPE
    # on a third of each head with a base a layer kind, values half the keys' width and scaled, DeepSeek-V3's router
    "mimo-v2-flash": ("MiMoV2FlashForCausalLM", "MiMoV2FlashConfig", dict(
        num_key_value_heads=1, head_dim=32, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=48, n_group=2, topk_group=1, num_hidden_layers=3, sliding_window=64, pad_token_id=0,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"])),
    # sliding, sliding, global without RoPE; norms after attention and MLP; experts chosen by logits + bias
    "kolibri1": ("Kolibri1ForCausalLM", "Kolibri1Config", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=32,
        num_hidden_layers=3, head_dim=16, sliding_window=64, norm_topk_prob=True, pad_token_id=0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    # attention sinks on every layer (the KV cache kiln owns); sliding layers with RoPE past their 8-token
    # window, full ones without; a sigmoid router; an ungated shared expert; the first layer dense
    "flint": ("FlintForCausalLM", "FlintConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=32,
        num_hidden_layers=3, head_dim=16, sliding_window=8, pad_token_id=0, mlp_only_layers=[0],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # attention sinks, q/k/v/o biases, a sliding layer (past its window) then a full one, YaRN; experts with
    # biases, interleaved gate/up and the clamped SwiGLU, a router with a bias (gate/up values spread
    # past the clamp's limit by a wide init)
    "gpt-oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        num_local_experts=8, num_experts_per_tok=3, intermediate_size=48, head_dim=16, sliding_window=8,
        pad_token_id=0, swiglu_limit=0.5, initializer_range=0.2)),
    # Granite's multipliers, sinks, sliding layers past their window, a RoPE base per layer (0: none)
    "granite-swa": ("GraniteSWAForCausalLM", "GraniteSWAConfig", dict(
        GRANITE, num_hidden_layers=3, sliding_window=8, layer_rope_theta=[10000.0, 0, 500.0],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "granitemoe-swa": ("GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig", dict(
        GRANITE, num_hidden_layers=2, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=32, intermediate_size=48)),
    # transformers runs both as GLM-4.5 and saves them under Bailing's names (q/k/v fused)
    "sarvam-moe": ("Glm4MoeForCausalLM", "SarvamMoEConfig", dict(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, num_hidden_layers=3,
        head_dim=16, pad_token_id=0)),
    # Ling 2.0 / Ring 2.0 as their own code saves them (RENAMED): Sarvam's layers, RoPE on half of each head
    "bailing-moe-v2": ("Glm4MoeForCausalLM", "SarvamMoEConfig", dict(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, n_shared_experts=1, num_hidden_layers=3,
        head_dim=16, pad_token_id=0, partial_rotary_factor=0.5, n_group=2, topk_group=1)),
    "param2moe": ("Glm4MoeForCausalLM", "Param2MoeConfig", dict(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, num_hidden_layers=3, head_dim=16,
        attention_bias=True, pad_token_id=0)),
    "exaone-moe": ("ExaoneMoeForCausalLM", "ExaoneMoeConfig", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, num_hidden_layers=4, sliding_window=4096,
        sliding_window_pattern=4, first_k_dense_replace=1, routed_scaling_factor=2.5, n_group=2, topk_group=1,
        pad_token_id=0, bos_token_id=1)),
}
# config.json as a family's own checkpoints write it, where transformers writes it otherwise
RENAMED = {"internlm3": lambda c: {**{k: v for k, v in c.items() if k not in ("attention_bias", "mlp_bias")},
                                   "architectures": ["InternLM3ForCausalLM"], "qkv_bias": c["attention_bias"],
                                   "bias": c["mlp_bias"]},
           "sarvam-mla-original": lambda c: {
               **{k: v for k, v in c.items() if k not in ("n_routed_experts", "n_shared_experts", "rope_parameters")},
               "architectures": ["SarvamMLAForCausalLM"], "num_experts": c["n_routed_experts"],
               "num_shared_experts": c["n_shared_experts"], "head_dim": c["kv_lora_rank"] + c["qk_rope_head_dim"],
               "rope_theta": c["rope_parameters"]["rope_theta"],
               "rope_scaling": {"type": "deepseek_yarn", **{k: v for k, v in c["rope_parameters"].items()
                                                           if k not in ("rope_theta", "rope_type")}}},
           "bailing-moe-v2": lambda c: {
               **{k: v for k, v in c.items() if k not in ("n_routed_experts", "n_shared_experts", "rope_parameters",
                                                          "attention_bias")},
               "model_type": "bailing_moe_v2", "architectures": ["BailingMoeV2ForCausalLM"],
               "auto_map": {"AutoModelForCausalLM": "modeling_bailing_moe_v2.BailingMoeV2ForCausalLM"},
               "num_experts": c["n_routed_experts"], "num_shared_experts": c["n_shared_experts"],
               "use_qkv_bias": c["attention_bias"], "rope_theta": c["rope_parameters"]["rope_theta"],
               "partial_rotary_factor": c["rope_parameters"]["partial_rotary_factor"], "score_function": "sigmoid",
               "moe_router_enable_expert_bias": True, "use_bias": False, "use_sliding_window": False,
               "moe_shared_expert_intermediate_size": c["moe_intermediate_size"] * c["n_shared_experts"]},
           "exaone": lambda c: {**{k: v for k, v in c.items() if k not in (
               "num_hidden_layers", "rms_norm_eps", "hidden_act", "rope_parameters")},
               "architectures": ["ExaoneForCausalLM"], "num_layers": c["num_hidden_layers"],
               "layer_norm_epsilon": c["rms_norm_eps"], "activation_function": c["hidden_act"],
               "rope_theta": c["rope_parameters"]["rope_theta"],
               "rope_scaling": {k: v for k, v in c["rope_parameters"].items() if k != "rope_theta"}}}


def write_family(case: str, dest, seed: int = 0, **extra):
    """The case's transformers model, random weights widened so the tolerance bites, saved with a tokenizer."""
    model_cls, config_cls, overrides = CASES[case]
    overrides = dict(overrides, **extra)
    own = case in ("gpt2", "opt", "gptj", "codegen", "gpt-neo", "dbrx", "bloom", "mpt") or \
        case.startswith(("gpt-bigcode", "falcon"))            # their own field names: no SMALL
    cfg = dict(vocab_size=512, eos_token_id=2, **overrides) if own else dict(SMALL, **overrides)
    model = write_widened(model_cls, config_cls, cfg, dest, seed)
    if case in RENAMED:
        path = dest / "config.json"
        path.write_text(json.dumps(RENAMED[case](json.loads(path.read_text()))))
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    ref = write_family(case, tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_phi3_longrope_caps_the_context_with_a_note(tmp_path):
    write_family("phi3", tmp_path / "hf")
    _, config, _ = build(load(tmp_path / "hf"))
    assert config.context_window_size == 128
    assert any("LongRoPE" in n for n in config.notes)


def test_mimo_v2_flash_reads_its_released_config(tmp_path):
    """MiMo-V2-Flash's own config.json (hybrid_layer_pattern, sliding_window_size, swa_* shapes, no rope_parameters):
    the model transformers' config makes of it; a sliding layer of another shape is refused by name."""
    from kiln.models.glm4_moe import MiMoV2FlashConfig
    released = dict(SMALL, model_type="mimo_v2_flash", num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
                    v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
                    hybrid_layer_pattern=[0, 1, 1], sliding_window_size=63, swa_num_key_value_heads=2,
                    swa_head_dim=32, swa_v_head_dim=16, swa_num_attention_heads=4)
    c = MiMoV2FlashConfig.from_hf(released)
    assert c.layer_types == ("full_attention", "sliding_attention", "sliding_attention") and c.sliding_window == 64
    assert (c.rope_theta, c.local_rope_theta, c.rotary_dim, c.value_scale) == (5000000.0, 10000.0, 10, 0.707)
    assert [c.layer_kv_heads(i) for i in range(3)] == [1, 2, 2]
    with pytest.raises(ValueError, match="swa_num_key_value_heads 4"):
        MiMoV2FlashConfig.from_hf(dict(released, swa_num_key_value_heads=4))


def test_laguna_reads_its_defaults_and_refuses_what_transformers_would_not_run():
    """A config.json without rope_parameters, layer kinds or per-layer heads: transformers' defaults (every layer full
    with YaRN-less RoPE at 500000 on half of each head, the first layer dense), which TVM's cache can run; with heads
    that differ by layer it cannot (kiln's own cache then: `--kv-cache tvm` names why); gating_types that disagree
    with gating, a heads list of another length and the router weights on the input are refused by name."""
    from kiln.models.laguna import LagunaConfig
    base = dict(SMALL, model_type="laguna", num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=32)
    c = LagunaConfig.from_hf(base)
    assert c.layer_types == ("full_attention",) * 3 and c.dense_layers == (0,) and c.head_gate
    assert [(a.rope_theta, a.rotary_dim) for a in c.layer_attention()] == [(500000.0, 8)] * 3
    assert [c.layer_heads(i) for i in range(3)] == [4, 4, 4]
    from kiln.models.causal_lm import CausalLM
    varied = LagunaConfig.from_hf(dict(base, num_attention_heads_per_layer=[4, 8, 2]))
    assert CausalLM(varied).tvm_cache_problem() == ("this model's layers differ in query heads, and TVM's paged KV "
                                                    "cache attends one count for all")
    assert CausalLM(c).tvm_cache_problem() is None
    for extra, match in ((dict(gating="per-head", gating_types=["per_element"] * 3), "disagree with gating"),
                         (dict(num_attention_heads_per_layer=[4, 8]), "lists 2 layers of the 3"),
                         (dict(gating=False), "gating False is not supported"),
                         (dict(moe_apply_router_weight_on_input=True), "moe_apply_router_weight_on_input True")):
        with pytest.raises(ValueError, match=match):
            LagunaConfig.from_hf(dict(base, **extra))


def test_modernbert_decoder_reads_the_hubs_older_config():
    """The Hub's ModernBERT-decoder config.json (global_attn_every_n_layers, global_rope_theta / local_rope_theta,
    local_attention; no layer_types or rope_parameters): every third layer global from the first, the window half
    local_attention, each kind its base; an activation kiln does not run and grouped KV heads are refused."""
    from kiln.models.modernbert_decoder import ModernBertDecoderConfig
    hub = dict(SMALL, model_type="modernbert-decoder", num_hidden_layers=6, num_key_value_heads=None,
               global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
               local_attention=128, max_position_embeddings=7999, norm_eps=1e-5)
    c = ModernBertDecoderConfig.from_hf(hub)
    assert c.layer_types == ("full_attention", "sliding_attention", "sliding_attention") * 2
    assert (c.sliding_window, c.rope_theta, c.local_rope_theta) == (64, 160000.0, 10000.0)
    assert [a.rope_theta for a in c.layer_attention()] == [160000.0, 10000.0, 10000.0] * 2
    with pytest.raises(ValueError, match="hidden_activation 'swish' is not supported"):
        ModernBertDecoderConfig.from_hf(dict(hub, hidden_activation="swish"))
    with pytest.raises(ValueError, match="num_key_value_heads is not supported"):
        ModernBertDecoderConfig.from_hf(dict(hub, num_key_value_heads=2))


@pytest.mark.parametrize("arch", ["beam", "ergo"])
def test_rope_on_full_layers_without_it_is_refused_by_name(arch):
    """Beam's and Ergo's full layers attend without RoPE (Beam's queries then scaled by position): a config giving
    them a RoPE of their own is refused, not run as the released checkpoints' layers."""
    from kiln.models.registry import find_architecture
    config_cls = find_architecture({"model_type": arch, "architectures": []}).config_cls
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    with pytest.raises(ValueError, match="RoPE on its full_attention layers"):
        config_cls.from_hf(dict(SMALL, model_type=arch, num_experts=8, num_experts_per_tok=2,
                                      moe_intermediate_size=32, rope_parameters=rope))


def test_sparse_attention_caps_the_context_at_index_topk_with_a_note(tmp_path):
    write_family("deepseek-v32", tmp_path / "hf")
    _, config, _ = build(load(tmp_path / "hf"))
    assert config.context_window_size == 64
    assert any("capped at index_topk (64 tokens)" in n for n in config.notes)


def test_attention_softcap_is_refused_where_the_kernels_lack_it(tmp_path, monkeypatch):
    """Every target's kernels cap (targets/attention_softcap.py); a profile that says its kernels
    cannot is refused before anything is written, naming the targets that can."""
    import dataclasses

    from kiln import targets
    make = targets._PROFILES["cuda"]
    monkeypatch.setitem(targets._PROFILES, "cuda", lambda: dataclasses.replace(make(), attn_softcap=False))
    write_family("gemma2", tmp_path / "hf")
    with pytest.raises(ValueError, match="soft-caps attention scores .* use --target cpu"):
        kiln.compile(str(tmp_path / "hf"), target="cuda", quant="q0f16", output=tmp_path / "art")
    assert not (tmp_path / "art").exists()


def test_gemma2_builds_for_cuda_with_capped_attention(tmp_path):
    """Gemma 2 (attention soft-capping) on CUDA: kiln's decode and prefill kernels built with the cap,
    TVM's sliding-window prefill and tree kernels capped in place; nvcc compiles the library. The
    kernels' numerics are checked on OpenCL (tests/compiler/test_opencl_kernels.py), the model on a
    GPU by tests/numerics/test_cuda_variants.py."""
    from conftest import ir_functions
    write_family("gemma2", tmp_path / "hf")
    kiln.compile(str(tmp_path / "hf"), target="cuda-sm90", quant="q4f16", output=tmp_path / "art", golden=False,
                 dump_ir=tmp_path / "ir")
    funcs = ir_functions((tmp_path / "ir" / "2-schedule.py").read_text())
    attention = {n: f for n, f in funcs.items() if "sm_scale: T.float32" in f.split("\n", 1)[0]}
    assert {"batch_decode_paged_kv", "batch_prefill_ragged_kv", "batch_prefill_paged_kv_sliding_window",
            "batch_tree_attn"} <= set(attention)
    uncapped = [n for n, f in attention.items() if "T.tanh(" not in f]
    assert not uncapped, uncapped


@pytest.mark.parametrize("case", ["deepseek-v3", "deepseek-v2"])
def test_grouped_routers_build_for_webgpu(case, tmp_path):
    """The routers that choose experts from the best groups (DeepSeek-V3's: a group's two best biased
    scores; V2's: its best), with latent attention, on WebGPU, which has no 64-bit integers: their index
    arithmetic stays int32 (a group's best expert was once an int64 buffer, and the compile failed)."""
    from conftest import ir_functions
    write_family(case, tmp_path / "hf")
    kiln.compile(str(tmp_path / "hf"), target="webgpu", quant="q4f16", output=tmp_path / "art", golden=False,
                 dump_ir=tmp_path / "ir")
    funcs = ir_functions((tmp_path / "ir" / "2-schedule.py").read_text())
    assert any(name.startswith("best_groups") for name in funcs), sorted(funcs)


def test_routers_stay_float32_under_float16_compute(tmp_path):
    """GLM-4.5's router and choice bias are written float32 in a q4f16 artifact (a float16 rounding could
    choose another expert), every other float weight float16; the artifact still decodes."""
    write_family("glm4-moe", tmp_path / "hf")
    art = Artifact.load(kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q4f16", output=tmp_path / "art",
                                     golden=False))
    dtypes = {name: str(a.dtype) for name, a in zip(art.config.params, art.iter_params())}
    routing = {n for n in dtypes if n.endswith((".mlp.router", ".mlp.choice_bias"))}
    assert len(routing) == 4 and {dtypes[n] for n in routing} == {"float32"}              # 2 sparse layers
    assert {d for n, d in dtypes.items() if n.endswith("norm.weight")} == {"float16"}
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(art)
    runner.add_sequence(0)
    assert np.isfinite(runner.prefill([0], [IDS])[0]).all()

def test_moe_batches_route_each_sequence_to_its_own_experts(tmp_path):
    """Three sequences decoded together (one batch_decode a step: each row gathers its own experts) give
    transformers' greedy tokens, each sequence's as if alone."""
    from kiln import Engine, EngineConfig, SamplingParams
    from tiny_models import greedy_reference
    ref = write_family("qwen2-moe", tmp_path / "hf", seed=1)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    prompts = [IDS[:5], IDS[3:12], IDS]
    outs = Engine(art, EngineConfig()).generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [greedy_reference(ref, p, 8) for p in prompts]


def test_moe_quantized_experts_match_transformers_on_the_dequantized_weights(tmp_path):
    """q4f32 stores every expert's rows as 4-bit planes (one Linear of experts x rows) and the expert
    matmul dequantizes the rows each token's experts own: transformers' Mixtral with the weights the
    artifact's planes hold gives the same logits (a prefill, then 3 decode steps)."""
    import torch
    import transformers
    from test_quantized import compile_with_reference, dequantized_weights
    from tiny_models import reference_logits
    write_family("mixtral", tmp_path / "hf", seed=2)
    art = compile_with_reference(tmp_path / "hf", tmp_path / "hf", "q4f32", tmp_path / "art")
    quant = Artifact.load(art).config.quantization
    assert quant["formats"]["q4"]["weights"] >= 4             # both layers' expert gate/up and down, at least
    ref = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    weights, state = dequantized_weights(art), {}
    for name, value in weights.items():                      # the checkpoint's names -> transformers 5's modules
        if ".block_sparse_moe." not in name:
            state[name] = value
        elif name.endswith("block_sparse_moe.gate.weight"):
            state[name.replace("block_sparse_moe.gate", "mlp.gate")] = value
    for i in range(ref.config.num_hidden_layers):
        expert = [f"model.layers.{i}.block_sparse_moe.experts.{j}" for j in range(ref.config.num_local_experts)]
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([weights[f"{e}.w1.weight"], weights[f"{e}.w3.weight"]]) for e in expert])
        state[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack([weights[f"{e}.w2.weight"] for e in expert])
    if ref.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    ref.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
    ids = IDS[:11]
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(Artifact.load(art))
    runner.add_sequence(0)
    np.testing.assert_allclose(runner.verify(0, ids), reference_logits(ref, ids), atol=TOL, rtol=0)
    seq = list(ids)
    for _ in range(3):
        seq.append(int(np.argmax(reference_logits(ref, seq)[-1])))
        np.testing.assert_allclose(runner.decode([0], [seq[-1]])[0], reference_logits(ref, seq)[-1], atol=TOL, rtol=0)
