"""Per GGUF architecture: the HF config its metadata describes, and its tensors' HF names and layout.

llama.cpp's converter (convert_hf_to_gguf.py) writes each family its own way; this module undoes
that, so a GGUF reads like the Hugging Face checkpoint it was converted from:

    arch     HF model            tensors as llama.cpp stores them
    llama    Llama / Mistral     q/k rows permuted for its RoPE; Llama 3 scaling as rope_freqs.weight
    qwen2    Qwen2               as HF (q/k/v biases)
    orion    Orion               as HF: the norms' biases (LayerNorms), q/k rows as stored (NeoX RoPE)
    step35   Step 3.5            head_count a layer, sliding_window_pattern, the full layers' RoPE on half of each
                                 head, the experts stacked as released (moe.*_proj), norms stored + 1
    openelm  OpenELM             head_count / head_count_kv / feed_forward_length a value a layer, attn_qkv as
                                 stored, proj_1 split into ffn_gate / ffn_up (joined back)
    deci     Nemotron-NAS        llama's, head_count / head_count_kv / feed_forward_length a value a layer (0: no
                                 attention, no KV heads: a Linear stored as attn_output, 0: no MLP); DeciLM-7B
    qwen3    Qwen3               as HF, plus attn_q_norm / attn_k_norm
    llama    Mixtral             experts as 3-D tensors (ffn_{gate,up,down}_exps [experts, rows, cols],
                                 read as each expert's own), the router as ffn_gate_inp
    qwen2moe Qwen1.5/2-MoE       as qwen2 with experts, a shared expert (ffn_*_shexp) and its gate
    qwen3moe Qwen3-MoE           as qwen3 with experts
    mellum   Mellum              as qwen3moe, every MLP experts; the window, each layer's kind and the sliding layers'
                                 RoPE base (rope.freq_base_swa)
    qwen35   Qwen3.5 (text)      DeltaNet layers as ssm_* / attn_qkv / attn_gate: A as -exp(A_log), the conv
                                 squeezed, linear-attention V heads tiled over the key heads where fewer (rows of
                                 attn_qkv's V part, attn_gate, ssm_alpha / beta / a / dt, the conv's V channels;
                                 ssm_out's columns); every *norm.weight + 1 but ssm_norm
    qwen35moe Qwen3.5 MoE        as qwen35 with qwen2moe's experts and shared expert
    qwen3next Qwen3-Next         as qwen35moe, but the V heads in HF's order and in_proj_ba as it is (ssm_ba: a key
                                 head's b rows, then its a rows), read as the Qwen3.5-MoE model it computes
    gemma    Gemma               every *norm.weight stored + 1 (Gemma's RMSNorm scales by 1 + w)
    gemma2   Gemma 2             the same
    gemma3   Gemma 3 (text)      the same, q/k norms included
    gemma3n  Gemma 3n (text)     norms as they are; AltUp's projections stacked in 3-D altup_proj /
                                 altup_unembd_proj; sparsity as normal quantiles; a width a layer
    gemma4   Gemma 4 (text)      norms as they are; per-layer KV heads, MLP widths and layer kinds as arrays,
                                 proportional RoPE as rope_freqs, the per-layer embeddings' tensors
    phi3     Phi-3               q/k/v fused (attn_qkv), gate/up fused (ffn_up); LongRoPE factors as
                                 rope_factors_long / rope_factors_short
    gpt2     GPT-2               Conv1D weights transposed to [out, in]; output.weight a copy of wte
    granite  Granite 3           as llama; its four multipliers as embedding_scale, attention.scale,
                                 residual_scale and logit_scale (attention.scale unwritten: 1 / sqrt(head size),
                                 as llama.cpp's graph takes it)
    olmo2    OLMo 2              as HF (no pre-norms; post_attention_norm / post_ffw_norm after)
    smollm3  SmolLM3             as llama (q/k rows permuted)
    afmoe    AFMoE (Trinity)     as llama with q/k norms, the attention gate (attn_gate), norms after attention and
                                 MLP, experts as qwen3moe's with exp_probs_b.bias; every 4th layer global, no RoPE
    laguna   Laguna              as afmoe's names but its gate (attn_gate: g_proj, a row a head or a value dim), the
                                 choice bias and shared expert under the released names; head_count a layer; RoPE
                                 a layer kind (rope.*_swa on sliding layers)
    mistral3 Ministral 3         as llama with YaRN (yarn_log_multiplier: mscale_all_dim, mscale 1) and the
                                 queries' temperature (attention.temperature_scale: llama_4_scaling_beta)
    stablelm StableLM 2          as HF (LayerNorm biases); partial rotary as rope.dimension_count
    phi2     Phi-2               as HF (q/k/v apart, the head's bias); partial rotary as above
    gptneox  GPT-NeoX / Pythia   attn_qkv rows regrouped from each head's q, k, v to every q, then k, v
    ernie4_5 ERNIE 4.5           as HF (biases or none; RoPE on adjacent pairs, as HF's)
    glm4     GLM-4-0414          as HF (gate/up fused in ffn_up; post_attention_norm / post_ffw_norm
                                 after attention and MLP); partial rotary as rope.dimension_count
    command-r Command-R / Aya    as HF (one LayerNorm without bias a layer; RoPE on adjacent pairs);
                                 logit_scale
    cohere2  Command R7B         the same; the window as attention.sliding_window (every 4th layer global)
    cohere2moe Cohere's MoE      as cohere2 with experts and shared experts (ffn_*_shexp); each layer's kind as
                                 sliding_window_pattern; RMSNorm where its eps is written
    olmoe    OLMoE               as qwen3moe without a shared expert (q/k norms over all heads)
    starcoder2 StarCoder2        as HF (c_fc / c_proj as ffn_up / ffn_down); no sliding window in the file
    olmo2    OLMo 3              as OLMo 2, with attention.sliding_window and a per-layer
                                 attention.sliding_window_pattern (true: the layer slides)
    exaone   EXAONE 3.0 / 3.5    as HF (EXAONE's GPT-2-like names; q/k rows not permuted: llama.cpp's
                                 NeoX RoPE); Llama 3 scaling as rope_freqs.weight
    exaone4  EXAONE 4.0          as OLMo 2 (q/k norms per head); the window and pattern as above
    seed_oss Seed-OSS            as HF (q/k/v biases); the norm before the MLP named post_attention_norm
    hunyuan-dense Hunyuan        as HF, the q/k norms as attn_q_norm / attn_k_norm; the NTK-alpha
                                 RoPE base already raised (rope.freq_base), no scaling
    chameleon Chameleon          as llama (q/k rows permuted), q_norm / k_norm [heads, head_dim] in llama.cpp's pair
                                 order (each head's head 0's); the image tokens by their IMGIMG names in the vocabulary
    baichuan Baichuan / 2        as llama (q/k rows permuted), W_pack as q, k and v; RoPE for 32 layers, else ALiBi
                                 (llama.cpp's rule); Baichuan 2's head normalised as the model does (NormHead)
    hrm_text HRM-Text            block_count the cache's slots, the low stack's layers then the high stack's as the
                                 blocks, gate / q / k / v and the MLP's gate / up apart, hrm.z_l_init the low state's
                                 start, hrm.* the loop's counts
    muse-glimmer Muse Glimmer    its language model: Gemma 2's norm names, stored + 1 but the last (stored as it is),
                                 the attention gate as attn_gate, q/k rows permuted; q_norm / k_norm as the q scale and
                                 ones; the output multiplier as logit_scale; RoPE on the sliding layers only
    hunyuan_vl HunyuanOCR        its language model: as hunyuan-dense, the XD-RoPE base and its NTK alpha written
                                 apart (rope.freq_base, rope.scaling.alpha: joined as HunYuan's base * alpha ** (d /
                                 (d - 2))), the XD-RoPE sections (rope.dimension_sections) unread on text
    falcon   Falcon              attn_qkv rows regrouped from each kv group's [q heads, k, v] to every q,
                                 k, v; the new architecture's ln_attn as attn_norm_2, ln_mlp as attn_norm
    starcoder GPT-BigCode        as GPT-2's names, but Linear weights (not transposed), one kv head
    olmo     OLMo 1              as llama (q/k rows permuted); no norm tensors; clip_qkv as clamp_kqv
    nemotron Nemotron / Minitron every *norm.weight stored + 1 (LayerNorm1P); biases; partial rotary as
                                 rope.dimension_count; the MLP's up and down only
    jais2    Jais 2              as HF (LayerNorm with biases, biases, the MLP's up and down only)
    xverse   XVERSE              as llama (q/k rows permuted); its BPE vocabulary written as llama's, without scores
    nanbeige Nanbeige 4.2        as llama (q/k rows permuted); num_loops runs of the layers, skip_loop_final_norm
    cogvlm   CogVLM / CogVLM2    its language expert's tensors (attn_qkv fused, as stored: RoPE on halves; the MLP's
                                 gate / up / down), read as phi3 (gate and up joined); the vision expert's (vis_*),
                                 which no text token takes, unread where the file holds them
    plm      PLM                 as HF (Youtu's latent attention, attn_kv_b whole, RoPE on adjacent pairs as stored),
                                 the ungated squared-ReLU MLP's up and down only, the head tied
    smallthinker SmallThinker    as HF (q/k rows as stored), its experts' router as ffn_gate_inp; with a window, the
                                 sliding layers by sliding_window_pattern (every 4th full, the first) and no RoPE on
                                 every 4th (llama.cpp's graph's layout, the released 21B's)
    codeshell CodeShell          read as starcoder2 (use_bias, no window): q/k/v as attn_qkv, RoPE on halves
    bailingmoe Ling v1           read as granitemoeshared: the experts' and shared experts' gate / up joined, the
                                 renormalised softmax top k as Granite's router
    refact   Refact              read as baichuan's ALiBi form (its q / k / v apart), one KV head
    jais     JAIS                as HF (GPT-2's names, Conv1D weights transposed back), c_fc2 as ffn_gate, ALiBi of
                                 attention.max_alibi_bias, muP's scales folded in
    maincoder Maincoder          read as hunyuan-dense: its q/k rows as stored run under RoPE on adjacent pairs
                                 (read as permuted), the q/k norms' dims in that pair order
    pangu-embedded openPangu-Embedded  as llama, q/k rows as stored (NeoX RoPE), biases on q, k, v and o
    qwen     Qwen (the first)    EXAONE's GPT-2-like names, q/k/v as attn_qkv with its bias, ffn_gate w2 and ffn_up
                                 w1 (feed_forward_length both halves'); read as Qwen2
    arcee    Arcee AFM           as llama (q/k rows permuted), the MLP's up and down only; YaRN as rope.scaling
    granitemoe Granite MoE       as granite; each layer's 3-D input_linear split into ffn_gate_exps and
                                 ffn_up_exps (read back joined), output_linear as ffn_down_exps, the router
                                 as ffn_gate_inp; Shared's shared_mlp likewise as ffn_*_shexp
    glm4moe  GLM-4.5             experts as qwen3moe, the router's choice bias (e_score_correction_bias) as
                                 exp_probs_b.bias, shared experts as ffn_*_shexp; the pre-MLP norm as
                                 post_attention_norm; multi-token-prediction layers after the last, unread.
                                 Solar Open converts to it too (read as GLM-4.5 with its settings)
    hy_v3    Tencent Hy V3       experts as glm4moe under its own names (the router mlp.router.gate, the choice bias
                                 as a bare exp_probs_b, the shared MLP ffn_*_shexp), q/k norms per head, no groups
    dots1    dots.llm1           experts as glm4moe (ffn_norm before the MLP); no window in the file
    exaone-moe K-EXAONE          as exaone4 with dots1's experts; multi-token prediction as glm4moe
    minimax-m2 MiniMax-M2        as Mixtral's experts, q/k norms over all heads, the choice bias as exp_probs_b
    ernie4_5-moe ERNIE 4.5 MoE   as ernie4_5 with experts, shared experts and the choice bias (moe_statics)
    hunyuan-moe Hunyuan MoE      as hunyuan-dense with experts and the shared MLP as ffn_*_shexp
    gpt-oss  OpenAI gpt-oss      the sinks as attn_sinks.weight, the biased router as ffn_gate_inp; the experts'
                                 gate_up_proj ([experts, in, out], gate and up interleaved) split into
                                 ffn_gate_exps / ffn_up_exps [experts, out, in] (read back interleaved and
                                 transposed), down_proj transposed as ffn_down_exps, biases beside them; MXFP4 (or
                                 any type); YaRN as rope.scaling.*, without the truncation gpt-oss's config turns
                                 off (the file cannot say); the window on every other layer from the first
    apertus  Apertus             q/k rows as HF's, q/k norms, the MLP's up and down only; xIELU's parameters as
                                 xielu.alpha_n / alpha_p / beta / eps arrays (a value a layer, read as HF's tensors)
    llama4   Llama 4 (text)      q/k rows as HF's (RoPE on adjacent pairs); dense MLPs (feed_forward_length) and, every
                                 interleave_moe_layer_step-th layer, experts (expert_feed_forward_length): gate_up_proj
                                 [experts, in, gate + up] split into ffn_gate_exps / ffn_up_exps (read back joined and
                                 transposed), down_proj transposed, the router, a shared expert as ffn_*_shexp;
                                 Llama 3 scaling as rope_freqs.weight
    deepseek2 DeepSeek-V2 / V3   latent attention as HF, kv_b_proj split by heads into attn_k_b (each head's rows
                                 transposed) and attn_v_b (read back joined; older files: attn_kv_b); RoPE on
                                 adjacent pairs; experts as glm4moe; V3's router by sigmoid, V2's by softmax;
                                 mscale_all_dim as 0.1 x it (rope.scaling.yarn_log_multiplier). Kimi K2, Moonlight,
                                 GLM-4.7-Flash (read as V3) and Youtu-LLM (no experts) convert to it too
    deepseek DeepSeek-MoE        as llama (q/k rows permuted) with deepseek2-ocr's experts, softmax router and dense
                                 leading blocks: read as DeepSeek-OCR 2's language model without a routed scale
    deepseek2-ocr DeepSeek-OCR   its language model: DeepSeek-V2's experts and softmax router (as deepseek2's) under
                                 multi-head attention with RoPE on halves (llama.cpp's NeoX rope), read as DeepSeek-OCR
                                 2's (deepseek_ocr2_text); Unlimited-OCR's (a window in the file) refused
    bailingmoe2 Ling 2.0 / Ring 2.0, Sarvam MoE  q/k/v fused (attn_qkv), per-head q/k norms, RoPE on
                                 rope.dimension_count of each head; DeepSeek-V3's router (exp_probs_b.bias: the
                                 expert_bias), the shared expert's width as expert_shared_feed_forward_length;
                                 Bailing's names; the multi-token-prediction layers unread
    bailingmoe3 Ling 3.0         KDA where head_count_kv (a layer) is 0, as kimi-linear's but full-rank: ssm_f_a the
                                 decay's f_proj, ssm_g_a the output gate's g_proj, ssm_a exp(A_log), the bounded decay
                                 as kda.safe_gate / gate_lower_bound; latent attention as deepseek2's with its gate a
                                 head as attn_gate; SwiGLU clamps a layer as swiglu_clamp_exp / _shexp; Bailing's names
                                 as transformers saves them
    bloom    BLOOM / BLOOMZ      LayerNorms and biases everywhere, the embeddings' norm as token_embd_norm, q/k/v fused
                                 with the rows regrouped by kind (attn_qkv: read back a head's q, k, v together),
                                 ALiBi (llama.cpp's slopes are BLOOM's), the head tied
    mpt      MPT                 bias-free LayerNorms, Wqkv as attn_qkv, ALiBi's alibi_bias_max as
                                 attention.max_alibi_bias, clip_qkv as attention.clamp_kqv, the head tied
    kimi-linear Kimi Linear      KDA where head_count_kv (a layer) is 0: attn_q / attn_k / attn_v, their convs
                                 ssm_conv1d_q / _k / _v ([1, channels, 1, taps]), ssm_f_a / ssm_f_b, ssm_beta, ssm_a
                                 (-exp(A_log)), ssm_dt.bias, ssm_g_a / ssm_g_b, ssm_norm (their sizes as
                                 kda.head_dim, ssm.conv_kernel; heads the attention's); latent attention as
                                 deepseek2's (no RoPE); Mixtral's expert names, DeepSeek-V3's router, renormalised
    minimax-m3 MiniMax-M3        minimax-m2's tensors with the norms stored + 1 (Gemma's form baked in), q/k normed a
                                 head, a shared expert (ffn_*_shexp), the leading dense layers' MLPs (ffn_gate / _up /
                                 _down),
                                 the sparse layers' indexer (indexer.*, unread: the context capped where it picks
                                 every block, attention.indexer.top_k x block_size)
    mistral4 Mistral 4           as deepseek2 with softmax scores (groups, renormalised, scaled where written), the
                                 experts' 3-D gate_up_proj / down_proj as they are (ffn_gate_up_exps / ffn_down_exps);
                                 Llama 4's query temperature as attention.temperature_scale / _length
    minicpm3 MiniCPM3            latent attention as HF (kv_b_proj whole), RoPE on halves, LongRoPE as phi3's;
                                 its scales in llama.cpp's graph, not the file
    granitehybrid Granite 4.0    as granitemoe, a dense MLP as ffn_gate / ffn_up / ffn_down (read as shared_mlp);
                                 Mamba-2 layers where head_count_kv (a layer) is 0, as ssm_*: A as -exp(A_log) and D
                                 as [heads, 1], the gated norm's weight as [groups, inner / groups], the conv
                                 squeezed, dt_bias as ssm_dt.bias (their sizes as ssm.*: time_step_rank the heads,
                                 inner_size their width); RoPE unless rope.scaling.finetuned is false; Bamba
                                 converts to it too (no multipliers, RoPE on rope.dimension_count of each head)
    falcon-h1 Falcon-H1          attention and Mamba-2 each layer (Mamba-2's tensors as granitehybrid's, q/k rows as
                                 HF's), every multiplier folded into the weights (the embeddings' and the head's too);
                                 the pre-MLP norm named bare (blk.N.ffn_norm); the gated norm where ssm_norm is there
    jamba    Jamba               attention where head_count_kv (a layer) is not 0, Mamba-1 elsewhere (mamba's tensors
                                 and its dt / B / C norms as ssm_dt_norm / ssm_b_norm / ssm_c_norm), experts where
                                 ffn_gate_inp is (qwen2moe's 3-D tensors): read back as periods and offsets
    mamba    Mamba-1             a block a layer under `backbone`: its norm as attn_norm, the mixer as ssm_in /
                                 ssm_conv1d (squeezed) / ssm_x / ssm_dt / ssm_a (-exp(A_log)) / ssm_d / ssm_out;
                                 Falcon Mamba's norms of dt, B and C as ssm.dt_b_c_rms
    mamba2   Mamba-2             nemotron_h's Mamba-2 blocks alone (no attention keys: head_count 0)
    nemotron_h Nemotron-H        a block a layer, under `backbone`: its norm as attn_norm, then Mamba-2 as
                                 granitehybrid's, attention (q/k rows permuted, no RoPE) where head_count_kv (a
                                 layer) is not 0, a squared-ReLU MLP (ffn_up / ffn_down) where feed_forward_length
                                 (a layer) is not 0
    nemotron_h_moe Nemotron 3 Nano as nemotron_h with experts where feed_forward_length (a layer) is not 0:
                                 squared-ReLU experts ffn_up_exps / ffn_down_exps, the router ffn_gate_inp and its
                                 choice bias exp_probs_b.bias, the shared MLP ffn_*_shexp; DeepSeek-V3's router keys

What the metadata leaves out, llama.cpp fixes in its loader (llama-model.cpp), and so do we:
Gemma 2 / 3 alternate sliding and global layers every 2nd / 6th layer, Gemma 3's sliding layers
use RoPE base 10000, and both scale queries by head_dim ** -0.5 except the 27B models
(46 / 62 layers), which use (hidden / heads) ** -0.5; SmolLM3 leaves RoPE out of every 4th layer
(llama.cpp's n_no_rope_layer_step, written nowhere in the file); Llama 4 attends in chunks of 8192 tokens with
RoPE, without RoPE every 4th layer, its queries there scaled by 1 + 0.1 log(floor((pos + 1) / 8192) + 1), q and
k RMS-normed after RoPE except with 128 experts (Maverick). llama.cpp's MoE routers default otherwise
than HF's configs (no groups, leading dense layers, renormalisation or scaling where the keys are missing;
softmax for ERNIE 4.5 and Hunyuan MoE whatever the file says; for deepseek2, softmax unless it says otherwise);
a router HF cannot run so is refused. MiniCPM3's scales are llama.cpp's graph's constants.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import gguf
import numpy as np

from .gguf_meta import meta
from .source import ModelLoadError

def _mlp(module: str, kind: str = "") -> dict[str, str]:
    """GGUF ffn_gate / ffn_up / ffn_down keys (`kind` "_shexp": a shared MLP's) -> `module`'s gate_proj / up_proj /
    down_proj."""
    return {f"ffn_{p}{kind}": f"{module}.{p}_proj" for p in ("gate", "up", "down")}


LLAMA_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
LLAMA_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# GGUF 3-D expert tensors -> each expert's HF name ({j}: the expert), and the router.
MIXTRAL_EXPERTS = {"ffn_gate_exps": "block_sparse_moe.experts.{j}.w1", "ffn_up_exps": "block_sparse_moe.experts.{j}.w3",
                   "ffn_down_exps": "block_sparse_moe.experts.{j}.w2"}
QWEN_EXPERTS = {"ffn_gate_exps": "mlp.experts.{j}.gate_proj", "ffn_up_exps": "mlp.experts.{j}.up_proj",
                "ffn_down_exps": "mlp.experts.{j}.down_proj"}
OLMOE_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
               **QK_NORMS, "ffn_gate_inp": "mlp.gate"}
SMALLTHINKER_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
                      "ffn_gate_inp": "block_sparse_moe.primary_router"}
QWEN_MOE_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
                  "ffn_gate_inp": "mlp.gate", **_mlp("mlp.shared_expert", "_shexp"),
                  "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}
QWEN35_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"}, **QK_NORMS,
                "post_attention_norm": "post_attention_layernorm", "attn_qkv": "linear_attn.in_proj_qkv",
                "attn_gate": "linear_attn.in_proj_z", "ssm_beta": "linear_attn.in_proj_b",
                "ssm_alpha": "linear_attn.in_proj_a", "ssm_a": "linear_attn.A_log",
                "ssm_dt.bias": "linear_attn.dt_bias", "ssm_conv1d": "linear_attn.conv1d",
                "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj"}
QWEN35_MOE_LAYER = {**{k: v for k, v in QWEN35_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
                    **{k: v for k, v in QWEN_MOE_LAYER.items() if k.startswith("ffn_")}}
GEMMA_LAYER = {**LLAMA_LAYER, **QK_NORMS, "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Gemma 4: Gemma's names, norms stored as they are (x * w), the per-layer embedding's gate, projection and norm,
# and the layer's output scale (HF's layer_scalar, a [1] tensor the converter names .weight)
GEMMA4_LAYER = {**GEMMA_LAYER, "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection",
                "post_norm": "post_per_layer_input_norm", "layer_output_scale.weight": "layer_scalar",
                # 26B-A4B's experts: the router (its input scale as ffn_gate_inp.scale, per_expert_scale as
                # ffn_down_exps.scale), transformers' 3-D gate_up_proj / down_proj, the norms around them
                "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
                "ffn_down_exps.scale": "router.per_expert_scale", "ffn_gate_up_exps.weight": "experts.gate_up_proj",
                "ffn_down_exps.weight": "experts.down_proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
                "post_ffw_norm_1": "post_feedforward_layernorm_1", "post_ffw_norm_2": "post_feedforward_layernorm_2"}
GEMMA4_GLOBAL = {**LLAMA_GLOBAL, "per_layer_token_embd": "model.embed_tokens_per_layer",
                 "per_layer_model_proj": "model.per_layer_model_projection",
                 "per_layer_proj_norm": "model.per_layer_projection_norm"}
# Gemma 3n: Gemma 4's per-layer-input names, AltUp's and LAuReL's; its stacked AltUp projections are global 3-D
# tensors, read back one HF Linear an index (GGUFArch.stacked)
GEMMA3N_LAYER = {**GEMMA_LAYER, "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection",
                 "post_norm": "post_per_layer_input_norm", "altup_correct_scale.weight": "altup.correct_output_scale",
                 "altup_correct_coef": "altup.correction_coefs", "altup_predict_coef": "altup.prediction_coefs",
                 "altup_router": "altup.modality_router", "altup_router_norm": "altup.router_norm",
                 "laurel_l": "laurel.linear_left", "laurel_r": "laurel.linear_right",
                 "laurel_post_norm": "laurel.post_laurel_norm"}
LFM2_LAYER = {**LLAMA_LAYER, "attn_output": "self_attn.out_proj", "attn_q_norm": "self_attn.q_layernorm",
              "attn_k_norm": "self_attn.k_layernorm", "attn_norm": "operator_norm", "ffn_norm": "ffn_norm",
              "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
              "shortconv.conv": "conv.conv", "shortconv.in_proj": "conv.in_proj", "shortconv.out_proj": "conv.out_proj"}
LFM2_GLOBAL = {**LLAMA_GLOBAL, "token_embd_norm": "model.embedding_norm"}
LFM2_MOE_LAYER = {**LFM2_LAYER, "ffn_gate_inp": "feed_forward.gate", "exp_probs_b.bias": "feed_forward.expert_bias"}
LFM2_EXPERTS = {"ffn_gate_exps": "feed_forward.experts.{j}.w1", "ffn_up_exps": "feed_forward.experts.{j}.w3",
                "ffn_down_exps": "feed_forward.experts.{j}.w2"}
PHI3_LAYER = {"attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
# attn_qkv (ChatGLM's own checkpoints) by GGUFArch.parts; q, k and v apart as the converter writes transformers' Glm
CHATGLM_LAYER = {**{k: v for k, v in PHI3_LAYER.items() if k != "attn_qkv"},
                 **{k: LLAMA_LAYER[k] for k in ("attn_q", "attn_k", "attn_v")}}
GRANITE_SWA_LAYER = {**LLAMA_LAYER, "attn_sinks.weight": "self_attn.sinks", "ffn_gate_inp": "block_sparse_moe.router",
                     "ffn_gate_up_exps.weight": "block_sparse_moe.experts.gate_up_proj",
                     "ffn_down_exps.weight": "block_sparse_moe.experts.down_proj",
                     "ffn_up_shexp": "shared_mlp.input_linear", "ffn_down_shexp": "shared_mlp.output_linear"}
BITNET_LAYER = {**LLAMA_LAYER, "attn_sub_norm": "self_attn.attn_sub_norm", "ffn_sub_norm": "mlp.ffn_sub_norm"}
BITNET_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
DBRX_LAYER = {"attn_norm": "norm_attn_norm.norm_1", "attn_qkv": "norm_attn_norm.attn.Wqkv",
              "attn_output": "norm_attn_norm.attn.out_proj", "attn_output_norm": "norm_attn_norm.norm_2",
              "ffn_gate_inp": "ffn.router.layer", "ffn_gate_exps.weight": "ffn.experts.mlp.w1",
              "ffn_up_exps.weight": "ffn.experts.mlp.v1", "ffn_down_exps.weight": "ffn.experts.mlp.w2"}
DBRX_GLOBAL = {"token_embd": "transformer.wte", "output_norm": "transformer.norm_f", "output": "lm_head"}
PHIMOE_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
                "ffn_gate_inp": "block_sparse_moe.gate"}
OLMO2_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k not in ("attn_norm", "ffn_norm")}, **QK_NORMS,
               "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
SEED_OSS_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"},
                  "post_attention_norm": "post_attention_layernorm"}
HUNYUAN_LAYER = {**LLAMA_LAYER, "attn_q_norm": "self_attn.query_layernorm", "attn_k_norm": "self_attn.key_layernorm"}
PHI2_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2",
              "attn_norm": "input_layernorm"}
PHI2_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.final_layernorm", "output": "lm_head"}
STARCODER2_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k != "ffn_gate"}, "ffn_up": "mlp.c_fc",
                    "ffn_down": "mlp.c_proj"}
GLM4_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k != "ffn_gate"}, "ffn_up": "mlp.gate_up_proj",
              "post_attention_norm": "post_self_attn_layernorm", "post_ffw_norm": "post_mlp_layernorm"}
NEOX_LAYER = {"attn_qkv": "attention.query_key_value", "attn_output": "attention.dense", "ffn_up": "mlp.dense_h_to_4h",
              "ffn_down": "mlp.dense_4h_to_h", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
NEOX_GLOBAL = {"token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm", "output": "embed_out"}
GRANITE_MOE_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
                     "ffn_gate_inp": "block_sparse_moe.router.layer", "ffn_down_exps": "block_sparse_moe.output_linear",
                     "ffn_down_shexp": "shared_mlp.output_linear"}
# Mamba-2's tensors (llama.cpp's Mamba2Model) under a layer's `{m}` module, and the values it changed
MAMBA2_LAYER = {"ssm_in": "{m}.in_proj", "ssm_conv1d": "{m}.conv1d", "ssm_dt.bias": "{m}.dt_bias", "ssm_a": "{m}.A_log",
                "ssm_d": "{m}.D", "ssm_norm": "{m}.norm", "ssm_out": "{m}.out_proj"}
MAMBA2_FLATTENED = ("ssm_a", "ssm_d", "ssm_norm")


_MAMBA2_A = {"ssm_a": lambda a: np.log(-a)}


def mamba2_layer(module: str) -> dict[str, str]:
    return {k: v.format(m=module) for k, v in MAMBA2_LAYER.items()}


NEMOTRON_H_LAYER = {"attn_norm": "norm", **mamba2_layer("mixer"), "attn_q": "mixer.q_proj", "attn_k": "mixer.k_proj",
                    "attn_v": "mixer.v_proj", "attn_output": "mixer.o_proj", "ffn_up": "mixer.up_proj",
                    "ffn_down": "mixer.down_proj"}
NEMOTRON_H_MOE_LAYER = {**NEMOTRON_H_LAYER, "ffn_gate_inp": "mixer.gate",
                        "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
                        "ffn_up_shexp": "mixer.shared_experts.up_proj",
                        "ffn_down_shexp": "mixer.shared_experts.down_proj"}
NEMOTRON_H_EXPERTS = {"ffn_up_exps": "mixer.experts.{j}.up_proj", "ffn_down_exps": "mixer.experts.{j}.down_proj"}
MAMBA1_LAYER = {"attn_norm": "norm", **{k: v for k, v in mamba2_layer("mixer").items() if k != "ssm_dt.bias"},
                "ssm_x": "mixer.x_proj", "ssm_dt": "mixer.dt_proj"}      # (dt_proj's bias, as it is: ssm_dt.bias)
FALCON_H1_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k not in ("ffn_norm",)}, **mamba2_layer("mamba"),
                   "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
                   "ffn_down": "feed_forward.down_proj", "ffn_norm": "pre_ff_layernorm.weight"}   # (named bare)
JAMBA_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k not in ("ffn_norm", "ffn_gate", "ffn_up", "ffn_down")},
               "ffn_norm": "pre_ff_layernorm", "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
               "ffn_down": "feed_forward.down_proj", "ffn_gate_inp": "feed_forward.router",
               **{k: v.replace("mixer.", "mamba.") for k, v in MAMBA1_LAYER.items() if k != "attn_norm"},
               **{f"ssm_{x}_norm": f"mamba.{x}_layernorm" for x in ("dt", "b", "c")}}
BACKBONE_GLOBAL = {"token_embd": "backbone.embeddings", "output_norm": "backbone.norm_f", "output": "lm_head"}
GRANITE_MOE_JOINED = {"block_sparse_moe.input_linear": ("ffn_gate_exps", "ffn_up_exps"),
                      "shared_mlp.input_linear": ("ffn_gate_shexp", "ffn_up_shexp")}
STEP35_LAYER = {**LLAMA_LAYER, **QK_NORMS, "attn_gate": "self_attn.g_proj", "ffn_gate_inp": "moe.gate",
                "exp_probs_b.bias": "moe.router_bias", "ffn_gate_exps": "moe.gate_proj", "ffn_up_exps": "moe.up_proj",
                "ffn_down_exps": "moe.down_proj", **_mlp("share_expert", "_shexp")}
OPENELM_LAYER = {"attn_qkv": "attn.qkv_proj", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm",
                 "attn_output": "attn.out_proj", "ffn_down": "ffn.proj_2", "attn_norm": "attn_norm",
                 "ffn_norm": "ffn_norm"}
OPENELM_GLOBAL = {"token_embd": "transformer.token_embeddings", "output_norm": "transformer.norm"}
FALCON_LAYER = {"attn_qkv": "self_attention.query_key_value", "attn_output": "self_attention.dense",
                "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h", "attn_norm": "input_layernorm",
                "attn_norm_2": "ln_attn"}          # two norms: attn_norm is the MLP's (ln_mlp; renames)
FALCON_GLOBAL = {"token_embd": "transformer.word_embeddings", "output_norm": "transformer.ln_f", "output": "lm_head"}
# DeepSeek-V3-style MoE layers: router, choice bias (exp_probs_b, a bias without .bias in HF), shared experts;
# the dense leading layers keep LLAMA_LAYER's ffn_gate / ffn_up / ffn_down.
ROUTED_LAYER = {**LLAMA_LAYER, **QK_NORMS, "ffn_gate_inp": "mlp.gate",
                "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
                **_mlp("mlp.shared_experts", "_shexp")}
AFMOE_LAYER = {**ROUTED_LAYER, "ffn_norm": "pre_mlp_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_mlp_layernorm", "attn_gate": "self_attn.gate_proj",
               "ffn_gate_inp": "mlp.router.gate", "exp_probs_b.bias": "mlp.expert_bias"}
LAGUNA_LAYER = {**{k: v for k, v in ROUTED_LAYER.items() if "shexp" not in k}, "attn_gate": "self_attn.g_proj",
                "exp_probs_b.bias": "mlp.experts.e_score_correction_bias", **_mlp("mlp.shared_expert", "_shexp")}
MIMO2_LAYER = {**{k: v for k, v in ROUTED_LAYER.items() if k not in QK_NORMS and "shexp" not in k},
               "attn_sinks.weight": "self_attn.attention_sink_bias"}
GLM4_MOE_LAYER = {**{k: v for k, v in ROUTED_LAYER.items() if k != "ffn_norm"},
                  "post_attention_norm": "post_attention_layernorm"}
ERNIE_MOE_LAYER = {**{k: v for k, v in ROUTED_LAYER.items() if k not in QK_NORMS},
                   "exp_probs_b.bias": "mlp.moe_statics.e_score_correction_bias"}
HUNYUAN_MOE_LAYER = {**HUNYUAN_LAYER, "ffn_gate_inp": "mlp.gate.wg", **_mlp("mlp.shared_mlp", "_shexp")}
GPT_OSS_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k.startswith("attn_")},
                 "post_attention_norm": "post_attention_layernorm", "attn_sinks.weight": "self_attn.sinks",
                 "ffn_gate_inp": "mlp.router", "ffn_down_exps.weight": "mlp.experts.down_proj",
                 "ffn_down_exps.bias": "mlp.experts.down_proj_bias"}
COHERE2_MOE_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"}, "ffn_gate_inp": "mlp.gate",
                     **_mlp("mlp.shared_experts", "_shexp")}
XIELU = {f"mlp.act_fn.{p}": f"xielu.{p}" for p in ("alpha_n", "alpha_p", "beta", "eps")}
LLAMA4_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k.startswith(("attn_", "ffn_norm"))},
                **_mlp("feed_forward"), **_mlp("feed_forward.shared_expert", "_shexp"),
                "ffn_gate_inp": "feed_forward.router", "ffn_down_exps.weight": "feed_forward.experts.down_proj"}
MINIMAX_M2_LAYER = {**OLMOE_LAYER, "ffn_gate_inp": "block_sparse_moe.gate",
                    "exp_probs_b.bias": "block_sparse_moe.e_score_correction_bias"}
MINIMAX_M3_LAYER = {**MINIMAX_M2_LAYER, **_mlp("mlp"), **_mlp("block_sparse_moe.shared_experts", "_shexp"),
                    **{f"indexer.{x}": f"self_attn.index_{x}" for x in ("q_proj", "k_proj", "q_norm", "k_norm")}}
# Multi-head latent attention (models/mla.py): queries by q_proj or through a latent (q_a / q_b), the kv latent with
# the shared rotated key part (kv_a_mqa) and its up-projection kv_b_proj, stored whole (attn_kv_b) or split by
# heads for llama.cpp's weight absorption (attn_k_b / attn_v_b: GGUFArch.by_head).
MLA_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k not in ("attn_k", "attn_v")},
             "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
             "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
             "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_kv_b": "self_attn.kv_b_proj"}
DEEPSEEK2_LAYER = {**{k: v for k, v in ROUTED_LAYER.items() if k not in ("attn_k", "attn_v", *QK_NORMS)}, **MLA_LAYER}
BAILING_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_qkv": "attention.query_key_value", "attn_q_norm": "attention.query_layernorm",
                 "attn_k_norm": "attention.key_layernorm", "attn_output": "attention.dense", **_mlp("mlp"),
                 "ffn_gate_inp": "mlp.gate", "exp_probs_b.bias": "mlp.gate.expert_bias",
                 **_mlp("mlp.shared_experts", "_shexp")}
BLOOM_LAYER = {"attn_norm": "input_layernorm", "attn_qkv": "self_attention.query_key_value",
               "attn_output": "self_attention.dense", "ffn_norm": "post_attention_layernorm",
               "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"}
BLOOM_GLOBAL = {"token_embd": "transformer.word_embeddings", "token_embd_norm": "transformer.word_embeddings_layernorm",
                "output_norm": "transformer.ln_f", "output": "lm_head"}
MPT_LAYER = {"attn_norm": "norm_1", "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "ffn_norm": "norm_2",
             "ffn_up": "ffn.up_proj", "ffn_down": "ffn.down_proj"}
MPT_GLOBAL = {"token_embd": "transformer.wte", "output_norm": "transformer.norm_f", "output": "lm_head"}
LING3_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               **{f"attn_{x}": f"attention.{x}_proj" for x in "qkv"}, "attn_output": "attention.dense",
               **{f"ssm_conv1d_{x}": f"attention.{x}_conv1d" for x in "qkv"}, "ssm_f_a": "attention.f_proj",
               "ssm_g_a": "attention.g_proj", "attn_gate": "attention.g_proj", "ssm_beta": "attention.b_proj",
               "ssm_a": "attention.A_log", "ssm_dt.bias": "attention.dt_bias", "ssm_norm": "attention.o_norm",
               "attn_q_a": "attention.q_a_proj", "attn_q_a_norm": "attention.q_a_layernorm",
               "attn_q_b": "attention.q_b_proj", "attn_kv_a_mqa": "attention.kv_a_proj_with_mqa",
               "attn_kv_a_norm": "attention.kv_a_layernorm", "attn_kv_b": "attention.kv_b_proj", **_mlp("mlp"),
               "ffn_gate_inp": "mlp.gate", "exp_probs_b.bias": "mlp.gate.expert_bias",
               **_mlp("mlp.shared_experts", "_shexp")}
KIMI_LINEAR_LAYER = {**MLA_LAYER, "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                     **{f"ssm_conv1d_{x}": f"self_attn.{x}_conv1d" for x in "qkv"},
                     **{f"ssm_{x}": f"self_attn.{x}_proj" for x in ("f_a", "f_b", "g_a", "g_b")},
                     "ssm_beta": "self_attn.b_proj", "ssm_a": "self_attn.A_log", "ssm_dt.bias": "self_attn.dt_bias",
                     "ssm_norm": "self_attn.o_norm", "ffn_gate_inp": "block_sparse_moe.gate",
                     "exp_probs_b.bias": "block_sparse_moe.gate.e_score_correction_bias",
                     **_mlp("block_sparse_moe.shared_experts", "_shexp")}
# DeepSeek Sparse Attention's lightning indexer (read by name, unread by kiln: models/deepseek.py deepseek_v32)
DSA_LAYER = {**DEEPSEEK2_LAYER, "indexer.k_norm": "self_attn.indexer.k_norm",
             "indexer.proj": "self_attn.indexer.weights_proj", "indexer.attn_k": "self_attn.indexer.wk",
             "indexer.attn_q_b": "self_attn.indexer.wq_b"}
GPT2_LAYER = {"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_up": "mlp.c_fc",
              "ffn_down": "mlp.c_proj", "attn_norm": "ln_1", "ffn_norm": "ln_2"}
EXAONE_LAYER = {"attn_q": "attn.attention.q_proj", "attn_k": "attn.attention.k_proj", "attn_v": "attn.attention.v_proj",
                "attn_output": "attn.attention.out_proj", "ffn_gate": "mlp.c_fc_0", "ffn_up": "mlp.c_fc_1",
                "ffn_down": "mlp.c_proj", "attn_norm": "ln_1", "ffn_norm": "ln_2"}
QWEN_LAYER = {"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_gate": "mlp.w2", "ffn_up": "mlp.w1",
              "ffn_down": "mlp.c_proj", "attn_norm": "ln_1", "ffn_norm": "ln_2"}
EXAONE_GLOBAL = {"token_embd": "transformer.wte", "output_norm": "transformer.ln_f", "output": "lm_head"}
GPT2_GLOBAL = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output_norm": "transformer.ln_f",
               "output": "lm_head"}


@dataclass(frozen=True)
class GGUFArch:
    """How one GGUF architecture maps to Hugging Face."""

    model_type: str
    architectures: tuple[str, ...]
    layer_names: dict[str, str]                     # blk.N.<key> -> <layer prefix>.N.<value>; a key with its
                                                    # .weight / .bias (exp_probs_b.bias) maps the whole name
    global_names: dict[str, str] = field(default_factory=lambda: dict(LLAMA_GLOBAL))
    layer_prefix: str = "model.layers"
    permuted: bool = False                          # llama.cpp permuted q/k rows for its RoPE
    norm_shift: float = 0.0                         # added to every *norm.weight by the converter
    transposed: tuple[str, ...] = ()                # GGUF keys whose HF weight is [in, out] (Conv1D; gpt-oss's
                                                    # experts, [experts, in, out])
    experts: dict[str, str] = field(default_factory=dict)   # 3-D expert tensors: GGUF key -> HF name with {j}
    also: tuple[str, ...] = ()                      # other HF model types its metadata can describe
    by_kind: tuple[str, ...] = ()                   # GGUF keys whose per-head [q, k, v] rows llama.cpp
                                                    # regrouped to [every q, every k, every v] (GPT-NeoX)
    by_group: tuple[str, ...] = ()                  # GGUF keys whose per-kv-group [its q heads, k, v] rows
                                                    # llama.cpp regrouped to [every q, k, v] (Falcon)
    config: Callable[[gguf.GGUFReader, str, dict, dict], None] = lambda reader, arch, tensors, c: None
    renames: Callable[[dict], dict[str, str]] = lambda c: {}   # layer_names that differ by the HF config read
    joined: dict[str, tuple[str, str]] = field(default_factory=dict)   # HF name under a layer -> the two GGUF
                                                    # keys the converter split it into (rows: first, then second)
    joins: Callable[[dict], dict[str, tuple[str, str]]] = lambda c: {}   # joined that differ by the HF config read
    blocks: int | None = None                       # blk.N read for N below it (for_config: the HF layers)
    squeezed: tuple[str, ...] = ()                  # GGUF keys whose HF tensor has a 1 at axis 1 the converter
                                                    # squeezed out (LFM2's conv weight [hidden, 1, taps])
    stacked: dict[str, str] = field(default_factory=dict)   # global 3-D GGUF tensors -> the HF name of each index
                                                    # ({j}): Gemma 3n's altup_proj stacks 3 Linears
    interleaved: dict[str, tuple[str, str]] = field(default_factory=dict)   # HF name under a layer -> the two GGUF
                                                    # keys the converter split its interleaved outputs into, each
                                                    # [experts, out, in]: read back as HF's [experts, in, 2 out]
                                                    # (gpt-oss's gate_up_proj, the first's rows even) and <name>_bias
    from_metadata: dict[str, str] = field(default_factory=dict)   # HF name under a layer -> the metadata key
                                                    # whose array holds its one value a layer (Apertus's xielu.*)
    concatenated: dict[str, tuple[str, str]] = field(default_factory=dict)   # as interleaved, for outputs the first
                                                    # key's, then the second's (Llama 4's experts' gate_up_proj)
    by_head: dict[str, tuple[str, str]] = field(default_factory=dict)  # HF name under a layer -> the two GGUF keys
                                                    # the converter split each head's rows into, the first stored
                                                    # transposed ([heads, cols, rows]: DeepSeek's kv_b_proj)
    unshifted: tuple[str, ...] = ()                 # GGUF *norm keys norm_shift spares (Qwen3.5's ssm_norm)
    values: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)   # GGUF key -> the HF
                                                    # values from the stored ones (Qwen3.5's ssm_a: -exp(A_log))
    reorder: Callable[[dict], dict[str, tuple[int, np.ndarray]]] = lambda c: {}   # GGUF key -> (axis, the HF order
                                                    # of its indices there) by the HF config read (Qwen3.5's V heads)
    reordered: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)    # reorder's, once for_config ran
    flattened: tuple[str, ...] = ()                 # GGUF keys whose HF tensor is 1-D, the converter's reshaped
                                                    # (Mamba-2's A and D [heads, 1], its norm [groups, width])
    parts: Callable[[dict], dict[str, dict[str, np.ndarray]]] = lambda c: {}   # GGUF key -> {HF name under a
                                                    # layer: the rows of it that tensor is} by the HF config read
                                                    # (Qwen3-Next's ssm_ba: in_proj_b's rows and in_proj_a's)
    parted: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)   # parts', once for_config ran
    weight_scales: tuple[str, ...] = ()             # GGUF keys whose Linear's output llama.cpp multiplies by the
                                                    # one-value <key>.scale where stored: read as HF's
                                                    # <name>.weight_scale, 1 where not (BitNet's AutoBitLinear)
    merged: tuple[str, ...] = ()                    # GGUF keys whose HF tensor is 2-D, the converter's [experts,
                                                    # rows, cols] view of it (DBRX's w1 / v1 / w2: [experts x ffn,
                                                    # d_model]); read after any transposition

    block_renames: Callable[[dict], dict[str, str]] = lambda c: {}   # blk.N.<key> -> its HF name under layer N where
                                                    # that layer's differs from layer_names' by the HF config read
                                                    # (Nemotron-NAS's Linear in attention's place: attn_output)
    renamed_blocks: dict[str, str] = field(default_factory=dict)   # block_renames', once for_config ran
    whole_names: dict[str, str] = field(default_factory=dict)   # GGUF tensor names with neither block nor suffix
                                                    # -> their HF name (HRM-Text's hrm.z_l_init)

    def for_config(self, c: dict) -> "GGUFArch":
        """This architecture's mapping for the HF config its metadata gave: renames and joins applied, and the blocks
        after num_hidden_layers (GLM-4.5's and K-EXAONE's multi-token-prediction layers, which the HF model
        does not run) left unread."""
        return dataclasses.replace(self, layer_names={**self.layer_names, **self.renames(c)},
                                   joined={**self.joined, **self.joins(c)}, blocks=c.get("num_hidden_layers"),
                                   reordered=self.reorder(c), parted=self.parts(c),
                                   renamed_blocks=self.block_renames(c))


def _key(reader: gguf.GGUFReader, arch: str, name: str, default=None):
    return meta(reader, f"{arch}.{name}", default)


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _head_dim(reader, arch: str, c: dict) -> None:
    """The head size: attention.key_length, else the first attention layer's attn_q rows over the heads (what
    llama.cpp's hidden / heads default must match), else rope.dimension_count (which is less where RoPE rotates
    part of each head: Bamba's)."""
    q = next((t for t in reader.tensors if re.fullmatch(r"blk\.\d+\.attn_q\.weight", t.name)), None)
    head_dim = _key(reader, arch, "attention.key_length")
    if head_dim is None and q is not None:
        head_dim = int(q.shape[-1]) // c["num_attention_heads"]
        head_dim = None if head_dim == c["hidden_size"] // c["num_attention_heads"] else head_dim   # the default
    elif head_dim is None:
        head_dim = _key(reader, arch, "rope.dimension_count")
    if head_dim:
        c["head_dim"] = head_dim


def rope_scaling(reader, arch: str) -> dict | None:
    """rope.scaling.* -> HF rope_scaling: linear, or YaRN (factor, the pretraining context, its betas
    where written); none, or a factor of 1, is None. A factor without a type is linear, as llama.cpp reads it (its
    default type; the older key rope.scale_linear too). llama.cpp's attn_factor multiplies YaRN's own
    attention factor; a file that sets it is refused rather than guessed at."""
    kind = _key(reader, arch, "rope.scaling.type") or "linear"
    factor = _key(reader, arch, "rope.scaling.factor")
    if factor is None:
        factor = _key(reader, arch, "rope.scale_linear")
    if kind == "none" or factor in (None, 0.0, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _f32(factor)}
    attn_factor = _key(reader, arch, "rope.scaling.attn_factor", 1.0)
    original = _key(reader, arch, "rope.scaling.original_context_length")
    if kind == "yarn" and original and attn_factor == 1.0:
        scaling = {"rope_type": "yarn", "factor": _f32(factor), "original_max_position_embeddings": original}
        for hf_key, key in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if (value := _key(reader, arch, key)) is not None:
                scaling[hf_key] = _f32(value)
        return scaling
    raise ModelLoadError(f"GGUF rope.scaling.type {kind!r} (original context {original}, attn_factor {attn_factor}) "
                         f"is not supported for {arch} (supported: linear; yarn with original_context_length and "
                         "attn_factor 1); load the original Hugging Face checkpoint instead")


def _llama(reader, arch, tensors, c):
    _head_dim(reader, arch, c)
    if (window := _key(reader, arch, "attention.sliding_window")):     # Mistral
        c.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=window)
    if _key(reader, arch, "expert_count"):                             # Mixtral
        c.update(model_type="mixtral", architectures=["MixtralForCausalLM"],
                 num_local_experts=_key(reader, arch, "expert_count"),
                 num_experts_per_tok=_key(reader, arch, "expert_used_count"))
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors
    _llama3_or_scaling(reader, arch, tensors, c)


def _mistral3(reader, arch, tensors, c):
    """Ministral 3 (llama.cpp's mistral3): a Llama with YaRN whose attention factor takes mscale 1 and
    yarn_log_multiplier as mscale_all_dim (llama.cpp's rule), the queries' temperature from
    attention.temperature_scale over the pretraining context."""
    _llama(reader, arch, tensors, c)
    scaling = dict(c.get("rope_scaling") or {})
    if scaling.get("rope_type") != "yarn":
        raise ModelLoadError(f"this {arch} GGUF has no YaRN rope.scaling.*, which Ministral 3 runs with; re-convert "
                             "the model")
    if (log_mul := _key(reader, arch, "rope.scaling.yarn_log_multiplier")) is not None:
        scaling.update(mscale=1.0, mscale_all_dim=_f32(log_mul))
    if (beta := _key(reader, arch, "attention.temperature_scale")) is not None:
        scaling["llama_4_scaling_beta"] = _f32(beta)
    c["rope_scaling"] = scaling


def _afmoe(reader, arch, tensors, c):
    """AFMoE (Arcee's Trinity) as llama.cpp's graph runs it and transformers' model computes: sigmoid scores with
    the choice bias, renormalised, times expert_weights_scale; the leading dense layers; 3 sliding layers with RoPE
    to each global one without (every 4th: the graph's fixed step); the embeddings times sqrt(hidden) (muP, which
    the graph always applies). A file that says otherwise is refused."""
    _head_dim(reader, arch, c)
    sigmoid = gguf.ExpertGatingFuncType.SIGMOID
    gating, norm = _key(reader, arch, "expert_gating_func", sigmoid), _key(reader, arch, "expert_weights_norm", True)
    window = _key(reader, arch, "attention.sliding_window")
    pattern = _key(reader, arch, "attention.sliding_window_pattern")
    if gating != sigmoid or not norm or not window or pattern not in (None, 4):
        raise ModelLoadError(f"this {arch} GGUF (gating {gating}, weights norm {norm}, window {window}, pattern "
                             f"{pattern}) is not the sigmoid-routed, renormalised, 3-sliding-to-1-global AFMoE that "
                             "transformers' model computes; re-convert the model")
    c.update(num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             num_shared_experts=_key(reader, arch, "expert_shared_count", 0),
             moe_intermediate_size=_key(reader, arch, "expert_feed_forward_length"),
             num_dense_layers=_key(reader, arch, "leading_dense_block_count", 0),
             route_scale=_f32(_key(reader, arch, "expert_weights_scale", 1.0)), sliding_window=window,
             global_attn_every_n_layers=4, mup_enabled=True)
    _llama3_or_scaling(reader, arch, tensors, c)


def _apertus(reader, arch, tensors, c):
    """Apertus: q/k rows as HF's, per-head q/k norms, the ungated xIELU MLP (its parameters as xielu.* arrays: the
    HF values, each layer's), Llama 3 scaling as rope_freqs.weight."""
    _head_dim(reader, arch, c)
    c.update(hidden_act="xielu", attention_bias="blk.0.attn_q.bias" in tensors,
             mlp_bias="blk.0.ffn_up.bias" in tensors)
    _llama3_or_scaling(reader, arch, tensors, c)


def _llama4(reader, arch, tensors, c):
    """Llama 4's text model as llama.cpp's loader runs it (its graph's constants: chunks of 8192 tokens, NoPE every
    4th layer with the temperature (0.1, 8192), q/k norms unless 128 experts); a file that turns the chunks off
    (sliding_window 0: MobileLLM's, RoPE then on every layer but the last in llama.cpp's graph) is refused."""
    _head_dim(reader, arch, c)
    if _key(reader, arch, "attention.sliding_window") == 0 or _key(reader, arch, "attention.sliding_window_pattern"):
        raise ModelLoadError(f"this {arch} GGUF sets its own attention pattern (attention.sliding_window 0 or a "
                             "sliding_window_pattern), which kiln does not read for Llama 4; load the Hugging Face "
                             "checkpoint instead")
    experts = _key(reader, arch, "expert_count")
    c.update(intermediate_size_mlp=c["intermediate_size"], intermediate_size=_key(reader, arch,
                                                                                  "expert_feed_forward_length"),
             num_local_experts=experts, num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             interleave_moe_layer_step=_key(reader, arch, "interleave_moe_layer_step"), attention_chunk_size=8192,
             no_rope_layer_interval=4, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
             use_qk_norm=experts != 128)
    _llama3_or_scaling(reader, arch, tensors, c)


def _llama3_or_scaling(reader, arch, tensors, c):
    """Llama 3 RoPE scaling from rope_freqs.weight, else rope.scaling.*."""
    if "rope_freqs.weight" in tensors:
        c["rope_scaling"] = llama3_scaling(_tensor_values(tensors["rope_freqs.weight"]), c, reader, arch)
    elif (scaling := rope_scaling(reader, arch)) is not None:
        c["rope_scaling"] = scaling


def _per_layer(value, n: int) -> list:
    """A metadata key that is a value a layer or one for all (head_count, feed_forward_length, ...), a value a layer
    for the first n (the blocks after them: multi-token prediction's)."""
    return list(value)[:n] if isinstance(value, (list, tuple)) else [value] * n


def _deci(reader, arch, tensors, c):
    """Nemotron-NAS (and DeciLM-7B) as llama.cpp's converter writes it and its deci graph runs it: head_count,
    head_count_kv and feed_forward_length a value a layer; a layer of no query heads has no attention (nor its
    norm), one of query heads but no KV heads a Linear in its place (stored as attn_output), one of no MLP width no
    MLP (nor its norm). Read as the HF config's block_configs, each MLP by its width; Llama 3 RoPE scaling as
    rope_freqs.weight."""
    heads, kv, ffn = (_per_layer(c[k], c["num_hidden_layers"])
                      for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"))
    blocks = []
    for i, (h, k, f) in enumerate(zip(heads, kv, ffn)):
        if h and k and h % k:
            raise ModelLoadError(f"this {arch} GGUF gives layer {i} {h} query heads over {k} KV heads, which do not "
                                 "group evenly; re-convert the model")
        attention = {"no_op": True} if not h else {"replace_with_linear": True} if not k else \
            {"n_heads_in_group": h // k}
        blocks.append({"attention": attention, "ffn": {"no_op": True} if not f else {"intermediate_size": f}})
    c.update(model_type="nemotron-nas", num_attention_heads=max(heads), num_key_value_heads=max(kv),
             num_key_value_heads_per_layer=kv, intermediate_size=max(ffn), block_configs=blocks)
    _llama3_or_scaling(reader, arch, tensors, c)


def _openelm(reader, arch, tensors, c):
    """OpenELM as llama.cpp's converter writes it: head_count, head_count_kv and feed_forward_length a value a layer
    (read as OpenELM's config names, the widths as they are), q and k normed a head, the head the embedding."""
    n = c["num_hidden_layers"]
    heads, kv, widths = (_per_layer(c[k], n)
                         for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"))
    c.update(model_dim=c["hidden_size"], num_transformer_layers=n, num_query_heads=heads, num_kv_heads=kv,
             intermediate_size=widths, rope_freq_constant=c["rope_theta"],
             max_context_length=c["max_position_embeddings"],
             share_input_output_layers=True, normalize_qk_projections="blk.0.attn_q_norm.weight" in tensors,
             num_attention_heads=heads[0], num_key_value_heads=kv[0])


def _step35(reader, arch, tensors, c):
    """Step 3.5 as llama.cpp's converter writes it and its step35 graph runs it: head_count a layer (the sliding
    layers' own), one KV head count, the sliding layers by sliding_window_pattern, the full layers' RoPE on half of
    each head at rope.freq_base, the sliding ones' on all of it at rope.freq_base_swa, the softmax scaled by the head
    size (llama.cpp reads no query_pre_attn_scalar), DeepSeek-V3's router without groups as Laguna's (_deepseek_router:
    sigmoid scores, the choice bias, renormalised, which a file must say, times expert_weights_scale, the first
    leading_dense_block_count layers dense), the SwiGLU clamps a layer
    (swiglu_clamp_exp / _shexp), the multi-token-prediction layers (nextn_predict_layers) left unread; the norms
    stored + 1."""
    _nextn(reader, arch, c)
    n = c["num_hidden_layers"]
    per_layer = lambda v: _per_layer(v, n)  # noqa: E731
    heads, kv = per_layer(c["num_attention_heads"]), per_layer(c["num_key_value_heads"])
    if len(set(kv)) > 1:
        raise ModelLoadError(f"this {arch} GGUF gives its layers {sorted(set(kv))} KV heads; Step 3.5 has one count")
    if "rope_freqs.weight" in tensors or _key(reader, arch, "rope.dimension_count") is not None:
        raise ModelLoadError(f"this {arch} GGUF scales or narrows its RoPE (rope_freqs / rope.dimension_count), "
                             "which kiln does not read for Step 3.5 yet; convert the released checkpoint as it is")
    if _key(reader, arch, "moe_every_n_layers", 1) != 1:
        raise ModelLoadError(f"this {arch} GGUF has experts only every {_key(reader, arch, 'moe_every_n_layers')} "
                             "layers (moe_every_n_layers), where Step 3.5 has them in every layer after the dense "
                             "ones; re-convert the model")
    _no_groups(reader, arch)
    _always_renormalised(reader, arch, "Step 3.5")
    _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
    sliding = [bool(s) for s in per_layer(_key(reader, arch, "attention.sliding_window_pattern", [False] * n))]
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    limits = {hf: [float(v) for v in per_layer(_key(reader, arch, key, [0.0] * n))]
              for hf, key in (("swiglu_limits", "swiglu_clamp_exp"), ("swiglu_limits_shared", "swiglu_clamp_shexp"))}
    c.update(model_type="step3p5", num_attention_heads=next((h for h, s in zip(heads, sliding) if not s), heads[0]),
             num_sliding_attention_heads=next((h for h, s in zip(heads, sliding) if s), heads[0]),
             num_key_value_heads=kv[0], layer_types=types,
             sliding_window=_key(reader, arch, "attention.sliding_window"),
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": c["rope_theta"],
                                                 "partial_rotary_factor": 0.5},
                              "sliding_attention": {"rope_type": "default", "rope_theta": _f32(
                                  _key(reader, arch, "rope.freq_base_swa", c["rope_theta"]))}},
             share_expert_dim=_key(reader, arch, "expert_shared_feed_forward_length", 0), **limits)


def _deci_linear_attention(c: dict) -> dict[str, str]:
    return {f"blk.{i}.attn_output": "self_attn.linear_attn" for i, b in enumerate(c["block_configs"])
            if b["attention"].get("replace_with_linear")}


def _exaone(reader, arch, tensors, c):
    _head_dim(reader, arch, c)
    _llama3_or_scaling(reader, arch, tensors, c)


def _qwen3(reader, arch, tensors, c):
    _head_dim(reader, arch, c)
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors


def _no_head_bias(reader, arch, tensors, c):
    """llama.cpp's qwen2vl loader takes an output.bias where a file has one; Qwen2-VL's head has none, nor kiln's."""
    if "output.bias" in tensors:
        raise ModelLoadError(f"this {arch} GGUF's head has a bias (output.bias), which Qwen2-VL's has not and kiln "
                             "does not read; read the Hugging Face checkpoint")


def _sliding_layers(reader, arch, c) -> bool:
    """attention.sliding_window and the per-layer attention.sliding_window_pattern (true: the layer slides)
    as sliding_window and layer_types; False (and no window) where the file has no window."""
    window = _key(reader, arch, "attention.sliding_window")
    c["sliding_window"] = window or None
    if not window:
        return False
    pattern = _key(reader, arch, "attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != c["num_hidden_layers"]:
            raise ModelLoadError(f"GGUF {arch}.attention.sliding_window_pattern lists {len(pattern)} layers for "
                                 f"{c['num_hidden_layers']}; re-convert the model")
        c["layer_types"] = ["sliding_attention" if slides else "full_attention" for slides in pattern]
    return True


def _olmo2(reader, arch, tensors, c):
    """OLMo 2, or OLMo 3 where the file has a window (llama.cpp writes both as olmo2): its full layers by rope.freq_base
    and any rope.scaling, its sliding ones unscaled by rope.freq_base_swa where written (TextModel's, from
    rope_parameters), else the same base."""
    _qwen3(reader, arch, tensors, c)
    if _sliding_layers(reader, arch, c):
        theta = c.pop("rope_theta")
        full = {"rope_type": "default", **(rope_scaling(reader, arch) or {}), "rope_theta": theta}
        local = {"rope_type": "default", "rope_theta": _f32(_key(reader, arch, "rope.freq_base_swa", theta))}
        c.update(model_type="olmo3", architectures=["Olmo3ForCausalLM"],
                 rope_parameters={"full_attention": full, "sliding_attention": local})


def _exaone4(reader, arch, tensors, c):
    """EXAONE 4.0, and EXAONE 4.5's text model, whose converter appends its multi-token-prediction layers (counted in
    block_count, not in the window pattern; left unread)."""
    _nextn(reader, arch, c)
    _qwen3(reader, arch, tensors, c)
    _sliding_layers(reader, arch, c)
    _llama3_or_scaling(reader, arch, tensors, c)


def _seed_oss(reader, arch, tensors, c):
    _qwen3(reader, arch, tensors, c)
    c.update(attention_out_bias="blk.0.attn_output.bias" in tensors, mlp_bias="blk.0.ffn_down.bias" in tensors)


def _qwen_moe(reader, arch, tensors, c):
    """llama.cpp's qwen2moe / qwen3moe (and qwen3vlmoe, Qwen3-VL-MoE's text model): the expert counts and
    sizes; qwen3moe renormalises the top-k weights (its graph's norm_w, Qwen3-MoE's norm_topk_prob),
    qwen2moe does not."""
    qwen3 = arch in ("qwen3moe", "qwen3vlmoe")
    if qwen3:
        _qwen3(reader, arch, tensors, c)
    width = _key(reader, arch, "expert_feed_forward_length")
    if isinstance(width, list):                     # the loader takes one a layer (qwen3vlmoe): kiln, one for all
        if len(set(width)) != 1:
            raise ModelLoadError(f"this {arch} GGUF's experts differ in width from layer to layer ({width}); kiln "
                                 "builds one expert width a model: read the Hugging Face checkpoint")
        width = width[0]
    c.update(num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             moe_intermediate_size=width, norm_topk_prob=qwen3)
    if (shared := _key(reader, arch, "expert_shared_feed_forward_length")):
        c["shared_expert_intermediate_size"] = shared


def _mellum(reader, arch, tensors, c):
    """JetBrains' Mellum as llama.cpp's graph runs it: every layer's MLP experts (softmax, the top k always
    renormalised), per-head q/k norms, partial rotary as rope.dimension_count; with a window, each layer's kind from
    sliding_window_pattern (a list, or every n-th layer full: the loader's set_swa_pattern, 4 unless written) and the
    sliding layers' RoPE base as rope.freq_base_swa (their RoPE unscaled)."""
    _head_dim(reader, arch, c)
    if any(f"blk.{i}.ffn_gate.weight" in tensors for i in range(c["num_hidden_layers"])):
        raise ModelLoadError(f"this {arch} GGUF has dense MLP layers, which llama.cpp's Mellum graph does not run; "
                             "load the Hugging Face checkpoint instead")
    n = c["num_hidden_layers"]
    if _sliding_layers(reader, arch, c) and "layer_types" not in c:
        every = _key(reader, arch, "attention.sliding_window_pattern", 4)
        c["layer_types"] = ["sliding_attention" if every == 0 or i % every < every - 1 else "full_attention"
                            for i in range(n)]
    partial, theta = _rotary_share(reader, arch, c), c.pop("rope_theta")
    local = _f32(_key(reader, arch, "rope.freq_base_swa", theta))
    c.update(num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             moe_intermediate_size=_key(reader, arch, "expert_feed_forward_length"), norm_topk_prob=True,
             rope_parameters={     # transformers' Mellum takes them a layer type
                 "full_attention": {"rope_type": "default", **(rope_scaling(reader, arch) or {}), "rope_theta": theta,
                                    "partial_rotary_factor": partial},
                 "sliding_attention": {"rope_type": "default", "rope_theta": local, "partial_rotary_factor": partial}})


def _qwen35(reader, arch, tensors, c):
    """llama.cpp's Qwen3_5TextModel: the DeltaNet's sizes as ssm.* (group_count: key heads, time_step_rank: value
    heads, state_size: the key head size, inner_size: all value heads' width, conv_kernel), each layer's kind as
    attention.recurrent_layers (true: a DeltaNet layer; the converter's since 2026) where written, else every
    full_attention_interval-th layer full (llama.cpp's loader alike), the rotated share of each head as
    rope.dimension_count; the multi-token-prediction layer the converter keeps from a released checkpoint (counted in
    block_count, nextn_predict_layers) left unread; qwen35moe: qwen2moe's expert keys."""
    _nextn(reader, arch, c)
    value_heads = _key(reader, arch, "ssm.time_step_rank")
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    c.update(linear_num_key_heads=_key(reader, arch, "ssm.group_count"), linear_num_value_heads=value_heads,
             linear_key_head_dim=_key(reader, arch, "ssm.state_size"),
             linear_value_head_dim=_key(reader, arch, "ssm.inner_size") // value_heads,
             linear_conv_kernel_dim=_key(reader, arch, "ssm.conv_kernel"),
             full_attention_interval=_key(reader, arch, "full_attention_interval", 4), head_dim=head_dim,
             partial_rotary_factor=_key(reader, arch, "rope.dimension_count", head_dim // 4) / head_dim)
    recurrent = _key(reader, arch, "attention.recurrent_layers")
    if isinstance(recurrent, list):
        c["layer_types"] = ["linear_attention" if r else "full_attention" for r in recurrent[:c["num_hidden_layers"]]]
    if arch in ("qwen35moe", "qwen3next"):
        _qwen_moe(reader, arch, tensors, c)
        c.pop("norm_topk_prob")


def _qwen3next_ba(c: dict) -> dict[str, dict[str, np.ndarray]]:
    """Qwen3-Next's in_proj_ba, which llama.cpp stores as it is (ssm_ba: a key head's b rows, then its a rows, for
    each key head), as Qwen3.5's in_proj_b and in_proj_a (the value heads' rows in HF's order)."""
    hk, r = c["linear_num_key_heads"], c["linear_num_value_heads"] // c["linear_num_key_heads"]
    rows = np.arange(hk * 2 * r).reshape(hk, 2, r)
    return {"ssm_ba": {"linear_attn.in_proj_b": rows[:, 0].ravel(), "linear_attn.in_proj_a": rows[:, 1].ravel()}}


def _qwen35_v_order(c: dict) -> dict[str, tuple[int, np.ndarray]]:
    """The HF order of the DeltaNet tensors' V-head indices llama.cpp tiled: HF groups the value heads by key head
    ([k0's v0..v(r-1), k1's ...]), the converter stores them tiled ([k0's v0, k1's v0, ..., k0's v1, ...])."""
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    if hk == hv:
        return {}
    r = hv // hk

    def heads(d: int, before: int = 0) -> np.ndarray:      # grouped position g * r + j <- tiled j * hk + g
        tiled = [j * hk + g for g in range(hk) for j in range(r)]
        return np.concatenate([np.arange(before), before + (np.array(tiled)[:, None] * d + np.arange(d)).ravel()])
    qk, dv = 2 * hk * c["linear_key_head_dim"], c["linear_value_head_dim"]
    return {"attn_qkv": (0, heads(dv, qk)), "ssm_conv1d": (0, heads(dv, qk)), "attn_gate": (0, heads(dv)),
            "ssm_beta": (0, heads(1)), "ssm_alpha": (0, heads(1)), "ssm_a": (0, heads(1)), "ssm_dt": (0, heads(1)),
            "ssm_out": (1, heads(dv))}


def _gemma(pattern: int, layers_27b: int):
    def config(reader, arch, tensors, c):
        head_dim = _key(reader, arch, "attention.key_length") or c["hidden_size"] // c["num_attention_heads"]
        big = c["num_hidden_layers"] == layers_27b                     # llama.cpp's LLM_TYPE_27B
        c.update(head_dim=head_dim, hidden_activation="gelu_pytorch_tanh",
                 tie_word_embeddings="output.weight" not in tensors,
                 query_pre_attn_scalar=c["hidden_size"] // c["num_attention_heads"] if big else head_dim,
                 attn_logit_softcapping=_key(reader, arch, "attn_logit_softcapping"),
                 final_logit_softcapping=_key(reader, arch, "final_logit_softcapping"))
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
            c[cap] = _f32(c[cap]) if c[cap] else None
        window = _key(reader, arch, "attention.sliding_window")
        swa = _key(reader, arch, "attention.sliding_window_pattern", pattern)
        if isinstance(swa, list):                                      # per layer: true = sliding
            types = ["sliding_attention" if s else "full_attention" for s in swa]
        else:
            types = ["sliding_attention" if window and (i + 1) % swa else "full_attention"
                     for i in range(c["num_hidden_layers"])]
        c.update(sliding_window=window or None, layer_types=types)
        if arch == "gemma3":
            c["rope_theta"] = _f32(_key(reader, arch, "rope.freq_base", 1e6))
            c["rope_local_base_freq"] = _f32(_key(reader, arch, "rope.freq_base_swa", 10000.0))
            c["rope_scaling"] = rope_scaling(reader, arch)
    return config


def _gemma4(reader, arch, tensors, c):
    """llama.cpp's Gemma4Model: the layer kinds as sliding_window_pattern, the global layers' head size as
    key_length and the sliding ones' as key_length_swa, head_count_kv (and feed_forward_length, with double-wide
    MLPs) per layer where they differ, the shared-KV count and PLE width, proportional RoPE as a rope_freqs
    tensor (1 for each rotated pair, 1e30 for the rest), values equal to keys where a global layer has no
    attn_v. Read back as transformers' Gemma4TextConfig (per_layer_config for the global layers)."""
    n = c["num_hidden_layers"]
    swa = _key(reader, arch, "attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != n:
        raise ModelLoadError(f"this gemma4 GGUF's attention.sliding_window_pattern is {swa!r}, not a flag for each "
                             f"of its {n} layers; re-convert it with a current convert_hf_to_gguf.py")
    types = ["sliding_attention" if s else "full_attention" for s in swa]
    per_layer = lambda v: list(v) if isinstance(v, list) else [v] * n   # noqa: E731
    kv, ff = per_layer(c["num_key_value_heads"]), per_layer(c["intermediate_size"])
    shared = int(_key(reader, arch, "attention.shared_kv_layers", 0))
    wide = [f for i, f in enumerate(ff) if i >= n - shared]
    if any(f != ff[0] for f in ff[:n - shared]) or any(f not in (ff[0], 2 * ff[0]) for f in wide) or len(set(wide)) > 1:
        raise ModelLoadError(f"this gemma4 GGUF's feed_forward_length {ff} is not one width (doubled on the shared-KV "
                             "layers at most); re-convert it, or load the Hugging Face checkpoint")
    head_dim = int(_key(reader, arch, "attention.key_length_swa") or c.get("head_dim"))
    global_dim = int(_key(reader, arch, "attention.key_length") or head_dim)
    first_full = types.index("full_attention") if "full_attention" in types else None
    first_swa = types.index("sliding_attention") if "sliding_attention" in types else 0
    rotary = _key(reader, arch, "rope.dimension_count_swa", head_dim)
    if rotary != head_dim:
        raise ModelLoadError(f"this gemma4 GGUF rotates {rotary} of its sliding layers' {head_dim} head dims; kiln "
                             "reads Gemma 4's full rotation there")
    full_rope = {"rope_type": "default", "rope_theta": _f32(_key(reader, arch, "rope.freq_base", 1e6))}
    if "rope_freqs.weight" in tensors:
        factors = np.asarray(tensors["rope_freqs.weight"].data, np.float32)
        rotated = int(np.sum(factors == 1.0))
        if not np.all(factors[:rotated] == 1.0) or np.any(factors[rotated:] < 1e29):
            raise ModelLoadError("this gemma4 GGUF's rope_freqs are not proportional RoPE's (1 for each rotated pair, "
                                 "then 1e30); kiln reads only that form")
        full_rope.update(rope_type="proportional", partial_rotary_factor=2 * rotated / global_dim)
    ple = int(_key(reader, arch, "embedding_length_per_layer_input", 0) or 0)
    c.update(head_dim=head_dim, num_key_value_heads=kv[first_swa], intermediate_size=ff[0],
             use_double_wide_mlp=bool(wide) and wide[0] == 2 * ff[0], num_kv_shared_layers=shared,
             layer_types=types, sliding_window=_key(reader, arch, "attention.sliding_window"),
             hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=ple,
             final_logit_softcapping=_f32(_key(reader, arch, "final_logit_softcapping", 30.0)),   # llama.cpp's default
             attention_k_eq_v=first_full is not None and f"blk.{first_full}.attn_v.weight" not in tensors,
             per_layer_config={str(i): {"head_dim": global_dim, "num_key_value_heads": kv[i]}
                               for i, t in enumerate(types) if t == "full_attention"},
             rope_parameters={"full_attention": full_rope, "sliding_attention": {
                 "rope_type": "default", "rope_theta": _f32(_key(reader, arch, "rope.freq_base_swa", 10000.0))}},
             enable_moe_block="blk.0.ffn_gate_inp.weight" in tensors)
    c.pop("rope_theta", None)
    if c["enable_moe_block"]:
        if "blk.0.ffn_gate_up_exps.weight" not in tensors:
            raise ModelLoadError("this gemma4 GGUF stores its experts' gate and up apart (ffn_gate_exps / "
                                 "ffn_up_exps); kiln reads the fused ffn_gate_up_exps the converter writes from "
                                 "transformers' gate_up_proj; re-convert it, or load the Hugging Face checkpoint")
        c.update(num_experts=_key(reader, arch, "expert_count"), top_k_experts=_key(reader, arch, "expert_used_count"),
                 moe_intermediate_size=_key(reader, arch, "expert_feed_forward_length"))
    if ple:
        c["vocab_size_per_layer_input"] = int(tensors["per_layer_token_embd.weight"].shape[-1])


def _gemma3n(reader, arch, tensors, c):
    """llama.cpp's Gemma3NModel: Gemma 3's keys (a width a layer in feed_forward_length), the layer kinds as
    sliding_window_pattern, altup_active_idx / altup_num_inputs, the PLE width, shared_kv_layers, and each
    layer's activation sparsity as the normal quantile it cuts at (activation_sparsity_scale: -inf for none, as the
    converter writes it; 0 read as none too)."""
    import statistics
    n = c["num_hidden_layers"]
    swa = _key(reader, arch, "attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != n:
        raise ModelLoadError(f"this gemma3n GGUF's attention.sliding_window_pattern is {swa!r}, not a flag for each "
                             f"of its {n} layers; re-convert it with a current convert_hf_to_gguf.py")
    ff = c["intermediate_size"]
    scales = _key(reader, arch, "activation_sparsity_scale", [0.0] * n)
    if not isinstance(scales, list) or len(scales) != n:
        raise ModelLoadError(f"this gemma3n GGUF's activation_sparsity_scale is {scales!r}, not one for each of its "
                             f"{n} layers; re-convert it")
    c.update(layer_types=["sliding_attention" if s else "full_attention" for s in swa],
             intermediate_size=list(ff) if isinstance(ff, list) else ff, hidden_activation="gelu_pytorch_tanh",
             sliding_window=_key(reader, arch, "attention.sliding_window"),
             num_kv_shared_layers=int(_key(reader, arch, "attention.shared_kv_layers", 0)),
             hidden_size_per_layer_input=int(_key(reader, arch, "embedding_length_per_layer_input")),
             vocab_size_per_layer_input=int(tensors["per_layer_token_embd.weight"].shape[-1]),
             altup_active_idx=int(_key(reader, arch, "altup.active_idx", 0)),
             altup_num_inputs=int(_key(reader, arch, "altup.num_inputs", 4)),
             activation_sparsity_pattern=[statistics.NormalDist().cdf(float(s)) if s else 0.0 for s in scales],
             final_logit_softcapping=_f32(_key(reader, arch, "final_logit_softcapping", 30.0)),   # llama.cpp's default
             laurel_rank=int(tensors["blk.0.laurel_l.weight"].shape[-1]),
             rope_parameters={
                 "full_attention": {"rope_type": "default",
                                    "rope_theta": _f32(_key(reader, arch, "rope.freq_base", 1e6))},
                 "sliding_attention": {"rope_type": "default",
                                       "rope_theta": _f32(_key(reader, arch, "rope.freq_base_swa", 10000.0))}})
    c.pop("rope_theta", None)


def _lfm2(reader, arch, tensors, c):
    """llama.cpp's LFM2Model: head_count_kv a layer (0 for a conv layer), the MLP's adjusted width as
    feed_forward_length, the conv's taps as shortconv.l_cache."""
    n = c["num_hidden_layers"]
    kv = c["num_key_value_heads"]
    kv = list(kv) if isinstance(kv, list) else [kv] * n
    if len(kv) != n or not any(kv):
        raise ModelLoadError(f"this lfm2 GGUF's attention.head_count_kv is {kv}, not a count for each of its {n} "
                             "layers with some attention; re-convert it")
    c.update(layer_types=["full_attention" if h else "conv" for h in kv], num_key_value_heads=max(kv),
             block_auto_adjust_ff_dim=False, conv_L_cache=int(_key(reader, arch, "shortconv.l_cache", 3)),
             norm_eps=c["rms_norm_eps"], conv_bias=False)


def _lfm2moe(reader, arch, tensors, c):
    """llama.cpp's LFM2MoeModel: LFM2's keys (_lfm2; feed_forward_length the dense MLPs' width as it is), the experts'
    count, top k and width, the leading dense layers, sigmoid scores (_sigmoid_router), the choice bias where
    exp_probs_b is stored; the top k renormalised and unscaled, as llama.cpp's graph runs them."""
    _lfm2(reader, arch, tensors, c)
    _sigmoid_router(reader, arch)
    dense = _key(reader, arch, "leading_dense_block_count", 0)
    scale = _key(reader, arch, "expert_weights_scale", 0.0)
    c.update(model_type="lfm2_moe", num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             moe_intermediate_size=_key(reader, arch, "expert_feed_forward_length"), num_dense_layers=dense,
             use_expert_bias=f"blk.{dense}.exp_probs_b.bias" in tensors, norm_topk_prob=True,
             routed_scaling_factor=_f32(scale) if scale else 1.0)


def _phi3(reader, arch, tensors, c):
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    rotary = _key(reader, arch, "rope.dimension_count", head_dim)
    if rotary != head_dim:
        c["partial_rotary_factor"] = rotary / head_dim
    c["sliding_window"] = _key(reader, arch, "attention.sliding_window") or None
    original = _key(reader, arch, "rope.scaling.original_context_length")
    if original is not None:
        c["original_max_position_embeddings"] = original
    if "rope_factors_long.weight" in tensors:
        c["rope_scaling"] = _longrope(tensors, original)


def _phimoe(reader, arch, tensors, c):
    """Phi-3.5-MoE (PhiMoeModel's: Phi3MiniModel's keys, the expert counts). LayerNorm at the file's RMS epsilon
    (its config.json's rms_norm_eps, which PhiMoE's LayerNorms take); cos / sin's factor is the file's
    rope.scaling.attn_factor, which the converter computes from the context lengths (Phi-3.5-MoE's config says
    1.2432 as short_mscale and long_mscale, the converter writes 1.1902: kiln runs what the file says, as
    llama.cpp does). The sparsemixer's threshold is not in the file: the released router_jitter_noise, 0.01."""
    _phi3(reader, arch, tensors, c)
    factor = _key(reader, arch, "rope.scaling.attn_factor")
    if c.get("rope_scaling") and factor is not None:
        c["rope_scaling"].update(short_mscale=_f32(factor), long_mscale=_f32(factor))
    c.update(num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"), router_jitter_noise=0.01,
             attention_bias="blk.0.attn_q.bias" in tensors, lm_head_bias="output.bias" in tensors)


def _chatglm(reader, arch, tensors, c):
    """ChatGLM3 / GLM-4-9B as ChatGLMModel writes them (GLM-4-9B-chat-hf's model, transformers' Glm): q, k and v with
    biases, fused in attn_qkv from ChatGLM's own checkpoints (read back as q_proj / k_proj / v_proj: _chatglm_qkv) or
    apart from transformers' (-hf) ones, RoPE on adjacent pairs of rope.dimension_count of each head (half), the gate
    and up rows fused in ffn_up. From an -hf checkpoint the converter writes 1e-5 as the norms' epsilon and the width
    as the context (ChatGLM's defaults, the keys it looks for being ChatGLM's): kiln runs what the file says."""
    c.update(head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
             attention_bias="blk.0.attn_qkv.bias" in tensors or "blk.0.attn_q.bias" in tensors)
    c["partial_rotary_factor"] = _rotary_share(reader, arch, c)


def _chatglm_qkv(c: dict) -> dict[str, dict[str, np.ndarray]]:
    """attn_qkv's rows: every q head's, every k head's, every v head's (the checkpoint's query_key_value)."""
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    rows = np.arange(q + 2 * kv)
    return {"attn_qkv": {"self_attn.q_proj": rows[:q], "self_attn.k_proj": rows[q:q + kv],
                         "self_attn.v_proj": rows[q + kv:]}}


def _bitnet(reader, arch, tensors, c):
    """llama.cpp's bitnet: 1bitLLM's bitnet_b1_58 (SiLU-gated, sub-norms before o_proj and down_proj), its Linears'
    weights made ternary by the converter (round(W s).clip(-1, 1) / s, s = 1 / mean|W|: transformers' online
    WeightQuant, already applied) and any output scale as <key>.scale. Read as transformers' BitNet with
    AutoBitLinear offline (the weights as stored, times weight_scale: the file's, else 1), so each Linear's input
    is rounded to 8 bits a token as BitNet's BitLinear does (llama.cpp's ternary types round it a block of 256 for
    their dot products instead)."""
    c.update(hidden_act="silu", attention_bias=False, mlp_bias=False,
             quantization_config={"quant_method": "bitnet", "linear_class": "autobitlinear",
                                  "quantization_mode": "offline"})


def _dbrx(reader, arch, tensors, c):
    """DBRX (DbrxModel's keys) in its config.json's nesting: attention's fields in attn_config (clamp_kqv as
    clip_qkv), the experts' in ffn_config; llama.cpp always divides the chosen experts' weights by their sum, as
    DBRX's moe_normalize_expert_weights 1 does."""
    c.update(d_model=c["hidden_size"], n_heads=c["num_attention_heads"], n_layers=c["num_hidden_layers"],
             max_seq_len=c["max_position_embeddings"],
             attn_config={"kv_n_heads": c["num_key_value_heads"], "rope_theta": c["rope_theta"],
                          "clip_qkv": _key(reader, arch, "attention.clamp_kqv")},
             ffn_config={"ffn_hidden_size": c["intermediate_size"],
                         "moe_num_experts": _key(reader, arch, "expert_count"),
                         "moe_top_k": _key(reader, arch, "expert_used_count"), "moe_normalize_expert_weights": 1.0})


def _longrope(tensors: dict, original: int) -> dict:
    """HF's LongRoPE scaling from rope_factors_long / rope_factors_short."""
    return {"rope_type": "longrope", "original_max_position_embeddings": original,
            "long_factor": [_f32(x) for x in _tensor_values(tensors["rope_factors_long.weight"])],
            "short_factor": [_f32(x) for x in _tensor_values(tensors["rope_factors_short.weight"])]}


def _rotary_share(reader, arch: str, c: dict) -> float:
    """The share of each head RoPE rotates: rope.dimension_count over the head size (attention.key_length,
    else hidden / heads; all of it where the count is unwritten)."""
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return _key(reader, arch, "rope.dimension_count", head_dim) / head_dim


def _ernie4_5(reader, arch, tensors, c):
    _head_dim(reader, arch, c)
    c["use_bias"] = "blk.0.attn_q.bias" in tensors


def _paddleocr(reader, arch, tensors, c):
    """PaddleOCR-VL's language model as llama.cpp's converter writes it: Ernie 4.5's tensors, every projection biased
    where use_bias is set, q and k rows as stored (llama.cpp turns its M-RoPE over halves, as the Hugging Face model
    does), read as the Llama it is on text (models/vision_text.py); the M-RoPE sections unread (a text prompt turns
    them all by its position)."""
    _head_dim(reader, arch, c)
    bias = "blk.0.attn_q.bias" in tensors
    c.update(attention_bias=bias, mlp_bias=bias)


def _hunyuan_vl(reader, arch, tensors, c):
    """HunyuanOCR / HunYuan-VL's language model as llama.cpp's converter writes it (hunyuan_vl): Hunyuan's dense layers
    (q/k norms after RoPE) with the XD-RoPE base and its NTK alpha written apart (rope.freq_base, rope.scaling.alpha),
    which llama.cpp joins as HunYuan's own does: base * alpha ** (d / (d - 2)); the XD-RoPE sections unread (a text
    prompt turns them all by its position: plain RoPE, models/config.py mrope_as_rope)."""
    _qwen3(reader, arch, tensors, c)
    if (alpha := _key(reader, arch, "rope.scaling.alpha")):
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        c["rope_theta"] = _f32(np.float32(c["rope_theta"]) * np.float32(alpha) ** np.float32(head / (head - 2)))


def _muse_glimmer(reader, arch, tensors, c):
    """Muse Glimmer's language model as llama.cpp's converter writes it: its four layer norms stored + 1 (the last
    norm as it is), q and k rows permuted for llama.cpp's RoPE on adjacent pairs, q_norm / k_norm synthesized as
    qk_scale_factor and ones (the model's q/k norms have no weight), the output multiplier as logit_scale; RoPE on the
    sliding layers only (llama.cpp's graph), one base for both kinds; the post norms' epsilon llama.cpp's fixed 1e-8."""
    _head_dim(reader, arch, c)
    q, k = ([_tensor_values(t) for name, t in tensors.items() if name.endswith(f".attn_{x}_norm.weight")] for x in "qk")
    scale = q[0][0] if q else None
    if not q or any(np.any(v != scale) for v in q) or any(np.any(v != 1.0) for v in k):
        raise ModelLoadError(f"this {arch} GGUF's attn_q_norm / attn_k_norm are not one scale and ones (what its "
                             "converter writes for the weightless q/k norms); re-convert the model")
    swa_theta = _key(reader, arch, "rope.freq_base_swa")
    if swa_theta is not None and _f32(swa_theta) != c["rope_theta"]:
        raise ModelLoadError(f"this {arch} GGUF's sliding layers rotate by another base (rope.freq_base_swa "
                             f"{swa_theta}) than its model's; re-convert the model")
    if not _sliding_layers(reader, arch, c) or "layer_types" not in c:
        raise ModelLoadError(f"this {arch} GGUF has no attention.sliding_window_pattern (which layers slide, and "
                             "rotate); re-convert the model")
    c.update(qk_scale_factor=_f32(scale), output_multiplier=_f32(_key(reader, arch, "logit_scale")),
             final_logit_softcapping=_f32(_key(reader, arch, "final_logit_softcapping", 0.0)) or None,
             layer_rope_theta=[c["rope_theta"] if t == "sliding_attention" else 0 for t in c["layer_types"]],
             post_norm_eps=1e-8)


def _chameleon(reader, arch, tensors, c):
    """Chameleon as llama.cpp's converter writes it: q/k rows permuted as Llama's, q_norm / k_norm [heads, head_dim]
    (each head's weight head 0's, its dims in llama.cpp's pair order: read back by reorder), swin_norm; its image
    tokens named in the vocabulary (IMGIMG*: what vocabulary_map names), whose logits kiln makes the lowest as the
    model does (llama.cpp masks ids 4 .. 8195, the released vocabulary's)."""
    tokens = meta(reader, "tokenizer.ggml.tokens", [])
    c.update(swin_norm=bool(_key(reader, arch, "swin_norm", False)),
             vocabulary_map={t: i for i, t in enumerate(tokens) if t.startswith("IMGIMG")})


def _chameleon_norm_dims(c: dict) -> dict[str, tuple[int, np.ndarray]]:
    """q_norm / k_norm's dims back from llama.cpp's pair order (the converter's _reverse_hf_permute) to HF's."""
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    stored_at = np.arange(head).reshape(head // 2, 2).T.reshape(-1)   # HF dim k is stored at 2 (k % (d/2)) + k // (d/2)
    return dict.fromkeys(("attn_q_norm", "attn_k_norm"), (1, stored_at))


def _maincoder(reader, arch, tensors, c):
    """Maincoder as llama.cpp's converter writes it and its graph runs it: Llama's tensors as the checkpoint holds them
    under RoPE on adjacent pairs (rotary over the whole head), q and k RMS-normed a head after their rotation: Hunyuan's
    dense layers once q's and k's rows are read in rotate-half order (`permuted`) and their norms' dims alike
    (_pair_order_norm_dims)."""
    _qwen3(reader, arch, tensors, c)
    if c["attention_bias"] or "blk.0.attn_output.bias" in tensors:
        raise ModelLoadError(f"this {arch} GGUF has attention biases, which Maincoder's layers have not; re-convert "
                             "the model")
    rotary = _key(reader, arch, "rope.dimension_count")
    if rotary is not None and rotary != c["head_dim"]:
        raise ModelLoadError(f"this {arch} GGUF rotates {rotary} of each head's {c['head_dim']} dims, where "
                             "llama.cpp's Maincoder rotates them all; re-convert the model")


def _pair_order_norm_dims(c: dict) -> dict[str, tuple[int, np.ndarray]]:
    """Per-head q/k norm weights [head_dim] whose dims follow llama.cpp's pair order, read back in HF's."""
    return {k: (0, axis_order) for k, (_, axis_order) in _chameleon_norm_dims(c).items()}


def _baichuan(reader, arch, tensors, c):
    """Baichuan as llama.cpp's converter writes it: W_pack split into q, k and v (q and k rows permuted as Llama's),
    read under kiln's names for that layout (kiln_split_qkv: models/alibi.py); RoPE for 32 layers (the 7B models),
    ALiBi otherwise, as llama.cpp's graph chooses (BLOOM's slopes: its max_alibi_bias 8). Baichuan 2's head is
    stored as it was trained (the converter does not normalise it): kiln normalises it as the model does."""
    rope = c["num_hidden_layers"] == 32
    c.update(architectures=["BaiChuanForCausalLM" if rope else "BaichuanForCausalLM"], kiln_split_qkv=True)


def _refact(reader, arch, tensors, c):
    """Refact as llama.cpp's converter writes it and its graph runs it: Llama's layers without RoPE, ALiBi (max bias 8:
    the standard slopes), one KV head, q / k / v apart: Baichuan's ALiBi form (its 13B layers) with those heads."""
    if "blk.0.attn_output.bias" in tensors or "blk.0.ffn_up.bias" in tensors:
        raise ModelLoadError(f"this {arch} GGUF has biases, which Refact's layers have not; re-convert the model")
    c.update(model_type="baichuan", architectures=["BaichuanForCausalLM"], kiln_split_qkv=True)


def _jais(reader, arch, tensors, c):
    """JAIS as llama.cpp's converter writes it: GPT-2's tensors with the SwiGLU's gate as ffn_gate (c_fc2), ALiBi of
    attention.max_alibi_bias, muP's embedding and output scales folded into those tensors, scores over head_dim (its
    graph's 1 / d)."""
    c.update(embeddings_scale=1.0, width_scale=1.0, scale_qk_dot_by_d=True,
             kiln_alibi_bias_max=_f32(_key(reader, arch, "attention.max_alibi_bias", 8.0)))


def _hrm_text(reader, arch, tensors, c):
    """HRM-Text as llama.cpp's converter writes it: block_count the cache's slots (layers_per_stack x h_cycles x
    (l_cycles + 1)), the low stack's layers as blk.0 .. n - 1 and the high stack's after them, each layer's gate, q, k
    and v apart (attn_gate first: transformers' gqkv_proj order) and the MLP's gate and up apart, the low state's
    start as hrm.z_l_init; the embedding scale as embedding_scale. Read under kiln's names for that layout
    (kiln_split_layers: models/hrm_text.py)."""
    _head_dim(reader, arch, c)
    per_stack, h, low = (_key(reader, arch, f"hrm.{k}") for k in ("layers_per_stack", "h_cycles", "l_cycles"))
    if not (per_stack and h and low) or per_stack * h * (low + 1) != c["num_hidden_layers"]:
        raise ModelLoadError(f"this {arch} GGUF's hrm.layers_per_stack / h_cycles / l_cycles ({per_stack}, {h}, "
                             f"{low}) do not make its block_count ({c['num_hidden_layers']}); re-convert the model")
    c.update(num_layers_per_stack=per_stack, H_cycles=h, L_cycles=low, kiln_split_layers=True,
             embedding_scale=_f32(_key(reader, arch, "embedding_scale", 1.0)),
             prefix_lm=bool(_key(reader, arch, "hrm.prefix_lm", False)))


def _glm4(reader, arch, tensors, c):
    """GLM-4-0414; GLM-4.1V's text model where the file has M-RoPE sections (rope.dimension_sections): its q/k
    rows then in NeoX order (the converter's normal_to_neox: llama.cpp's M-RoPE kernel pairs i with i + d/2),
    read back as GLM's adjacent pairs (_glm4_rows), the sections kept in rope_parameters (a text prompt turns
    them all by its position: plain RoPE, models/config.py mrope_as_rope)."""
    share = _rotary_share(reader, arch, c)
    c.update(attention_bias="blk.0.attn_q.bias" in tensors, partial_rotary_factor=share)
    sections = _key(reader, arch, "rope.dimension_sections")
    if sections and any(sections):
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": c["rope_theta"], "partial_rotary_factor": share,
                                "mrope_section": [int(s) for s in sections[:3]]}


def _glm4_rows(c: dict) -> dict[str, tuple[int, np.ndarray]]:
    """With M-RoPE (GLM-4.1V), the HF order of each q and k head's rotated rows: HF's dim 2i is stored at i, 2i + 1
    at rotary / 2 + i (the rest as they are)."""
    if "mrope_section" not in (c.get("rope_parameters") or {}):
        return {}
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    rotary = int(head * c["partial_rotary_factor"])
    within = np.array([j // 2 + (rotary // 2 if j % 2 else 0) if j < rotary else j for j in range(head)])

    def heads(n: int) -> np.ndarray:
        return (np.arange(n)[:, None] * head + within).ravel()
    return {"attn_q": (0, heads(c["num_attention_heads"])), "attn_k": (0, heads(c["num_key_value_heads"]))}


def _cohere(reader, arch, tensors, c):
    c.update(layer_norm_eps=c.pop("rms_norm_eps"), logit_scale=_f32(_key(reader, arch, "logit_scale", 1.0)),
             attention_bias="blk.0.attn_q.bias" in tensors, use_qk_norm="blk.0.attn_q_norm.weight" in tensors)
    if arch == "cohere2":
        c.update(sliding_window=_key(reader, arch, "attention.sliding_window"),
                 sliding_window_pattern=4)             # llama.cpp's loader: hparams.set_swa_pattern(4)


def _cohere2moe(reader, arch, tensors, c):
    """Cohere's MoE as llama.cpp's graph runs it: RMSNorm where its eps is written, else Cohere's LayerNorm; each
    layer's kind from the window pattern, the dense prefix rotating whatever its kind; the experts scored by the
    file's gating function (sigmoid where it has none), the shared experts averaged in (the one strategy the
    converter takes). Softmax scores not renormalised, or scaled ones, which transformers' model does not compute,
    are refused."""
    _nextn(reader, arch, c)
    sigmoid, softmax = gguf.ExpertGatingFuncType.SIGMOID, gguf.ExpertGatingFuncType.SOFTMAX
    gating, norm = _key(reader, arch, "expert_gating_func", sigmoid), _key(reader, arch, "expert_weights_norm", False)
    scale = _key(reader, arch, "expert_weights_scale", 1.0)
    pattern = _key(reader, arch, "attention.sliding_window_pattern")
    shared, width = _key(reader, arch, "expert_shared_count", 0), _key(reader, arch, "expert_feed_forward_length")
    if (gating not in (sigmoid, softmax) or gating == softmax and not norm or scale not in (0.0, 1.0)
            or not isinstance(pattern, list)
            or _key(reader, arch, "expert_shared_feed_forward_length", width * shared) != width * shared):
        raise ModelLoadError(f"this {arch} GGUF (gating {gating}, weights norm {norm}, scale {scale}, window pattern "
                             f"{pattern!r}, {shared} shared experts) is not a Cohere MoE transformers' model computes "
                             "(softmax renormalised or sigmoid scores, unscaled, a layer pattern, shared experts as "
                             "wide as the routed ones); re-convert the model")
    if _key(reader, arch, "attention.layer_norm_rms_epsilon") is None:
        c["layer_norm_eps"] = c.pop("rms_norm_eps")
    else:
        c["layer_norm_eps"] = _f32(_key(reader, arch, "attention.layer_norm_epsilon", 1e-5))
    _sliding_layers(reader, arch, c)
    c.update(logit_scale=_f32(_key(reader, arch, "logit_scale", 1.0)), num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"), intermediate_size=width,
             prefix_dense_intermediate_size=c["intermediate_size"],
             first_k_dense_replace=_key(reader, arch, "leading_dense_block_count", 0), num_shared_experts=shared,
             shared_expert_combination_strategy="average", norm_topk_prob=norm,
             expert_selection_fn="sigmoid" if gating == sigmoid else "softmax", prefix_dense_sliding_window_pattern=1)


def _olmoe(reader, arch, tensors, c):
    """llama.cpp's OLMoE graph weighs the top k as routed (no renormalisation)."""
    c.update(num_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"), norm_topk_prob=False)


def _granite(reader, arch, tensors, c):
    _attention_layers_only(arch, c)
    _llama(reader, arch, tensors, c)
    for hf_key, key in (("embedding_multiplier", "embedding_scale"), ("attention_multiplier", "attention.scale"),
                        ("residual_multiplier", "residual_scale"), ("logits_scaling", "logit_scale")):
        if (value := _key(reader, arch, key)) is not None:
            c[hf_key] = _f32(value)
    if not c.get("attention_multiplier"):   # llama.cpp's graphs: no attention.scale (or 0) is 1 / sqrt(head size)
        c["attention_multiplier"] = (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]) ** -0.5
    c["partial_rotary_factor"] = _rotary_share(reader, arch, c)        # Bamba's (as granitehybrid): half


def _minicpm(reader, arch, tensors, c):
    """MiniCPM: Granite's reading (its scales are Granite's multipliers; the attention's, 1 / sqrt(head size)), so
    transformers' Granite is the reference; LongRoPE's factor tensors are refused."""
    if any(t.startswith("rope_factors") for t in tensors):
        raise ModelLoadError(f"this {arch} GGUF scales RoPE by LongRoPE factors (rope_factors_long / _short), which "
                             "kiln does not read from GGUF yet; load the Hugging Face checkpoint instead")
    _granite(reader, arch, tensors, c)


def _attention_layers_only(arch, c) -> None:
    """Granite 4.0's converter writes attention.head_count_kv a layer, 0 for a Mamba layer, also where it writes a
    model without Mamba layers as granite / granitemoe: read as one count; Mamba layers are refused (a granite file
    has none: granitehybrid reads them)."""
    mamba = [i for i, n in enumerate(_attention_layers(arch, c)) if not n]
    if mamba:
        raise ModelLoadError(f"this {arch} GGUF has Mamba layers ({', '.join(map(str, mamba))}: "
                             "attention.head_count_kv 0), which its architecture does not run; re-convert the model "
                             "(llama.cpp writes Granite 4.0's hybrids as granitehybrid)")


def _attention_layers(arch, c) -> list[bool]:
    """Which layers attend (attention.head_count_kv a layer: not 0), the count then read as the one it is."""
    kv = c["num_key_value_heads"]
    if not isinstance(kv, list):
        return [True] * c["num_hidden_layers"]
    counts = set(kv) - {0}
    if len(counts) > 1:
        raise ModelLoadError(f"this {arch} GGUF's layers have different kv head counts ({kv}), which its Hugging Face "
                             "model does not; re-convert the model")
    c["num_key_value_heads"] = counts.pop() if counts else c["num_attention_heads"]
    return [bool(n) for n in kv]


# Mamba-2's sizes as each family's config.json names them: heads, head size, groups, state, conv taps, conv bias,
# in_proj's bias
GRANITE_SSM = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_conv_bias",
               "mamba_proj_bias")
NEMOTRON_H_SSM = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "use_conv_bias",
                  "mamba_proj_bias")
MAMBA2_SSM = ("num_heads", "head_dim", "n_groups", "state_size", "conv_kernel", "use_conv_bias", "use_bias")


def _mamba2(reader, arch, tensors, names: tuple[str, ...]) -> dict:
    """Mamba-2's sizes from llama.cpp's ssm.* keys (time_step_rank: the heads; inner_size: their width) and its
    biases from the tensors present, under the config names `names` (GRANITE_SSM's order)."""
    heads, inner = _key(reader, arch, "ssm.time_step_rank"), _key(reader, arch, "ssm.inner_size")
    first = next((int(n.split(".")[1]) for n in tensors if n.endswith(".ssm_in.weight")), 0)
    return dict(zip(names, (heads, inner // heads, _key(reader, arch, "ssm.group_count", 1),
                            _key(reader, arch, "ssm.state_size"), _key(reader, arch, "ssm.conv_kernel"),
                            f"blk.{first}.ssm_conv1d.bias" in tensors, f"blk.{first}.ssm_in.bias" in tensors)))


def _smollm3(reader, arch, tensors, c):
    _llama(reader, arch, tensors, c)
    c["no_rope_layer_interval"] = 4                 # llama.cpp's loader: hparams.n_no_rope_layer_step = 4


def _stablelm(reader, arch, tensors, c):
    c.update(layer_norm_eps=c.pop("rms_norm_eps"), use_qkv_bias="blk.0.attn_q.bias" in tensors,
             partial_rotary_factor=_rotary_share(reader, arch, c),
             use_parallel_residual=bool(_key(reader, arch, "use_parallel_residual", False)),
             qk_layernorm="blk.0.attn_q_norm.weight" in tensors)


def _phi2(reader, arch, tensors, c):
    """Phi-1 / 1.5 / 2 (PhiModel's keys). Its converter writes feed_forward_length as 4 x the width whatever the
    config says (every released Phi's is): the MLP's width is read from ffn_up's rows."""
    c.update(layer_norm_eps=c.pop("rms_norm_eps"), hidden_act="gelu_new",
             partial_rotary_factor=_rotary_share(reader, arch, c))
    if "blk.0.ffn_up.weight" in tensors:
        c["intermediate_size"] = int(tensors["blk.0.ffn_up.weight"].shape[1])


def _starcoder2(reader, arch, tensors, c):
    c.update(norm_epsilon=c.pop("rms_norm_eps"), use_bias="blk.0.attn_q.bias" in tensors,
             sliding_window=_key(reader, arch, "attention.sliding_window") or None)


def _codeshell(reader, arch, tensors, c):
    """CodeShell as llama.cpp's converter writes it and its graph runs it: LayerNorms with biases, q/k/v (GQA) as one
    attn_qkv with its bias, RoPE on halves over the whole head, a GELU (tanh) MLP with biases, the head untied:
    transformers' StarCoder 2 with use_bias and no window."""
    _starcoder2(reader, arch, tensors, c)
    if not c["use_bias"] and "blk.0.attn_qkv.bias" not in tensors or rope_scaling(reader, arch) is not None:
        raise ModelLoadError(f"this {arch} GGUF has no attention biases or scales its RoPE, which CodeShell's does "
                             "not; re-convert the model")
    c.update(use_bias=True, sliding_window=None, hidden_act="gelu_pytorch_tanh")


def _gptneox(reader, arch, tensors, c):
    c.update(layer_norm_eps=c.pop("rms_norm_eps"), hidden_act="gelu", attention_bias="blk.0.attn_qkv.bias" in tensors,
             rotary_pct=_rotary_share(reader, arch, c),
             use_parallel_residual=bool(_key(reader, arch, "use_parallel_residual", True)))


def _gpt2(reader, arch, tensors, c):
    c.update(n_layer=c.pop("num_hidden_layers"), n_embd=c.pop("hidden_size"), n_head=c.pop("num_attention_heads"),
             n_ctx=c["max_position_embeddings"], n_positions=c.pop("max_position_embeddings"),
             n_inner=c.pop("intermediate_size"), layer_norm_epsilon=c.pop("rms_norm_eps"),
             activation_function="gelu_new", tie_word_embeddings=True)
    for k in ("num_key_value_heads", "rope_theta"):
        c.pop(k, None)


def _granitemoe(reader, arch, tensors, c):
    """Granite MoE (+ Shared): Granite's multipliers, the expert counts, the shared MLP's width."""
    _granite(reader, arch, tensors, c)
    c.update(model_type="granitemoe", architectures=["GraniteMoeForCausalLM"],       # not _llama's Mixtral
             num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"))
    if (shared := _key(reader, arch, "expert_shared_feed_forward_length")):
        c.update(model_type="granitemoeshared", architectures=["GraniteMoeSharedForCausalLM"],
                 shared_intermediate_size=shared)


def _bailingmoe(reader, arch, tensors, c):
    """Ling v1 (Ling-lite, Ling-plus, Ling-Coder-lite: llama.cpp's bailingmoe) as llama.cpp's graph runs it: Llama's
    attention (scale 1 / sqrt(rope.dimension_count)), every layer a softmax over the experts, the best k renormalised
    (expert_weights_norm), plus the shared experts as one ungated MLP: transformers' Granite MoE Shared without its
    multipliers (its router's softmax over the k best logits is the renormalised top k). Other routings are refused."""
    _granite(reader, arch, tensors, c)
    width = _key(reader, arch, "expert_feed_forward_length")
    widths = set(width) if isinstance(width, list) else {width}
    if not _key(reader, arch, "expert_weights_norm", False) or _f32(_key(reader, arch, "expert_weights_scale", 1.0)) \
            != 1.0 or _key(reader, arch, "leading_dense_block_count", 0) or len(widths) != 1 or None in widths:
        raise ModelLoadError(f"this {arch} GGUF routes otherwise than Ling v1's released models (the top k "
                             "renormalised and unscaled, experts in every layer, one expert width); load its Hugging "
                             "Face checkpoint")
    width = int(widths.pop())
    c.update(model_type="granitemoeshared", architectures=["GraniteMoeSharedForCausalLM"], intermediate_size=width,
             num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             shared_intermediate_size=width * int(_key(reader, arch, "expert_shared_count", 0)))


def _granite_swa(reader, arch, tensors, c):
    """IBM's Granite with sliding layers and sinks (GraniteSWAModel's: Granite's multipliers, the window and each
    layer's kind, which layers rotate as attention.rope_pattern, every rotating one by rope.freq_base: transformers'
    layer_rope_theta with 0 where a layer has none); with experts (expert_count) GraniteMoeSWA, its experts' gate and
    up rows and the shared MLP's kept fused as stored."""
    _granite(reader, arch, tensors, c)
    _sliding_layers(reader, arch, c)
    pattern = _key(reader, arch, "attention.rope_pattern")
    if isinstance(pattern, list) and len(pattern) != c["num_hidden_layers"]:
        raise ModelLoadError(f"GGUF {arch}.attention.rope_pattern lists {len(pattern)} layers for "
                             f"{c['num_hidden_layers']}; re-convert the model")
    c.update(model_type="granite_swa", architectures=["GraniteSWAForCausalLM"],
             layer_rope_theta=[c["rope_theta"] if rotates else 0.0
                               for rotates in (pattern or [True] * c["num_hidden_layers"])])
    if (experts := _key(reader, arch, "expert_count")):
        c.update(model_type="granitemoe_swa", architectures=["GraniteMoeSWAForCausalLM"], num_local_experts=experts,
                 num_experts_per_tok=_key(reader, arch, "expert_used_count"),
                 shared_intermediate_size=_key(reader, arch, "expert_shared_feed_forward_length", 0))


def _granitehybrid(reader, arch, tensors, c):
    """Granite 4.0 as granitehybrid: Mamba-2 layers where head_count_kv is 0 (their sizes: _mamba2), Granite's
    multipliers, experts where expert_count, else the MLP as the shared one (shared_mlp); RoPE unless
    rope.scaling.finetuned is false (llama.cpp's switch for it)."""
    attends = _attention_layers(arch, c)
    _granitemoe(reader, arch, tensors, c)
    experts = _key(reader, arch, "expert_count") or 0
    c.update(model_type="granitemoehybrid", architectures=["GraniteMoeHybridForCausalLM"], num_local_experts=experts,
             layer_types=["attention" if a else "mamba" for a in attends],
             position_embedding_type="rope" if _key(reader, arch, "rope.scaling.finetuned", True) else "nope")
    if not all(attends):
        c.update(_mamba2(reader, arch, tensors, GRANITE_SSM))
    if not experts:
        c.update(num_experts_per_tok=0, shared_intermediate_size=c["intermediate_size"])


def _falcon_h1(reader, arch, tensors, c):
    """Falcon-H1 (llama.cpp's FalconH1Model): Mamba-2's sizes (_mamba2), every multiplier 1 (the converter folded
    them into the weights), the gated norm (after the gate, as llama.cpp applies it) where ssm_norm is stored."""
    sizes = _mamba2(reader, arch, tensors, GRANITE_SSM)
    c.update(sizes, mamba_d_ssm=sizes["mamba_n_heads"] * sizes["mamba_d_head"],
             mamba_rms_norm="blk.0.ssm_norm.weight" in tensors, mamba_norm_before_gate=False,
             projectors_bias="blk.0.ssm_out.bias" in tensors, attention_bias="blk.0.attn_q.bias" in tensors,
             mlp_bias="blk.0.ffn_down.bias" in tensors)


def _jamba(reader, arch, tensors, c):
    """Jamba (llama.cpp's JambaModel): its attention layers (head_count_kv not 0) and expert layers (ffn_gate_inp
    stored) as the period and offset its config names them by, Mamba-1's sizes from ssm.*."""
    n, attends = c["num_hidden_layers"], _attention_layers(arch, c)
    experts = [i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" in tensors]
    inner = _key(reader, arch, "ssm.inner_size")
    c.update(attn_layer_period=_period(arch, [i for i, a in enumerate(attends) if a], n, "attention"),
             attn_layer_offset=attends.index(True) if any(attends) else n,
             expert_layer_period=_period(arch, experts, n, "expert"), expert_layer_offset=experts[0] if experts else n,
             num_experts=_key(reader, arch, "expert_count") or 1,
             num_experts_per_tok=_key(reader, arch, "expert_used_count") or 1,
             mamba_expand=inner // c["hidden_size"], mamba_d_state=_key(reader, arch, "ssm.state_size"),
             mamba_d_conv=_key(reader, arch, "ssm.conv_kernel"), mamba_dt_rank=_key(reader, arch, "ssm.time_step_rank"),
             mamba_conv_bias=any(t.endswith(".ssm_conv1d.bias") for t in tensors),
             mamba_proj_bias=any(t.endswith(".ssm_in.bias") for t in tensors))


def _period(arch: str, layers: list[int], n: int, what: str) -> int:
    """The period of `layers` as a Jamba config names them (every period-th layer from the first; n where there is one
    or none); a ModelLoadError for layers no period and offset give."""
    steps = {b - a for a, b in zip(layers, layers[1:])}
    period = steps.pop() if len(steps) == 1 else n
    if layers and [i for i in range(n) if i % period == layers[0] % period] != layers:
        raise ModelLoadError(f"this {arch} GGUF's {what} layers ({layers}) are not every n-th layer from one below n, "
                             "which its Hugging Face config cannot say; re-convert the model")
    return period


def _mamba1(reader, arch, tensors, c):
    """Mamba-1 (llama.cpp's MambaModel): its sizes as ssm.* (time_step_rank: dt's rank); Falcon Mamba where
    ssm.dt_b_c_rms (its norms' epsilon, which the file leaves out, transformers' default)."""
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        c.pop(key)
    inner = _key(reader, arch, "ssm.inner_size")
    c.update(intermediate_size=inner, expand=inner // c["hidden_size"], state_size=_key(reader, arch, "ssm.state_size"),
             conv_kernel=_key(reader, arch, "ssm.conv_kernel"), time_step_rank=_key(reader, arch, "ssm.time_step_rank"),
             use_conv_bias="blk.0.ssm_conv1d.bias" in tensors, use_bias="blk.0.ssm_in.bias" in tensors,
             layer_norm_epsilon=c.pop("rms_norm_eps"))
    if _key(reader, arch, "ssm.dt_b_c_rms", False):
        c.update(model_type="falcon_mamba", architectures=["FalconMambaForCausalLM"])


def _mamba2_only(reader, arch, tensors, c):
    """Mamba-2 alone (llama.cpp's Mamba2Model): its sizes under Mamba2Config's names, no attention keys."""
    sizes = _mamba2(reader, arch, tensors, MAMBA2_SSM)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        c.pop(key)
    c.update(sizes, layer_norm_epsilon=c.pop("rms_norm_eps"),
             expand=sizes["num_heads"] * sizes["head_dim"] // c["hidden_size"])


def _nemotron_h(reader, arch, tensors, c):
    """Nemotron-H: each block's kind from the per-layer head_count_kv (attention where not 0) and
    feed_forward_length (an MLP where not 0), the rest Mamba-2 (_mamba2); its norm epsilon as layer_norm_epsilon."""
    attends = _attention_layers(arch, c)
    ff = c["intermediate_size"] if isinstance(c["intermediate_size"], list) else [0] * len(attends)
    c.update(_mamba2(reader, arch, tensors, NEMOTRON_H_SSM),
             layers_block_type=["attention" if a else "mlp" if f else "mamba" for a, f in zip(attends, ff)],
             intermediate_size=max(ff) or None, layer_norm_epsilon=c.pop("rms_norm_eps"),
             mlp_bias=any(n.endswith(".ffn_up.bias") for n in tensors))


def _nemotron_h_moe(reader, arch, tensors, c):
    """Nemotron 3 Nano: Nemotron-H's blocks (_nemotron_h) with experts where feed_forward_length (a layer) is not
    0, routed as DeepSeek-V3 routes (_deepseek_router), the shared MLP expert_shared_feed_forward_length wide; the
    multi-token-prediction block after the last layer left unread; latent experts (Nemotron 3 Super) refused."""
    if any(".ffn_latent_" in n for n in tensors):
        raise ModelLoadError(f"this {arch} GGUF's experts work in a latent space (ffn_latent_*: Nemotron 3 Super), "
                             "which kiln does not run yet")
    _nextn(reader, arch, c)
    for key in ("num_key_value_heads", "intermediate_size"):
        if isinstance(c[key], list):
            c[key] = c[key][:c["num_hidden_layers"]]
    _nemotron_h(reader, arch, tensors, c)
    c["layers_block_type"] = ["moe" if kind == "mlp" else kind for kind in c["layers_block_type"]]
    _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
    c["moe_shared_expert_intermediate_size"] = _key(reader, arch, "expert_shared_feed_forward_length", 0)


def _no_groups(reader, arch: str) -> None:
    """llama.cpp chooses experts from the best expert_group_used_count of expert_group_count groups in any
    architecture (build_moe_ffn); the HF families without groups cannot, so such a file is refused."""
    if (_key(reader, arch, "expert_group_count") or 1) > 1:
        raise ModelLoadError(f"this {arch} GGUF chooses experts in {_key(reader, arch, 'expert_group_count')} groups "
                             "(expert_group_count), which its Hugging Face model does not; re-convert the model or "
                             "load the Hugging Face checkpoint")


def _sigmoid_router(reader, arch: str) -> None:
    """The HF families llama.cpp runs with the file's expert_gating_func (glm4moe, dots1, minimax-m2, exaone-moe)
    score experts by sigmoid only: a file that says softmax is refused; one that says nothing is read as sigmoid,
    glm4moe's loader default (the others' graphs cannot run it)."""
    gating = _key(reader, arch, "expert_gating_func", int(gguf.ExpertGatingFuncType.SIGMOID))
    if gating != gguf.ExpertGatingFuncType.SIGMOID:
        raise ModelLoadError(f"GGUF {arch}.expert_gating_func is {gating}, but the Hugging Face model scores experts "
                             f"by sigmoid only ({int(gguf.ExpertGatingFuncType.SIGMOID)}); re-convert the model")


def _nextn(reader, arch, c) -> None:
    """block_count counts the multi-token-prediction layers after the last one (nextn_predict_layers); the HF
    model's num_hidden_layers does not (GGUFArch.for_config leaves their tensors unread)."""
    c["num_hidden_layers"] -= _key(reader, arch, "nextn_predict_layers", 0)


def _deepseek_router(reader, arch, c, experts: str, shared: str) -> None:
    """DeepSeek-V3's router as llama.cpp runs it (GLM-4.5, dots.llm1, K-EXAONE; `experts` / `shared` name the HF
    counts): sigmoid scores, the best expert_group_used_count of expert_group_count groups, the first
    leading_dense_block_count layers dense, the top k renormalised only where expert_weights_norm and scaled by
    expert_weights_scale. Each is written out with llama.cpp's loader default (no groups, dense layers,
    renormalisation or scaling), as the HF defaults differ."""
    _sigmoid_router(reader, arch)
    _routed_counts(reader, arch, c, experts, shared)


def _routed_counts(reader, arch, c, experts: str, shared: str) -> None:
    """The router's keys DeepSeek's converters write, as HF's config names them, with llama.cpp's loader defaults."""
    scale = _key(reader, arch, "expert_weights_scale", 0.0)
    c.update({experts: _key(reader, arch, "expert_count"),
              "num_experts_per_tok": _key(reader, arch, "expert_used_count"),
              "moe_intermediate_size": _key(reader, arch, "expert_feed_forward_length"),
              shared: _key(reader, arch, "expert_shared_count", 0),
              "first_k_dense_replace": _key(reader, arch, "leading_dense_block_count", 0),
              "n_group": _key(reader, arch, "expert_group_count") or 1,
              "topk_group": _key(reader, arch, "expert_group_used_count") or 1,
              "routed_scaling_factor": _f32(scale) if scale else 1.0,
              "norm_topk_prob": bool(_key(reader, arch, "expert_weights_norm", False))})


def _glm4_moe(reader, arch, tensors, c):
    """GLM-4.5 (and Solar Open, which llama.cpp converts as glm4moe): partial rotary as rope.dimension_count,
    q/k/v biases and q/k norms where stored."""
    _nextn(reader, arch, c)
    _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
    c.update(attention_bias="blk.0.attn_q.bias" in tensors, use_qk_norm="blk.0.attn_q_norm.weight" in tensors,
             partial_rotary_factor=_rotary_share(reader, arch, c))


def _always_renormalised(reader, arch, family: str) -> None:
    """A family whose transformers model always renormalises its chosen experts' weights: a file without
    expert_weights_norm (llama.cpp's default: none) is refused."""
    if not _key(reader, arch, "expert_weights_norm", False):
        raise ModelLoadError(f"this {arch} GGUF does not renormalise its experts' weights (expert_weights_norm), "
                             f"which {family} always does; re-convert the model")


def _hy_v3(reader, arch, tensors, c):
    """Tencent Hy V3: DeepSeek-V3's router without groups (sigmoid scores with the choice bias exp_probs_b, the top k
    renormalised and scaled), per-head q/k norms, a layer without a router dense (the converter writes no
    leading_dense_block_count; llama.cpp's loader goes by the tensors). transformers' model always renormalises: a
    file without expert_weights_norm (llama.cpp's default: none) is refused. HYV3Model writes no
    expert_shared_count: its one shared MLP is known by its tensors (ffn_*_shexp)."""
    _nextn(reader, arch, c)
    _head_dim(reader, arch, c)
    _no_groups(reader, arch)
    _always_renormalised(reader, arch, "Hy V3")
    _deepseek_router(reader, arch, c, "num_experts", "num_shared_experts")
    if not c["num_shared_experts"] and any(".ffn_up_shexp." in name for name in tensors):
        c["num_shared_experts"] = 1
    c.update(router_scaling_factor=c.pop("routed_scaling_factor"), route_norm=True,     # HYV3Config's names
             attention_bias="blk.0.attn_q.bias" in tensors,    # dense where a layer has no router (the loader's rule)
             mlp_layer_types=["sparse" if f"blk.{i}.ffn_gate_inp.weight" in tensors else "dense"
                              for i in range(c["num_hidden_layers"])])


def _laguna(reader, arch, tensors, c):
    """Laguna (poolside) as llama.cpp's loader and graph run it: a query head count a layer (head_count an array);
    where the file has a window, the layers attention.sliding_window_pattern marks (where written: a flag a layer, or
    a period) else every 4th full from the first, the others sliding; full layers' RoPE by rope.freq_base (YaRN where
    rope.scaling says so) on rope.dimension_count dims of each head, sliding ones' unscaled by rope.freq_base_swa on
    rope.dimension_count_swa; the gate a head or a value dim by attn_gate's rows; DeepSeek-V3's router without groups
    (sigmoid scores, the choice bias, renormalised where expert_weights_norm, times expert_weights_scale), the first
    leading_dense_block_count layers dense, expert_shared_count (one, where unwritten) ungated shared experts of
    expert_shared_feed_forward_length. The router's logit cap is written nowhere, and llama.cpp's graph applies none:
    the file is read without one."""
    n, heads = c["num_hidden_layers"], c["num_attention_heads"]
    heads = list(heads) if isinstance(heads, (list, tuple)) else [heads] * n
    c.update(num_attention_heads=heads[0], num_attention_heads_per_layer=heads)
    _head_dim(reader, arch, c)
    _no_groups(reader, arch)
    _always_renormalised(reader, arch, "Laguna")
    _deepseek_router(reader, arch, c, "num_experts", "n_shared_experts")
    if _key(reader, arch, "expert_shared_count", 1) != 1:
        raise ModelLoadError(f"this {arch} GGUF has {_key(reader, arch, 'expert_shared_count')} shared experts "
                             "(expert_shared_count), where Laguna has one; re-convert the model")
    head_dim = c.get("head_dim") or c["hidden_size"] // heads[0]
    window = _key(reader, arch, "attention.sliding_window") or 0
    pattern = _key(reader, arch, "attention.sliding_window_pattern", 4)
    if isinstance(pattern, list):
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [bool(pattern == 0 or i % pattern) for i in range(n)]
    rotary = _key(reader, arch, "rope.dimension_count", head_dim)
    full = {"rope_type": "default", "rope_theta": c["rope_theta"], **(rope_scaling(reader, arch) or {}),
            "partial_rotary_factor": rotary / head_dim}
    local = {"rope_type": "default", "rope_theta": _f32(_key(reader, arch, "rope.freq_base_swa", c["rope_theta"])),
             "partial_rotary_factor": _key(reader, arch, "rope.dimension_count_swa", rotary) / head_dim}
    gate = tensors.get("blk.0.attn_gate.weight")
    c.update(shared_expert_intermediate_size=_key(reader, arch, "expert_shared_feed_forward_length"),
             mlp_layer_types=["dense" if i < c["first_k_dense_replace"] else "sparse" for i in range(n)],
             gating="per-element" if gate is not None and int(gate.shape[-1]) != heads[0] else True,
             sliding_window=window or None,
             layer_types=["sliding_attention" if window and s else "full_attention" for s in sliding],
             rope_parameters={"full_attention": full, "sliding_attention": local})


def _mimo2(reader, arch, tensors, c):
    """Xiaomi's MiMo-V2-Flash (MimoV2Model's keys): block_count and the per-layer arrays counting the
    multi-token-prediction layers (nextn_predict_layers: left unread); head_count_kv a layer, the full layers' as
    num_key_value_heads and the sliding ones' twice that (transformers' fixed shape; another is refused); keys of
    key_length, values of value_length; the window, the released config's sliding_window (as the converter writes it):
    the number of positions before the query a sliding layer sees (SGLang's, MiMo's reference, and transformers'
    sliding_window - 1; llama.cpp reads it as the query and window - 1 before it, a position short), and each layer's
    kind; rope.freq_base on full layers, rope.freq_base_swa on sliding ones, each on
    rope.dimension_count of each head; attention.value_scale (none: 1, as llama.cpp); DeepSeek-V3's router, the top k
    always renormalised (llama.cpp's graph); a layer without a router dense; sinks on the layers that store them
    (transformers': the sliding ones; refused otherwise)."""
    if "blk.0.attn_qkv.weight" in tensors:
        raise ModelLoadError(f"this {arch} GGUF stores q, k and v fused (attn_qkv: MiMo-V2.5's qkv_proj), which kiln "
                             "does not read yet; kiln reads MiMo-V2-Flash's separate attn_q / attn_k / attn_v")
    _nextn(reader, arch, c)
    n = c["num_hidden_layers"]
    kv = c["num_key_value_heads"] if isinstance(c["num_key_value_heads"], list) else [c["num_key_value_heads"]] * n
    pattern = _key(reader, arch, "attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) < n:
        raise ModelLoadError(f"this {arch} GGUF's attention.sliding_window_pattern does not list its {n} layers; "
                             "re-convert the model")
    sliding = [bool(slides) for slides in pattern[:n]]
    c.update(sliding_window=_key(reader, arch, "attention.sliding_window") + 1,
             layer_types=["sliding_attention" if slides else "full_attention" for slides in sliding])
    full_kv = next((heads for heads, slides in zip(kv, sliding) if not slides), kv[0] // 2 if sliding[0] else kv[0])
    if list(kv[:n]) != [full_kv * (2 if slides else 1) for slides in sliding]:
        raise ModelLoadError(f"this {arch} GGUF's head_count_kv {list(kv[:n])} is not the full layers' count with "
                             "twice it on sliding ones, the only shape MiMo-V2-Flash's Hugging Face model has")
    if [f"blk.{i}.attn_sinks.weight" in tensors for i in range(n)] != sliding:
        raise ModelLoadError(f"this {arch} GGUF has sinks (attn_sinks) on other layers than its sliding ones, where "
                             "MiMo-V2-Flash's Hugging Face model has them")
    head_dim = c["head_dim"]
    share = _key(reader, arch, "rope.dimension_count", head_dim) / head_dim
    base_swa = _key(reader, arch, "rope.freq_base_swa")
    value_scale = _key(reader, arch, "attention.value_scale")
    _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
    if c.pop("n_shared_experts"):
        raise ModelLoadError(f"this {arch} GGUF has shared experts, which MiMo-V2-Flash does not")
    c.update(num_key_value_heads=full_kv, v_head_dim=_key(reader, arch, "attention.value_length", head_dim),
             norm_topk_prob=True, attention_value_scale=_f32(value_scale) if value_scale is not None else None,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": c["rope_theta"],
                                                 "partial_rotary_factor": share},
                              "sliding_attention": {"rope_type": "default", "partial_rotary_factor": share,
                                                    "rope_theta": _f32(base_swa) if base_swa else c["rope_theta"]}},
             mlp_layer_types=["sparse" if f"blk.{i}.ffn_gate_inp.weight" in tensors else "dense" for i in range(n)])
    for key in ("first_k_dense_replace", "rope_theta"):
        c.pop(key, None)


def _dots1(reader, arch, tensors, c):
    """dots.llm1: llama.cpp's graph attends to every position (the file has no window), so every layer is full."""
    _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
    c.update(attention_bias="blk.0.attn_q.bias" in tensors, sliding_window=None,
             layer_types=["full_attention"] * c["num_hidden_layers"])


def _exaone_moe(reader, arch, tensors, c):
    """K-EXAONE: EXAONE 4.0's attention (window, per-layer pattern, RoPE) with DeepSeek-V3's router."""
    _nextn(reader, arch, c)
    _exaone4(reader, arch, tensors, c)
    _deepseek_router(reader, arch, c, "num_experts", "num_shared_experts")


def _latent_attention(reader, arch, c) -> None:
    """MLA's shape (models/mla.py) as config.json names it. A deepseek2 file written for llama.cpp's weight
    absorption gives the expanded head's sizes as attention.key_length_mla / value_length_mla (key_length and
    value_length are then the latent's); older ones, and minicpm3, as key_length / value_length. llama.cpp's
    defaults: hidden / heads; no q_lora_rank, queries by one attn_q. Every head has its own key (kv heads: the
    heads; the file's 1 is the latent's), and HF's head_dim is the rotated part."""
    default = c["hidden_size"] // c["num_attention_heads"]
    rope = _key(reader, arch, "rope.dimension_count")
    key = _key(reader, arch, "attention.key_length_mla") or _key(reader, arch, "attention.key_length", default)
    value = _key(reader, arch, "attention.value_length_mla") or _key(reader, arch, "attention.value_length", default)
    c.update(q_lora_rank=_key(reader, arch, "attention.q_lora_rank") or None,
             kv_lora_rank=_key(reader, arch, "attention.kv_lora_rank"), qk_rope_head_dim=rope,
             qk_nope_head_dim=key - rope, v_head_dim=value, head_dim=rope,
             num_key_value_heads=c["num_attention_heads"])


def _deepseek_yarn(reader, arch) -> dict | None:
    """rope.scaling.* as DeepSeek's YaRN. llama.cpp's deepseek2 graph scales the softmax by
    (1 + 0.1 m ln factor) ** 2 with m = rope.scaling.yarn_log_multiplier / 0.1 (the converter wrote 0.1 *
    mscale_all_dim) and leaves cos / sin unscaled, which is HF's with mscale = mscale_all_dim = m. Without the
    multiplier it scales both (the rotated dims twice), and linear scaling scales the softmax too: neither is an HF
    model's, so both are refused."""
    scaling = rope_scaling(reader, arch)
    if scaling is None:
        return None
    log_mul = _key(reader, arch, "rope.scaling.yarn_log_multiplier")
    if scaling["rope_type"] != "yarn" or not log_mul:
        raise ModelLoadError(f"this {arch} GGUF scales RoPE by {scaling['rope_type']} without "
                             f"{arch}.rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim), which llama.cpp "
                             "runs as no Hugging Face model does; re-convert the model with a current "
                             "convert_hf_to_gguf.py or load the Hugging Face checkpoint")
    mscale = _f32(np.float32(log_mul) / np.float32(0.1))              # llama.cpp's loader divides it back
    return dict(scaling, mscale=mscale, mscale_all_dim=mscale)


def _deepseek2(reader, arch, tensors, c):
    """DeepSeek-V2 / V3 and what llama.cpp converts as them (Kimi K2, Moonlight, GLM-4.7-Flash, Youtu-LLM): latent
    attention, RoPE on adjacent pairs (rope_interleave: the converter leaves q and kv_a_mqa as HF's interleaved
    checkpoints have them), no experts (Youtu), or the router llama.cpp runs by expert_gating_func: sigmoid is
    DeepSeek-V3's; softmax DeepSeek-V2's, which neither renormalises, adds a choice bias nor chooses in groups as
    llama.cpp would (by a group's two best experts, V2 by its best), so a file asking for any is refused."""
    _nextn(reader, arch, c)
    _latent_attention(reader, arch, c)
    c.update(rope_interleave=True, rope_scaling=_deepseek_yarn(reader, arch))
    if _key(reader, arch, "attention.temperature_scale"):
        raise ModelLoadError(f"GGUF {arch}.attention.temperature_scale (Llama 4's query temperature) is not supported "
                             f"for {arch}; load the Hugging Face checkpoint instead")
    if not _key(reader, arch, "expert_count"):
        c.update(model_type="youtu", architectures=["YoutuForCausalLM"])
        return
    if _key(reader, arch, "expert_gating_func") is None and c["num_hidden_layers"] in (47, 48) \
            and c["vocab_size"] == 154880:         # llama.cpp's loader: GLM-4.7-Flash, written before the key
        gating = gguf.ExpertGatingFuncType.SIGMOID
    else:
        gating = _key(reader, arch, "expert_gating_func", int(gguf.ExpertGatingFuncType.SOFTMAX))
    if gating != gguf.ExpertGatingFuncType.SOFTMAX:
        _deepseek_router(reader, arch, c, "n_routed_experts", "n_shared_experts")
        c.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
        return
    _v2_router(reader, arch, tensors, c)
    c.update(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"])


def _v2_router(reader, arch, tensors, c):
    """DeepSeek-V2's softmax router as llama.cpp's deepseek2 graph runs it: the HF counts (_routed_counts), greedy;
    a file asking for what llama.cpp runs otherwise than DeepSeek-V2's model is refused."""
    _routed_counts(reader, arch, c, "n_routed_experts", "n_shared_experts")
    refused = [key for key, asked in (("expert_weights_norm", c["norm_topk_prob"]), ("expert_group_count",
                                      c["n_group"] > 1), ("exp_probs_b", any("exp_probs_b" in t for t in tensors)))
               if asked]
    if refused:
        raise ModelLoadError(f"this {arch} GGUF routes by softmax with {', '.join(refused)}, which llama.cpp runs as "
                             "DeepSeek-V2's Hugging Face model does not (renormalised weights, groups scored by their "
                             "two best experts, a choice bias); load the Hugging Face checkpoint instead")
    c["topk_method"] = "greedy"


def _deepseek2_ocr(reader, arch, tensors, c):
    """DeepSeek-OCR's language model as llama.cpp's converter writes it (deepseek2-ocr): DeepSeek-V2's experts and
    softmax router (_v2_router) under multi-head attention, RoPE on halves of each whole head (llama.cpp's NeoX
    rope), the first leading_dense_block_count layers dense (first_k_dense_replace, as DeepSeek-OCR's own config
    gives them): DeepSeek-OCR 2's text model (deepseek_ocr2_text). Its
    converter writes Unlimited-OCR as it too, with a window llama.cpp does not run (that model keeps every prompt
    token and windows the generated ones): a file with one is refused."""
    if (window := _key(reader, arch, "attention.sliding_window")):
        raise ModelLoadError(f"this {arch} GGUF has a window ({arch}.attention.sliding_window {window}: "
                             "Unlimited-OCR's reference sliding-window attention), which kiln does not run yet")
    gating = _key(reader, arch, "expert_gating_func", int(gguf.ExpertGatingFuncType.SOFTMAX))
    if gating != gguf.ExpertGatingFuncType.SOFTMAX:
        raise ModelLoadError(f"this {arch} GGUF routes its experts by {gguf.ExpertGatingFuncType(gating).name.lower()}"
                             " (expert_gating_func), where DeepSeek-OCR's router is a softmax; re-convert the model")
    _v2_router(reader, arch, tensors, c)
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors


def _pangu(reader, arch, tensors, c):
    """openPangu-Embedded's keys: Llama's with biases on q, k, v and o (attention_bias), RoPE on halves (unpermuted);
    an output projection's bias without q's (a layout kiln's Llama has not) is refused."""
    _head_dim(reader, arch, c)
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if c["attention_bias"] != ("blk.0.attn_output.bias" in tensors):
        raise ModelLoadError(f"this {arch} GGUF has biases on attn_output or attn_q alone, where kiln's Llama has both "
                             "or neither; load the Hugging Face checkpoint instead")


def _nanbeige(reader, arch, tensors, c):
    """Nanbeige's keys: Llama's, and its loops (num_loops runs of the block_count layers, skip_loop_final_norm)."""
    _llama(reader, arch, tensors, c)
    c.update(num_loops=int(_key(reader, arch, "num_loops", 1)),
             skip_loop_final_norm=bool(_key(reader, arch, "skip_loop_final_norm", False)))


def _cogvlm(reader, arch, tensors, c):
    """CogVLM's language expert as llama.cpp's graph runs it on text: Phi-3's layers without a window (its whole
    head rotated, as NeoX's RoPE pairs halves)."""
    c["sliding_window"] = None


def _plm(reader, arch, tensors, c):
    """PLM's keys: latent attention's shape (_latent_attention), RoPE on interleaved pairs as its checkpoints store
    them (llama.cpp's NORM RoPE on q and kv_a_mqa as written), a squared ReLU."""
    _latent_attention(reader, arch, c)
    c.update(rope_interleave=True, hidden_act="relu2", tie_word_embeddings="output.weight" not in tensors)


def _smallthinker(reader, arch, tensors, c):
    """SmallThinker's keys as llama.cpp's loader reads them: its experts and their gating (softmax or sigmoid); with a
    window, each layer's kind from sliding_window_pattern (a list, or every n-th layer full, the first: 4 unless
    written) and no RoPE on every 4th layer, the first (the graph's fixed step), the released 21B's layout. The window
    is the file's (SmallThinker's sliding_window_size), which llama.cpp's loader replaces by 4096 (the released
    models' own). A RoPE base of the sliding layers' own (rope.freq_base_swa, which SmallThinker's code has not) is
    refused."""
    _head_dim(reader, arch, c)
    n, theta = c["num_hidden_layers"], c.get("rope_theta", 10000.0)
    gating = _key(reader, arch, "expert_gating_func")
    if gating not in (gguf.ExpertGatingFuncType.SOFTMAX, gguf.ExpertGatingFuncType.SIGMOID):
        raise ModelLoadError(f"this {arch} GGUF's expert_gating_func is {gating!r}, not softmax (1) or sigmoid "
                             "(2), SmallThinker's two routings; re-convert the model")
    window, sliding, rope = _key(reader, arch, "attention.sliding_window"), [False] * n, [True] * n
    if window:
        pattern = _key(reader, arch, "attention.sliding_window_pattern", 4)
        sliding = [bool(x) for x in pattern] if isinstance(pattern, list) else \
            [pattern == 0 or i % pattern != 0 for i in range(n)]
        rope = [i % 4 != 0 for i in range(n)]
        if len(sliding) != n:
            raise ModelLoadError(f"GGUF {arch}.attention.sliding_window_pattern lists {len(sliding)} layers for {n}; "
                                 "re-convert the model")
        if _f32(_key(reader, arch, "rope.freq_base_swa", theta)) != _f32(theta):
            raise ModelLoadError(f"this {arch} GGUF gives its sliding layers a RoPE base of their own "
                                 "(rope.freq_base_swa), which SmallThinker's code has not; load the Hugging Face "
                                 "checkpoint instead")
    c.update(moe_num_primary_experts=_key(reader, arch, "expert_count"),
             moe_num_active_primary_experts=_key(reader, arch, "expert_used_count"),
             moe_ffn_hidden_size=_key(reader, arch, "expert_feed_forward_length"),
             moe_primary_router_apply_softmax=gating == gguf.ExpertGatingFuncType.SOFTMAX,
             rope_layout=[int(r) for r in rope], sliding_window_layout=[int(s) for s in sliding],
             sliding_window_size=window or None)


def _qwen(reader, arch, tensors, c):
    """Qwen's (the first's) keys: RoPE over rope.dimension_count of each head (rotary_pct)."""
    c["partial_rotary_factor"] = _rotary_share(reader, arch, c)


def _bloom(reader, arch, tensors, c):
    """BloomModel's keys: the LayerNorms' epsilon as BloomConfig names it."""
    c["layer_norm_epsilon"] = c["rms_norm_eps"]


def _mpt(reader, arch, tensors, c):
    """MPTModel's keys as MPT's config.json names them: ALiBi where max_alibi_bias is not 0 (a file without it is
    refused by the family: kiln runs MPT's ALiBi), clip_qkv (clamp_kqv), the MLP's width as its expansion ratio,
    biases where stored; MPT's LayerNorm epsilon is its fixed 1e-5."""
    bias = _key(reader, arch, "attention.max_alibi_bias", 0.0)
    c.update(d_model=c["hidden_size"], n_heads=c["num_attention_heads"], n_layers=c["num_hidden_layers"],
             max_seq_len=c["max_position_embeddings"],
             expansion_ratio=_integral(c["intermediate_size"] / c["hidden_size"]),
             no_bias="blk.0.attn_qkv.bias" not in tensors,
             attn_config={"alibi": bool(bias), "alibi_bias_max": _integral(bias) if bias else 8,
                          "clip_qkv": _key(reader, arch, "attention.clamp_kqv"), "softmax_scale": None})


def _integral(value: float) -> int | float:
    """A float32 metadata value as the int a config.json that holds an int would (transformers' strict configs)."""
    value = _f32(value)
    return int(value) if value.is_integer() else value


def _bailingmoe2(reader, arch, tensors, c):
    """Ling 2.0 / Ring 2.0 and Sarvam MoE (BailingMoeV2Model's keys; both convert to it, Sarvam with full rotary):
    DeepSeek-V3's router as _deepseek_router reads it, the shared expert's width, RoPE's share of each head,
    biases on q/k/v where stored; block_count less the multi-token-prediction layers."""
    _nextn(reader, arch, c)
    _head_dim(reader, arch, c)
    _deepseek_router(reader, arch, c, "num_experts", "num_shared_experts")
    c.update(partial_rotary_factor=_rotary_share(reader, arch, c), use_qkv_bias="blk.0.attn_qkv.bias" in tensors,
             moe_shared_expert_intermediate_size=_key(reader, arch, "expert_shared_feed_forward_length"))


def _bailingmoe3(reader, arch, tensors, c):
    """Ling 3.0 (BailingMoeV3Model's keys): the KDA layers where head_count_kv (a layer) is 0 (kda.head_dim wide,
    ssm.conv_kernel taps, the bounded decay's kda.safe_gate / gate_lower_bound), latent attention as deepseek2's,
    DeepSeek-V3's router and shared expert (expert_shared_feed_forward_length), the SwiGLU clamps a layer;
    block_count less the multi-token-prediction layers. As transformers saves the model (linear_head_dim: its
    tensor names, LING3_LAYER's)."""
    _nextn(reader, arch, c)
    attends = _attention_layers(arch, c)[:c["num_hidden_layers"]]
    _latent_attention(reader, arch, c)
    _deepseek_router(reader, arch, c, "num_experts", "num_shared_experts")
    n = c["num_hidden_layers"]
    clamps = {hf: [float(v) for v in (_key(reader, arch, key) or [0.0] * n)][:n]
              for hf, key in (("expert_swiglu_limit_list", "swiglu_clamp_exp"),
                              ("share_expert_swiglu_limit_list", "swiglu_clamp_shexp"))}
    c.update(layer_types=["full_attention" if a else "linear_attention" for a in attends],
             linear_head_dim=_key(reader, arch, "kda.head_dim"), short_conv_kernel_size=_key(reader, arch,
                                                                                             "ssm.conv_kernel"),
             kda_safe_gate=bool(_key(reader, arch, "kda.safe_gate", True)),
             kda_lower_bound=_f32(_key(reader, arch, "kda.gate_lower_bound", -5.0)),
             moe_shared_expert_intermediate_size=_key(reader, arch, "expert_shared_feed_forward_length"), **clamps)


def _kimi_linear(reader, arch, tensors, c):
    """Kimi Linear (KimiLinearModel's keys): KDA layers where head_count_kv (a layer) is 0, their heads the
    attention's, kda.head_dim wide, their conv ssm.conv_kernel taps; latent attention as deepseek2's (its rotated
    part's width as rope.dimension_count; never rotated); DeepSeek-V3's router, its top k renormalised always (the
    graph llama.cpp runs it with; Moonshot's moe_renormalize)."""
    attends = _attention_layers(arch, c)
    _latent_attention(reader, arch, c)
    _deepseek_router(reader, arch, c, "num_experts", "num_shared_experts")
    c.update(norm_topk_prob=True, linear_attn_config={
        "kda_layers": [i + 1 for i, a in enumerate(attends) if not a],        # 1-based, as Moonshot's config
        "full_attn_layers": [i + 1 for i, a in enumerate(attends) if a], "num_heads": c["num_attention_heads"],
        "head_dim": _key(reader, arch, "kda.head_dim"), "short_conv_kernel_size": _key(reader, arch,
                                                                                      "ssm.conv_kernel")})


def _sparse_attention(reader, arch, tensors, c):
    """DeepSeek-V3.2 (deepseek32) and GLM-5 (glm-dsa): _deepseek2's reading, DeepSeek-V3's router, and the indexer's
    top k (`attention.indexer.top_k`): kiln reads both as deepseek_v32, its context capped there; the indexer's
    heads, width and layer kinds kept for transformers' reference (compiler/golden.py), which holds its tensors."""
    _deepseek2(reader, arch, tensors, c)
    if c["model_type"] != "deepseek_v3":
        raise ModelLoadError(f"this {arch} GGUF routes its experts by softmax (expert_gating_func), which DeepSeek "
                             "Sparse Attention's models do not; the file is inconsistent (re-convert it)")
    glm = arch == "glm-dsa"
    c.update(model_type="glm_moe_dsa" if glm else "deepseek_v32",
             architectures=["GlmMoeDsaForCausalLM" if glm else "DeepseekV32ForCausalLM"],
             index_topk=int(_key(reader, arch, "attention.indexer.top_k", 2048)))
    for key, hf_key in (("head_count", "index_n_heads"), ("key_length", "index_head_dim")):   # the reference's
        if (value := _key(reader, arch, f"attention.indexer.{key}")) is not None:                # indexer shapes
            c[hf_key] = int(value)
    if (full := _key(reader, arch, "attention.indexer.types")) is not None:     # GLM-5: a layer reusing another's
        c["indexer_types"] = ["full" if f else "shared" for f in full]


def _mistral4(reader, arch, tensors, c):
    """Mistral 4: DeepSeek's latent attention and YaRN (_deepseek2's reading) with its softmax router, in groups
    scored by their two best experts, renormalised and scaled where the file says (as llama.cpp's graph and
    transformers' model both run it), and Llama 4's query temperature where the file has one (the Mistral-format
    converter writes it; the Hugging Face one does not, and llama.cpp then runs without)."""
    _nextn(reader, arch, c)
    _latent_attention(reader, arch, c)
    scaling = _deepseek_yarn(reader, arch)
    gating = _key(reader, arch, "expert_gating_func", int(gguf.ExpertGatingFuncType.SOFTMAX))
    if gating != gguf.ExpertGatingFuncType.SOFTMAX:
        raise ModelLoadError(f"this {arch} GGUF scores its experts by gating function {gating}; Mistral 4's are "
                             "softmax scores; re-convert the model")
    if (beta := _key(reader, arch, "attention.temperature_scale")):
        length = _key(reader, arch, "attention.temperature_length")
        if scaling is None or length != scaling.get("original_max_position_embeddings"):
            raise ModelLoadError(f"this {arch} GGUF's query temperature runs over {length} positions, not YaRN's "
                                 "pretraining context; load the Hugging Face checkpoint instead")
        scaling = dict(scaling, llama_4_scaling_beta=_f32(beta))
    _routed_counts(reader, arch, c, "n_routed_experts", "n_shared_experts")
    c.update(rope_interleave=True, rope_scaling=scaling)


def _minicpm3(reader, arch, tensors, c):
    """MiniCPM3: latent attention with RoPE on halves and LongRoPE (rope_factors_long / _short, from the pretraining
    context: context_length, llama.cpp's default); the converter writes none of MiniCPM's scales, and llama.cpp's
    graph fixes them at MiniCPM3-4B's (embedding x 12, residual x 1.4 / sqrt(layers), logits x 256 / hidden)."""
    _latent_attention(reader, arch, c)
    c.update(scale_emb=12.0, scale_depth=1.4, dim_model_base=256)
    if "rope_factors_long.weight" in tensors:
        c["rope_scaling"] = _longrope(tensors, c["max_position_embeddings"])


def _minimax_m2(reader, arch, tensors, c):
    """MiniMax-M2: sigmoid scores with a choice bias, the top k renormalised (llama.cpp's graph always does, as HF),
    experts of feed_forward_length, partial rotary as rope.dimension_count."""
    _sigmoid_router(reader, arch)
    _no_groups(reader, arch)
    c.update(num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             partial_rotary_factor=_rotary_share(reader, arch, c))


def _minimax_m3(reader, arch, tensors, c):
    """MiniMax-M3's language model (MiniMaxM3Model's keys), as its released config.json says it: minimax-m2's router,
    experts of expert_feed_forward_length and a shared expert of ffn_up_shexp's rows (the loader's default, their
    width a shared one, where the file has none), the
    leading dense layers' MLPs of feed_forward_length, RoPE's share as rope.dimension_count (rope_parameters:
    transformers' M3 reads nothing else), the sparse layers those holding an indexer, its top-k blocks of block_size
    (the context cap); the clamped SwiGLU's alpha and limit llama.cpp's graph fixes (MiniMax-M3's 1.702, 7)."""
    _sigmoid_router(reader, arch)
    _no_groups(reader, arch)
    _head_dim(reader, arch, c)
    n, dense = c["num_hidden_layers"], _key(reader, arch, "leading_dense_block_count", 0)
    width = _key(reader, arch, "expert_feed_forward_length")
    theta = c.pop("rope_theta")
    scale = _key(reader, arch, "expert_weights_scale", 0.0)
    shexp = f"blk.{dense}.ffn_up_shexp.weight"          # its rows (GGUF shapes: [cols, rows]), else the loader's
    shared = int(tensors[shexp].shape[-1]) if shexp in tensors else width * _key(reader, arch, "expert_shared_count", 1)
    c.update(architectures=["MiniMaxM3SparseForCausalLM"], dense_intermediate_size=c["intermediate_size"],
             intermediate_size=width, shared_intermediate_size=shared,
             num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             routed_scaling_factor=_f32(scale) if scale else 1.0,
             mlp_layer_types=["dense" if i < dense else "sparse" for i in range(n)],
             layer_types=["minimax_m3_sparse" if f"blk.{i}.indexer.q_proj.weight" in tensors else "full_attention"
                          for i in range(n)],
             index_topk_blocks=_key(reader, arch, "attention.indexer.top_k", 16),
             index_block_size=_key(reader, arch, "attention.indexer.block_size", 128),
             index_local_blocks=_key(reader, arch, "attention.indexer.local_blocks", 1),
             rope_parameters={"rope_type": "default", "rope_theta": theta,
                              "partial_rotary_factor": _rotary_share(reader, arch, c)}, rope_scaling=None)


def _gpt_oss(reader, arch, tensors, c):
    """gpt-oss: experts of expert_feed_forward_length, the window (llama.cpp slides every other layer from
    the first, as gpt-oss's config does), YaRN without truncating its correction range (gpt-oss's
    `truncate: false`, which the file cannot say)."""
    _head_dim(reader, arch, c)
    scaling = rope_scaling(reader, arch)
    rope = dict(scaling, truncate=False) if scaling and scaling["rope_type"] == "yarn" else scaling
    c.update(num_local_experts=_key(reader, arch, "expert_count"),
             num_experts_per_tok=_key(reader, arch, "expert_used_count"),
             intermediate_size=_key(reader, arch, "expert_feed_forward_length") or c["intermediate_size"],
             sliding_window=_key(reader, arch, "attention.sliding_window"), attention_bias=True,
             rope_parameters={"rope_type": "default", **(rope or {}), "rope_theta": c["rope_theta"]},
             rope_scaling=None)


def _ernie4_5_moe(reader, arch, tensors, c):
    """ERNIE 4.5 MoE as llama.cpp's graph runs it whatever the file says: softmax scores, the top k renormalised
    (its floor, 6e-5 against HF's moe_norm_min, is below any top-k softmax sum of fewer than 16k experts); sparse
    every interleave_moe_layer_step-th layer from leading_dense_block_count to the last."""
    _ernie4_5(reader, arch, tensors, c)
    _no_groups(reader, arch)
    c.update(moe_num_experts=_key(reader, arch, "expert_count"), moe_k=_key(reader, arch, "expert_used_count"),
             moe_intermediate_size=_key(reader, arch, "expert_feed_forward_length"),
             moe_num_shared_experts=_key(reader, arch, "expert_shared_count", 0),
             moe_layer_start_index=_key(reader, arch, "leading_dense_block_count", 0),
             moe_layer_interval=_key(reader, arch, "interleave_moe_layer_step", 1))


def _hunyuan_moe(reader, arch, tensors, c):
    """Hunyuan MoE as llama.cpp's graph runs it: softmax scores, the top k (expert_used_count, one or per layer)
    renormalised; experts and the shared MLP of feed_forward_length."""
    _qwen3(reader, arch, tensors, c)
    _no_groups(reader, arch)
    c.update(num_experts=_key(reader, arch, "expert_count"), moe_topk=_key(reader, arch, "expert_used_count"))


def _relu2(reader, arch, tensors, c):
    """Nemotron and Jais 2: relu^2 MLPs not gated, LayerNorm, biases where written, partial rotary as
    rope.dimension_count."""
    _head_dim(reader, arch, c)
    c.update(attention_bias="blk.0.attn_q.bias" in tensors, mlp_bias="blk.0.ffn_up.bias" in tensors,
             partial_rotary_factor=_rotary_share(reader, arch, c), hidden_act="relu2")


def _olmo(reader, arch, tensors, c):
    """OLMo 1: as llama (q/k rows permuted), no norm weights at all, clip_qkv as attention.clamp_kqv."""
    _head_dim(reader, arch, c)
    c.update(attention_bias="blk.0.attn_q.bias" in tensors, clip_qkv=_key(reader, arch, "attention.clamp_kqv"))


def _falcon(reader, arch, tensors, c):
    """Falcon: parallel attention and MLP; the new decoder architecture (kv groups, ln_attn / ln_mlp) where
    the file has a second norm or more than one kv head (llama.cpp's falcon graph decides so too)."""
    two_norms = "blk.0.attn_norm_2.weight" in tensors
    new = two_norms or c["num_key_value_heads"] > 1
    c.update(layer_norm_epsilon=c.pop("rms_norm_eps"), num_kv_heads=c["num_key_value_heads"],
             ffn_hidden_size=c.pop("intermediate_size"), new_decoder_architecture=new, multi_query=not new,
             parallel_attn=True, bias="blk.0.attn_qkv.bias" in tensors, num_ln_in_parallel_attn=2 if two_norms else 1,
             alibi=False)


def _starcoder(reader, arch, tensors, c):
    """GPT-BigCode (StarCoder 1): GPT-2's metadata, one kv head, the head tied where the file has no output. The
    converter writes head_count_kv 1 even for a GPT-BigCode without multi_query: attn_qkv's rows (3 x the width) say
    so."""
    tie = "output.weight" not in tensors
    qkv = tensors.get("blk.0.attn_qkv.weight")
    mha = qkv is not None and int(qkv.shape[1]) == 3 * c["hidden_size"] and c["num_attention_heads"] > 1
    _gpt2(reader, arch, tensors, c)
    c.update(activation_function="gelu_pytorch_tanh", multi_query=not mha, tie_word_embeddings=tie)


GGUF_ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", ("LlamaForCausalLM",), {**LLAMA_LAYER, "ffn_gate_inp": "block_sparse_moe.gate"},
                      permuted=True, config=_llama, experts=MIXTRAL_EXPERTS, also=("mistral", "mixtral")),
    "qwen2": GGUFArch("qwen2", ("Qwen2ForCausalLM",), LLAMA_LAYER),
    "qwen3": GGUFArch("qwen3", ("Qwen3ForCausalLM",), {**LLAMA_LAYER, **QK_NORMS}, config=_qwen3),
    "gemma2": GGUFArch("gemma2", ("Gemma2ForCausalLM",), GEMMA_LAYER, norm_shift=1.0, config=_gemma(2, 46)),
    "gemma3": GGUFArch("gemma3_text", ("Gemma3ForCausalLM",), GEMMA_LAYER, norm_shift=1.0, config=_gemma(6, 62)),
    "lfm2": GGUFArch("lfm2", ("Lfm2ForCausalLM",), LFM2_LAYER, LFM2_GLOBAL, config=_lfm2, squeezed=("shortconv.conv",)),
    "lfm2moe": GGUFArch("lfm2_moe", ("Lfm2MoeForCausalLM",), LFM2_MOE_LAYER, LFM2_GLOBAL, config=_lfm2moe,
                        squeezed=("shortconv.conv",), experts=LFM2_EXPERTS),
    "gemma3n": GGUFArch("gemma3n_text", ("Gemma3nForCausalLM",), GEMMA3N_LAYER, GEMMA4_GLOBAL, config=_gemma3n,
                        stacked={"altup_proj": "model.altup_projections.{j}",
                                 "altup_unembd_proj": "model.altup_unembed_projections.{j}"}),
    "gemma4": GGUFArch("gemma4_text", ("Gemma4ForCausalLM",), GEMMA4_LAYER, GEMMA4_GLOBAL, config=_gemma4),
    "phi3": GGUFArch("phi3", ("Phi3ForCausalLM",), PHI3_LAYER, config=_phi3),
    "granite_swa": GGUFArch("granite_swa", ("GraniteSWAForCausalLM",), GRANITE_SWA_LAYER, permuted=True,
                            config=_granite_swa, also=("granitemoe_swa",)),
    "chatglm": GGUFArch("glm", ("GlmForCausalLM",), CHATGLM_LAYER, config=_chatglm, parts=_chatglm_qkv),
    "bitnet": GGUFArch("bitnet", ("BitNetForCausalLM",), BITNET_LAYER, config=_bitnet, weight_scales=BITNET_LINEARS),
    "dbrx": GGUFArch("dbrx", ("DbrxForCausalLM",), DBRX_LAYER, DBRX_GLOBAL, layer_prefix="transformer.blocks",
                     config=_dbrx, transposed=("ffn_down_exps",),
                     merged=("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")),
    "phimoe": GGUFArch("phimoe", ("PhimoeForCausalLM",), PHIMOE_LAYER, config=_phimoe, experts=MIXTRAL_EXPERTS),
    "gpt2": GGUFArch("gpt2", ("GPT2LMHeadModel",), GPT2_LAYER, GPT2_GLOBAL, layer_prefix="transformer.h",
                     transposed=("attn_qkv", "attn_output", "ffn_up", "ffn_down"), config=_gpt2),
    "jais": GGUFArch("jais", ("JAISLMHeadModel",), {**GPT2_LAYER, "ffn_gate": "mlp.c_fc2"}, GPT2_GLOBAL,
                     layer_prefix="transformer.h",
                     transposed=("attn_qkv", "attn_output", "ffn_up", "ffn_down", "ffn_gate"), config=_jais),
    "granite": GGUFArch("granite", ("GraniteForCausalLM",), LLAMA_LAYER, permuted=True, config=_granite),
    "olmo2": GGUFArch("olmo2", ("Olmo2ForCausalLM",), OLMO2_LAYER, config=_olmo2, also=("olmo3",)),
    "exaone": GGUFArch("exaone", ("ExaoneForCausalLM",), EXAONE_LAYER, EXAONE_GLOBAL, layer_prefix="transformer.h",
                       config=_exaone),
    "exaone4": GGUFArch("exaone4", ("Exaone4ForCausalLM",), OLMO2_LAYER, config=_exaone4),
    "seed_oss": GGUFArch("seed_oss", ("SeedOssForCausalLM",), SEED_OSS_LAYER, config=_seed_oss),
    "bailingmoe": GGUFArch("granitemoeshared", ("GraniteMoeSharedForCausalLM",), GRANITE_MOE_LAYER, permuted=True,
                           config=_bailingmoe, joined=GRANITE_MOE_JOINED),
    "granitemoe": GGUFArch("granitemoe", ("GraniteMoeForCausalLM",), GRANITE_MOE_LAYER, permuted=True,
                           config=_granitemoe, also=("granitemoeshared",), joined=GRANITE_MOE_JOINED),
    "nemotron": GGUFArch("nemotron", ("NemotronForCausalLM",), LLAMA_LAYER, norm_shift=1.0, config=_relu2),
    "jais2": GGUFArch("jais2", ("Jais2ForCausalLM",), LLAMA_LAYER, config=_relu2),
    "arcee": GGUFArch("arcee", ("ArceeForCausalLM",), LLAMA_LAYER, permuted=True, config=_llama),
    "pangu-embedded": GGUFArch("llama", ("PanguEmbeddedForCausalLM",), LLAMA_LAYER, config=_pangu),
    "qwen": GGUFArch("qwen", ("QWenLMHeadModel",), QWEN_LAYER, EXAONE_GLOBAL, layer_prefix="transformer.h",
                     config=_qwen),
    "xverse": GGUFArch("xverse", ("XverseForCausalLM",), LLAMA_LAYER, permuted=True, config=_llama),
    "cogvlm": GGUFArch("phi3", ("Phi3ForCausalLM",), {k: v for k, v in PHI3_LAYER.items() if k != "ffn_up"},
                       joined={"mlp.gate_up_proj": ("ffn_gate", "ffn_up")}, config=_cogvlm),
    "plm": GGUFArch("plm", ("PLMForCausalLM",), {k: v for k, v in MLA_LAYER.items() if k != "ffn_gate"}, config=_plm),
    "smallthinker": GGUFArch("smallthinker", ("SmallThinkerForCausalLM",), SMALLTHINKER_LAYER, config=_smallthinker,
                             experts={f"ffn_{p}_exps": f"block_sparse_moe.experts.{{j}}.{p}" for p in ("gate", "up",
                                                                                                   "down")}),
    "nanbeige": GGUFArch("nanbeige", ("NanbeigeForCausalLM",), LLAMA_LAYER, permuted=True, config=_nanbeige),
    "olmo": GGUFArch("olmo", ("OlmoForCausalLM",), LLAMA_LAYER, permuted=True, config=_olmo),
    "falcon": GGUFArch("falcon", ("FalconForCausalLM",), FALCON_LAYER, FALCON_GLOBAL, layer_prefix="transformer.h",
                       by_group=("attn_qkv",), config=_falcon,
                       renames=lambda c: {"attn_norm": "ln_mlp"} if c["num_ln_in_parallel_attn"] == 2 else {}),
    "starcoder": GGUFArch("gpt_bigcode", ("GPTBigCodeForCausalLM",), GPT2_LAYER, GPT2_GLOBAL,
                          layer_prefix="transformer.h", config=_starcoder),
    "hunyuan-dense": GGUFArch("hunyuan_v1_dense", ("HunYuanDenseV1ForCausalLM",), HUNYUAN_LAYER, config=_qwen3),
    "maincoder": GGUFArch("hunyuan_v1_dense", ("HunYuanDenseV1ForCausalLM",), HUNYUAN_LAYER, permuted=True,
                          config=_maincoder, reorder=_pair_order_norm_dims),
    "smollm3": GGUFArch("smollm3", ("SmolLM3ForCausalLM",), LLAMA_LAYER, permuted=True, config=_smollm3),
    "stablelm": GGUFArch("stablelm", ("StableLmForCausalLM",), LLAMA_LAYER, config=_stablelm),
    "phi2": GGUFArch("phi", ("PhiForCausalLM",), PHI2_LAYER, PHI2_GLOBAL, config=_phi2),
    "gptneox": GGUFArch("gpt_neox", ("GPTNeoXForCausalLM",), NEOX_LAYER, NEOX_GLOBAL, layer_prefix="gpt_neox.layers",
                        config=_gptneox, by_kind=("attn_qkv",)),
    "qwen2moe": GGUFArch("qwen2_moe", ("Qwen2MoeForCausalLM",), QWEN_MOE_LAYER, config=_qwen_moe,
                         experts=QWEN_EXPERTS),
    "mellum": GGUFArch("mellum", ("MellumForCausalLM",), {**QWEN_MOE_LAYER, **QK_NORMS}, config=_mellum,
                       experts=QWEN_EXPERTS),
    "qwen3moe": GGUFArch("qwen3_moe", ("Qwen3MoeForCausalLM",), {**QWEN_MOE_LAYER, **QK_NORMS}, config=_qwen_moe,
                         experts=QWEN_EXPERTS),
    # Qwen2-VL / 2.5-VL, Qwen3-VL, Qwen3-VL-MoE: their text models (the vision tower is the mmproj file), whose
    # M-RoPE (rope.dimension_sections) turns a text token's frequencies all by its position: plain RoPE (models/
    # qwen_vl.py); Qwen3-VL's deepstack features add zeros to a text token's layers.
    "qwen2vl": GGUFArch("qwen2", ("Qwen2ForCausalLM",), LLAMA_LAYER, config=_no_head_bias),
    # MiniCPM 1 / 2 / 4: muP's scales as Granite's metadata (embedding_scale, residual_scale, logit_scale)
    "minicpm": GGUFArch("granite", ("GraniteForCausalLM",), LLAMA_LAYER, permuted=True, config=_minicpm),
    # InternLM 2: the converter splits wqkv into Llama's q, k and v (q and k permuted as LlamaModel's): a Llama
    "internlm2": GGUFArch("llama", ("LlamaForCausalLM",), LLAMA_LAYER, permuted=True),
    "qwen3vl": GGUFArch("qwen3", ("Qwen3ForCausalLM",), {**LLAMA_LAYER, **QK_NORMS}, config=_qwen3),
    "qwen3vlmoe": GGUFArch("qwen3_moe", ("Qwen3MoeForCausalLM",), {**QWEN_MOE_LAYER, **QK_NORMS}, config=_qwen_moe,
                           experts=QWEN_EXPERTS),
    **{name: GGUFArch(model_type, (hf_arch,), layers, config=_qwen35, norm_shift=1.0, unshifted=("ssm_norm",),
                      values={"ssm_a": lambda a: np.log(-a)}, reorder=_qwen35_v_order, squeezed=("ssm_conv1d",),
                      experts=QWEN_EXPERTS)
       for name, model_type, hf_arch, layers in (
           ("qwen35", "qwen3_5_text", "Qwen3_5ForCausalLM", QWEN35_LAYER),
           ("qwen35moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", QWEN35_MOE_LAYER))},
    # Qwen3-Next read as the Qwen3.5-MoE text model it computes (its experts in every layer, renormalised, as
    # llama.cpp's graph runs them): its DeltaNet as Qwen3.5's, but the V heads kept in HF's order and ssm_ba parted
    "qwen3next": GGUFArch("qwen3_5_moe_text", ("Qwen3_5MoeForCausalLM",),
                          {k: v for k, v in QWEN35_MOE_LAYER.items() if k not in ("ssm_beta", "ssm_alpha")},
                          config=_qwen35, norm_shift=1.0, unshifted=("ssm_norm",),
                          values={"ssm_a": lambda a: np.log(-a)}, squeezed=("ssm_conv1d",), experts=QWEN_EXPERTS,
                          parts=_qwen3next_ba),
    "starcoder2": GGUFArch("starcoder2", ("Starcoder2ForCausalLM",), STARCODER2_LAYER, config=_starcoder2),
    "codeshell": GGUFArch("starcoder2", ("Starcoder2ForCausalLM",), STARCODER2_LAYER, config=_codeshell),
    "ernie4_5": GGUFArch("ernie4_5", ("Ernie4_5ForCausalLM",), LLAMA_LAYER, config=_ernie4_5),
    "paddleocr": GGUFArch("llama", ("LlamaForCausalLM",), LLAMA_LAYER, config=_paddleocr),
    "chameleon": GGUFArch("chameleon", ("ChameleonForConditionalGeneration",), {**LLAMA_LAYER, **QK_NORMS},
                          permuted=True, config=_chameleon, reorder=_chameleon_norm_dims),
    "baichuan": GGUFArch("baichuan", ("BaichuanForCausalLM",), LLAMA_LAYER, permuted=True, config=_baichuan),
    "refact": GGUFArch("baichuan", ("BaichuanForCausalLM",), LLAMA_LAYER, config=_refact),
    "hrm_text": GGUFArch("hrm_text", ("HrmTextForCausalLM",), {**LLAMA_LAYER, "attn_gate": "self_attn.gate_proj"},
                         config=_hrm_text, whole_names={"hrm.z_l_init": "model.z_L_init"}),
    "muse-glimmer": GGUFArch("muse_glimmer_text", ("MuseGlimmerForConditionalGeneration",),
                             {**GEMMA_LAYER, "attn_gate": "self_attn.gate_proj"}, permuted=True, norm_shift=1.0,
                             unshifted=("output_norm",), config=_muse_glimmer),
    "hunyuan_vl": GGUFArch("hunyuan_v1_dense", ("HunYuanDenseV1ForCausalLM",), HUNYUAN_LAYER, config=_hunyuan_vl),
    "glm4": GGUFArch("glm4", ("Glm4ForCausalLM",), GLM4_LAYER, config=_glm4, reorder=_glm4_rows),
    "command-r": GGUFArch("cohere", ("CohereForCausalLM",), {**LLAMA_LAYER, **QK_NORMS}, config=_cohere),
    "cohere2": GGUFArch("cohere2", ("Cohere2ForCausalLM",), LLAMA_LAYER, config=_cohere),
    "cohere2moe": GGUFArch("cohere2_moe", ("Cohere2MoeForCausalLM",), COHERE2_MOE_LAYER, config=_cohere2moe,
                           experts=QWEN_EXPERTS),
    "olmoe": GGUFArch("olmoe", ("OlmoeForCausalLM",), OLMOE_LAYER, config=_olmoe, experts=QWEN_EXPERTS),
    "gemma": GGUFArch("gemma", ("GemmaForCausalLM",), LLAMA_LAYER, norm_shift=1.0, config=_gemma(1, 0)),
    "mimo2": GGUFArch("mimo_v2_flash", ("MiMoV2FlashForCausalLM",), MIMO2_LAYER, config=_mimo2, experts=QWEN_EXPERTS),
    "glm4moe": GGUFArch("glm4_moe", ("Glm4MoeForCausalLM",), GLM4_MOE_LAYER, config=_glm4_moe, experts=QWEN_EXPERTS),
    "deci": GGUFArch("nemotron-nas", ("DeciLMForCausalLM",), LLAMA_LAYER, permuted=True, config=_deci, also=("deci",),
                     block_renames=_deci_linear_attention),
    "openelm": GGUFArch("openelm", ("OpenELMForCausalLM",), OPENELM_LAYER, global_names=OPENELM_GLOBAL,
                        layer_prefix="transformer.layers", config=_openelm,
                        joined={"ffn.proj_1": ("ffn_gate", "ffn_up")}),
    "orion": GGUFArch("orion", ("OrionForCausalLM",), LLAMA_LAYER),
    "step35": GGUFArch("step3p5", ("Step3p5ForCausalLM",), STEP35_LAYER, config=_step35, norm_shift=1.0),
    "laguna": GGUFArch("laguna", ("LagunaForCausalLM",), LAGUNA_LAYER, config=_laguna, experts=QWEN_EXPERTS),
    "hy_v3": GGUFArch("hy_v3", ("HYV3ForCausalLM",),
                      {**{k: v for k, v in ROUTED_LAYER.items() if k != "exp_probs_b.bias"},
                       "ffn_gate_inp": "mlp.router.gate", "exp_probs_b": "mlp.expert_bias",
                       **_mlp("mlp.shared_mlp", "_shexp")},
                      config=_hy_v3, experts=QWEN_EXPERTS),
    "dots1": GGUFArch("dots1", ("Dots1ForCausalLM",), ROUTED_LAYER, config=_dots1, experts=QWEN_EXPERTS),
    "exaone-moe": GGUFArch("exaone_moe", ("ExaoneMoeForCausalLM",),
                           {**ROUTED_LAYER, "exp_probs_b.bias": "mlp.e_score_correction_bias"}, config=_exaone_moe,
                           experts=QWEN_EXPERTS),
    "minimax-m2": GGUFArch("minimax_m2", ("MiniMaxM2ForCausalLM",), MINIMAX_M2_LAYER, config=_minimax_m2,
                           experts=MIXTRAL_EXPERTS),
    "minimax-m3": GGUFArch("minimax_m3_vl_text", ("MiniMaxM3SparseForCausalLM",), MINIMAX_M3_LAYER,
                           config=_minimax_m3, experts=MIXTRAL_EXPERTS, norm_shift=1.0),
    "ernie4_5-moe": GGUFArch("ernie4_5_moe", ("Ernie4_5_MoeForCausalLM",), ERNIE_MOE_LAYER, config=_ernie4_5_moe,
                             experts=QWEN_EXPERTS),
    "bloom": GGUFArch("bloom", ("BloomForCausalLM",), BLOOM_LAYER, BLOOM_GLOBAL, layer_prefix="transformer.h",
                      by_kind=("attn_qkv",), config=_bloom),
    "mpt": GGUFArch("mpt", ("MptForCausalLM",), MPT_LAYER, MPT_GLOBAL, layer_prefix="transformer.blocks", config=_mpt),
    "bailingmoe2": GGUFArch("bailing_moe_v2", ("BailingMoeV2ForCausalLM",), BAILING_LAYER, config=_bailingmoe2,
                            global_names=dict(LLAMA_GLOBAL, token_embd="model.word_embeddings"),
                            experts=QWEN_EXPERTS, also=("sarvam_moe",)),
    "bailingmoe3": GGUFArch("bailing_hybrid", ("BailingHybridForCausalLM",), LING3_LAYER, config=_bailingmoe3,
                            global_names=dict(LLAMA_GLOBAL, token_embd="model.word_embeddings"), experts=QWEN_EXPERTS,
                            values={"ssm_a": lambda a: np.log(a)}, also=("bailing_moe_v3",),
                            by_head={"attention.kv_b_proj": ("attn_k_b", "attn_v_b")}),
    "kimi-linear": GGUFArch("kimi_linear", ("KimiLinearForCausalLM",), KIMI_LINEAR_LAYER, config=_kimi_linear,
                            experts=MIXTRAL_EXPERTS, values={"ssm_a": lambda a: np.log(-a)},
                            by_head={"self_attn.kv_b_proj": ("attn_k_b", "attn_v_b")}),
    "deepseek": GGUFArch("deepseek", ("DeepseekForCausalLM",), ROUTED_LAYER, permuted=True, config=_v2_router,
                         experts=QWEN_EXPERTS),
    "deepseek2-ocr": GGUFArch("deepseek_ocr2_text", ("DeepseekOcr2ForConditionalGeneration",), ROUTED_LAYER,
                              config=_deepseek2_ocr, experts=QWEN_EXPERTS),
    "deepseek2": GGUFArch("deepseek_v3", ("DeepseekV3ForCausalLM",), DEEPSEEK2_LAYER, config=_deepseek2,
                          experts=QWEN_EXPERTS, also=("deepseek_v2", "youtu"),
                          by_head={"self_attn.kv_b_proj": ("attn_k_b", "attn_v_b")}),
    **{name: GGUFArch(model_type, (hf_class,), DSA_LAYER, config=_sparse_attention, experts=QWEN_EXPERTS,
                      by_head={"self_attn.kv_b_proj": ("attn_k_b", "attn_v_b")})
       for name, model_type, hf_class in (("deepseek32", "deepseek_v32", "DeepseekV32ForCausalLM"),
                                          ("glm-dsa", "glm_moe_dsa", "GlmMoeDsaForCausalLM"))},
    "mistral4": GGUFArch("mistral4", ("Mistral4ForCausalLM",),
                         {**DEEPSEEK2_LAYER, "ffn_gate_up_exps.weight": "mlp.experts.gate_up_proj",
                          "ffn_down_exps.weight": "mlp.experts.down_proj"}, config=_mistral4,
                         by_head={"self_attn.kv_b_proj": ("attn_k_b", "attn_v_b")}),
    "minicpm3": GGUFArch("minicpm3", ("MiniCPM3ForCausalLM",), MLA_LAYER, config=_minicpm3),
    # AfmoeModel writes q/k rows as they are (its modify_tensors skips LlamaModel's permutation): NeoX RoPE
    "afmoe": GGUFArch("afmoe", ("AfmoeForCausalLM",), AFMOE_LAYER, config=_afmoe,
                      experts=QWEN_EXPERTS),
    "mistral3": GGUFArch("ministral3", ("Ministral3ForCausalLM",), LLAMA_LAYER, permuted=True, config=_mistral3),
    "granitehybrid": GGUFArch("granitemoehybrid", ("GraniteMoeHybridForCausalLM",),
                              {**GRANITE_MOE_LAYER, **mamba2_layer("mamba")}, permuted=True,
                              config=_granitehybrid, joined=GRANITE_MOE_JOINED, squeezed=("ssm_conv1d",),
                              values=_MAMBA2_A, flattened=MAMBA2_FLATTENED,
                              renames=lambda c: {} if c["num_local_experts"] else {
                                  "ffn_down": "shared_mlp.output_linear"},            # dense: the MLP as shared_mlp
                              joins=lambda c: {} if c["num_local_experts"] else {
                                  "shared_mlp.input_linear": ("ffn_gate", "ffn_up")}),
    "nemotron_h": GGUFArch("nemotron_h", ("NemotronHForCausalLM",), NEMOTRON_H_LAYER, permuted=True,
                           global_names=BACKBONE_GLOBAL, layer_prefix="backbone.layers", config=_nemotron_h,
                           squeezed=("ssm_conv1d",), values=_MAMBA2_A, flattened=MAMBA2_FLATTENED),
    "nemotron_h_moe": GGUFArch("nemotron_h", ("NemotronHForCausalLM",), NEMOTRON_H_MOE_LAYER, permuted=True,
                               global_names=BACKBONE_GLOBAL, layer_prefix="backbone.layers", config=_nemotron_h_moe,
                               experts=NEMOTRON_H_EXPERTS, squeezed=("ssm_conv1d",), values=_MAMBA2_A,
                               flattened=MAMBA2_FLATTENED),
    "falcon-h1": GGUFArch("falcon_h1", ("FalconH1ForCausalLM",), FALCON_H1_LAYER, config=_falcon_h1,
                          global_names={**LLAMA_GLOBAL, "output_norm": "model.final_layernorm"},
                          squeezed=("ssm_conv1d",), values=_MAMBA2_A, flattened=MAMBA2_FLATTENED),
    "jamba": GGUFArch("jamba", ("JambaForCausalLM",), JAMBA_LAYER, config=_jamba, squeezed=("ssm_conv1d",),
                      values=_MAMBA2_A, global_names={**LLAMA_GLOBAL, "output_norm": "model.final_layernorm"},
                      experts={"ffn_gate_exps": "feed_forward.experts.{j}.gate_proj",
                               "ffn_up_exps": "feed_forward.experts.{j}.up_proj",
                               "ffn_down_exps": "feed_forward.experts.{j}.down_proj"}),
    "mamba": GGUFArch("mamba", ("MambaForCausalLM",), MAMBA1_LAYER,
                      global_names=BACKBONE_GLOBAL, layer_prefix="backbone.layers", config=_mamba1,
                      also=("falcon_mamba",), squeezed=("ssm_conv1d",), values=_MAMBA2_A),
    "mamba2": GGUFArch("mamba2", ("Mamba2ForCausalLM",), {"attn_norm": "norm", **mamba2_layer("mixer")},
                       global_names=BACKBONE_GLOBAL, layer_prefix="backbone.layers", config=_mamba2_only,
                       squeezed=("ssm_conv1d",), values=_MAMBA2_A, flattened=MAMBA2_FLATTENED),
    "hunyuan-moe": GGUFArch("hunyuan_v1_moe", ("HunYuanMoEV1ForCausalLM",), HUNYUAN_MOE_LAYER, config=_hunyuan_moe,
                            experts=QWEN_EXPERTS),
    "apertus": GGUFArch("apertus", ("ApertusForCausalLM",),
                        {**{k: v for k, v in LLAMA_LAYER.items() if k not in ("ffn_gate", "attn_norm", "ffn_norm")},
                         **QK_NORMS, "attn_norm": "attention_layernorm", "ffn_norm": "feedforward_layernorm"},
                        config=_apertus, from_metadata=XIELU),
    "llama4": GGUFArch("llama4_text", ("Llama4ForCausalLM",), LLAMA4_LAYER, config=_llama4,
                       transposed=("ffn_down_exps",),
                       concatenated={"feed_forward.experts.gate_up_proj": ("ffn_gate_exps", "ffn_up_exps")}),
    "gpt-oss": GGUFArch("gpt_oss", ("GptOssForCausalLM",), GPT_OSS_LAYER, config=_gpt_oss,
                        transposed=("ffn_down_exps",),
                        interleaved={"mlp.experts.gate_up_proj": ("ffn_gate_exps", "ffn_up_exps")}),
}


def _tensor_values(t) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)


def llama3_scaling(freqs: np.ndarray, c: dict, reader, arch: str) -> dict | None:
    """HF's llama3 rope_scaling from llama.cpp's rope_freqs.weight (one divisor per frequency).

    The converter stores, per frequency f with wavelength w = 2 pi / f: 1 where w < L / high,
    `factor` where w > L / low, and between them 1 / ((1 - s) / factor + s) with s = (L / w - low) /
    (high - low) (L: original_max_position_embeddings). The divisors fix factor and s, which is
    linear in 1 / w: s = a / w + b with a = L / (high - low), b = -low / (high - low). Any L then
    gives the same frequencies; we take rope.scaling.original_context_length, else Llama 3's 8192.
    The result is checked by recomputing every divisor."""
    factor = float(freqs.max())
    if factor <= 1.0:
        return None
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    theta = c.get("rope_theta", 10000.0)
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    mid = (freqs > 1.0 + 1e-6) & (freqs < factor * (1 - 1e-6))
    original = int(_key(reader, arch, "rope.scaling.original_context_length", 8192))
    if mid.sum() >= 2:
        smooth = (factor / freqs[mid] - 1) / (factor - 1)              # from 1/d = (1 - s)/factor + s
        a, b = np.polyfit(1 / wavelen[mid], smooth, 1)
        low = -b * original / a
        high = low + original / a
    else:                                                              # no interpolated band to fit: Llama 3's
        low, high = 1.0, 4.0
    scaling = {"rope_type": "llama3", "factor": _f32(factor), "low_freq_factor": float(np.float32(low)),
               "high_freq_factor": float(np.float32(high)), "original_max_position_embeddings": original}
    if not np.allclose(_llama3_divisors(wavelen, scaling), freqs, rtol=1e-4, atol=0):
        raise ModelLoadError("rope_freqs.weight does not follow Llama 3's RoPE scaling, the only one kiln reads "
                             "from it; load the original Hugging Face checkpoint instead")
    return scaling


def _llama3_divisors(wavelen: np.ndarray, s: dict) -> np.ndarray:
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) \
        / (s["high_freq_factor"] - s["low_freq_factor"])
    mid = 1 / ((1 - smooth) / s["factor"] + smooth)
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, s["factor"], mid))
