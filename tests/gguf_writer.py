"""Write a Hugging Face checkpoint as a GGUF the way llama.cpp's convert_hf_to_gguf.py lays it out.

For tests: kiln's GGUF reader must turn this file back into the checkpoint it came from. So the
writer does what the converter does, independently of the reader: tensor names from gguf-py's
own TensorNameMap (llama.cpp's table), metadata keys through gguf.GGUFWriter, and per family

    llama    q/k rows permuted per head; Llama 3 RoPE scaling as a rope_freqs.weight tensor;
             a sliding window (Mistral) as attention.sliding_window
    baichuan W_pack split into q, k and v, then as llama (this llama.cpp's converter recurses without end on it)
    gemma*   every *norm.weight stored + 1; no output.weight (tied)
    phi3     fused attn_qkv / ffn_up kept; LongRoPE factors as rope_factors_long / _short
    phimoe   Phi3MiniModel's keys and LongRoPE factors (cos / sin's factor as the converter computes it, not the
             config's mscales), the experts stacked, q/k/v and every bias as they are
    gpt2     Conv1D weights transposed to [out, in]; output.weight a copy of token_embd
    olmo3, exaone4  the window and each layer's kind as sliding_window_pattern
    hunyuan  the NTK-alpha RoPE base raised, no scaling
    MoE      experts stacked into 3-D ffn_*_exps tensors; the router's keys each converter writes (counts,
             leading dense layers, groups, gating, scale and renormalisation); e_score_correction_bias as
             exp_probs_b.bias; GLM-4.5's multi-token-prediction layers counted in block_count
    falcon   query_key_value regrouped from kv groups to every q, k, v; no RoPE base, context 2048
    starcoder GPT-2's metadata with one kv head, Linear weights as they are
    deepseek2 latent attention as MQA over the latent (key_length / value_length) with the expanded sizes as
             *_mla; kv_b_proj split by heads into attn_k_b (transposed) and attn_v_b; 0.1 x mscale_all_dim as
             yarn_log_multiplier; GLM-4.7-Flash's multi-token-prediction layers counted in block_count
    minicpm3 only MiniCPM3Model's few keys (no RoPE base, no scales); LongRoPE factors as phi3's
    granite 4.0 without Mamba layers as granite / granitemoe (a dense MLP as ffn_gate / _up / _down), a kv head
             count a layer; as granitehybrid (an older converter: `arch`) without RoPE; with Mamba layers as
             granitehybrid: their sizes as ssm.*, A as -exp(A_log) and D as [heads, 1], the gated norm's weight as
             [groups, inner / groups], dt_bias as ssm_dt.bias, the conv squeezed (Mamba2Model's); Bamba as
             granitehybrid with RoPE on half of each head, no multipliers
    mamba2   Mamba2Model's: no attention keys, ssm.* and Mamba-2's tensors as granitehybrid's
    falcon-h1 FalconH1Model's: Mamba2Model's keys and tensors with the attention's and MLP's, every multiplier folded
             into the weights; q/k rows as they are; the pre-MLP norm as the bare blk.N.ffn_norm (gguf-py's name)
    jamba    JambaModel's: a kv head count a layer, Mamba-1's sizes as ssm.*, expert counts; Mamba-1's tensors as
             mamba's, the experts stacked as qwen2moe's
    mamba    MambaModel's (Mamba, Falcon Mamba): no attention keys, dt's rank as ssm.time_step_rank, ssm.dt_b_c_rms;
             A as -exp(A_log), the conv squeezed
    nemotron_h NemotronHModel's: a kv head count and an MLP width a layer (0 where the block is another kind), the
             layer_norm_epsilon, no RoPE (context 2 ** 20), Mamba-2's tensors and ssm.* as granitehybrid's;
             nemotron_h_moe (MoE blocks in layers_block_type) the experts' width as the MLP's, the expert keys,
             the experts stacked under a Llama MoE's names
    gemma4   Gemma4Model's keys: the layer kinds as sliding_window_pattern, the global head size as key_length and
             the sliding one as key_length_swa, head_count_kv a layer where the global layers have their own,
             feed_forward_length a layer with double-wide MLPs, shared_kv_layers, the PLE width; norms as they
             are; proportional RoPE as a rope_freqs tensor (1 for each rotated pair, 1e30 for the rest);
             layer_scalar as layer_output_scale.weight; the tokenizer as "gemma4" (tokens, scores, types and
             merges from tokenizer.json, as LlamaHfVocab reads it)
    gemma3n  Gemma3NModel's keys: a width a layer as feed_forward_length, the layer kinds, AltUp's active index and
             stream count, the PLE width, shared_kv_layers, each layer's sparsity as its normal quantile
             (activation_sparsity_scale); norms as they are; altup_projections / altup_unembed_projections
             stacked into 3-D altup_proj / altup_unembd_proj; *_scale tensors named .weight
    lfm2     head_count_kv a layer (0 for a conv layer), the MLP's adjusted width as feed_forward_length, the conv's
             taps as shortconv.l_cache, its weight [hidden, 1, taps] squeezed to [hidden, taps]
    llama4   Llama4Model's: feed_forward_length the dense MLPs' width, expert_feed_forward_length the experts', the
             MoE layer step; q/k rows as they are; gate_up_proj split into ffn_gate_exps / ffn_up_exps and down_proj
             transposed, each [experts, out, in]
    apertus  LlamaModel's keys, q/k rows as they are; xIELU's parameters as xielu.* arrays, a value a layer
    mistral4 DeepseekV2Model's keys and tensors (deepseek2's), the experts' 3-D gate_up_proj and down_proj as they
             are (ffn_gate_up_exps, ffn_down_exps)
    mellum   TextModel's keys with MellumModel's (the experts' width, the window and each layer's kind), the sliding
             layers' RoPE base as rope.freq_base_swa
    hy_v3    TextModel's keys with HYV3Model's (the experts' and shared MLP's widths, expert_weights_norm and _scale,
             sigmoid gating); the choice bias as a bare blk.N.exp_probs_b
    cohere2moe Cohere2MoeModel's keys (_cohere2moe); experts stacked, the shared ones as ffn_*_shexp
    granite_swa GraniteSWAModel's (Granite MoE SWA's too): Granite's keys, the window and layer kinds, the RoPE layers
             as attention.rope_pattern; sinks as attn_sinks.weight; the experts' gate_up_proj and down_proj and the
             shared MLP's input_linear / output_linear as stored (ffn_gate_up_exps, ffn_down_exps, ffn_up_shexp,
             ffn_down_shexp)
    chatglm  ChatGLMModel's (GLM-4-9B's original checkpoint, which transformers' Glm stands for): q, k and v fused
             as attn_qkv with biases, the gate and up rows fused as ffn_up, RoPE on half of each head, no BOS
    bitnet   BitnetModel's: TextModel's keys, RoPE scaled linearly by 1; the decoder Linears made ternary
             (round(W s).clip(-1, 1) / s, s = 1 / mean|W|), the sub-norms under 1bitLLM's names
    mimo2    MimoV2Model's keys (_mimo2: the three multi-token-prediction layers counted though the checkpoint has
             none); attention_sink_bias as attn_sinks.weight, the choice bias as exp_probs_b.bias, experts stacked
    dbrx     DbrxModel's keys (_dbrx); each layer's w1 / v1 / w2 viewed [experts, ffn, d_model] as ffn_gate_exps /
             ffn_up_exps / ffn_down_exps, w2's last two axes swapped
    gpt-oss  sinks as attn_sinks.weight; the experts' interleaved gate_up_proj split into ffn_gate_exps /
             ffn_up_exps [experts, out, in] and down_proj transposed, their biases split alike; MXFP4 experts
             (`*_blocks` / `*_scales`) repacked as ggml's MXFP4 blocks (the scale byte, then 16 bytes whose low
             nibbles are the block's first 16 values), as the converter's repack_mxfp4 does

and the tokenizer as `gpt2` (byte-level BPE) metadata from the checkpoint's tokenizer.json.
`types` picks the storage type per GGUF tensor key ("attn_v", "token_embd", ...) or full name;
1-D tensors and biases are always F32, like the converter's.

    write_gguf(hf_dir, tmp / "m.gguf", types={"ffn_down": "Q6_K"}, default="Q4_K")
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from safetensors.numpy import load_file

from gguf_quants import quantize

# HF model_type -> GGUF architecture.
GGUF_ARCH = {"llama": "llama", "baichuan": "baichuan", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma": "gemma", "gemma2": "gemma2",
             "gemma3_text": "gemma3", "phi3": "phi3", "gpt2": "gpt2", "granite": "granite", "olmo2": "olmo2",
             "smollm3": "smollm3", "stablelm": "stablelm", "phi": "phi2", "starcoder2": "starcoder2",
             "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_neox": "gptneox",
             "ernie4_5": "ernie4_5", "glm4": "glm4", "cohere": "command-r", "cohere2": "cohere2", "olmoe": "olmoe",
             "olmo3": "olmo2", "exaone": "exaone", "exaone4": "exaone4", "seed_oss": "seed_oss",
             "hunyuan_v1_dense": "hunyuan-dense",
             "falcon": "falcon", "gpt_bigcode": "starcoder", "olmo": "olmo", "granitemoe": "granitemoe",
             "granitemoeshared": "granitemoe", "nemotron": "nemotron", "jais2": "jais2", "arcee": "arcee",
             "glm4_moe": "glm4moe", "dots1": "dots1", "exaone_moe": "exaone-moe", "minimax_m2": "minimax-m2",
             "ernie4_5_moe": "ernie4_5-moe", "hunyuan_v1_moe": "hunyuan-moe", "deepseek_v2": "deepseek2",
             "deepseek_v3": "deepseek2", "glm4_moe_lite": "deepseek2", "youtu": "deepseek2", "minicpm3": "minicpm3",
             "deepseek_v32": "deepseek32", "glm_moe_dsa": "glm-dsa", "kimi_linear": "kimi-linear",
             "bailing_moe_v2": "bailingmoe2", "bailing_hybrid": "bailingmoe3", "bloom": "bloom", "mpt": "mpt",
             "minimax_m3_vl_text": "minimax-m3",
             "granitemoehybrid": "granitehybrid", "gpt_oss": "gpt-oss", "gemma4_text": "gemma4",
             "gemma3n_text": "gemma3n", "lfm2": "lfm2", "lfm2_moe": "lfm2moe", "qwen3_5_text": "qwen35",
             "qwen3_5_moe_text": "qwen35moe", "qwen3_next": "qwen3next",
             "nemotron_h": "nemotron_h", "mamba2": "mamba2", "mamba": "mamba", "falcon_mamba": "mamba",
             "falcon_h1": "falcon-h1", "jamba": "jamba", "bamba": "granitehybrid", "ministral3": "mistral3",
             "afmoe": "afmoe", "llama4_text": "llama4", "cohere2_moe": "cohere2moe",
             "mistral4": "mistral4", "apertus": "apertus", "hy_v3": "hy_v3", "mellum": "mellum",
             "phimoe": "phimoe", "dbrx": "dbrx", "granite_swa": "granite_swa", "granitemoe_swa": "granite_swa",
             "mimo_v2_flash": "mimo2", "bitnet": "bitnet", "glm": "chatglm"}
MAMBA1 = ("mamba", "falcon_mamba", "jamba")  # Mamba-1 layers: A [inner, state] and D [inner] as they are
# the converter's LlamaModel subclasses (q/k rows permuted)
PERMUTED = ("llama", "baichuan", "granite", "smollm3", "olmo", "granitemoe", "arcee", "granitehybrid", "nemotron_h",
            "nemotron_h_moe", "mistral3", "internlm2", "minicpm", "granite_swa")


def write_gguf(hf_dir: Path, path: Path, types: dict[str, str] | None = None, default: str = "F32",
               arch: str | None = None) -> Path:
    """hf_dir (config.json, model.safetensors, tokenizer files) -> a GGUF at `path`; `arch` the architecture
    where an older converter chose another (Granite 4.0 without Mamba layers as granitehybrid)."""
    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or _granite4_arch(cfg) or GGUF_ARCH[cfg["model_type"]]
    if arch == "nemotron_h" and "moe" in cfg["layers_block_type"]:
        arch = "nemotron_h_moe"                 # NemotronHModel's choice, by the MoE keys its config has
    if arch.startswith("nemotron_h"):           # transformers 5 saves no num_hidden_layers for it
        cfg.setdefault("num_hidden_layers", len(cfg["layers_block_type"]))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(hf_dir.name)
    hf = load_file(str(hf_dir / "model.safetensors"))
    if arch == "baichuan":                      # BaichuanModel's: W_pack split into q, k and v (then as llama's)
        cfg.setdefault("max_position_embeddings", cfg["model_max_length"])     # TextModel's context key, in turn
        for name in [n for n in hf if n.endswith(".self_attn.W_pack.weight")]:
            for part, rows in zip(("q", "k", "v"), np.split(hf.pop(name), 3)):
                hf[name.replace("W_pack", f"{part}_proj")] = rows
    if arch == "apertus":                       # ApertusModel's: xIELU's parameters as metadata, a value a layer
        for p in ("alpha_n", "alpha_p", "beta", "eps"):
            values = [float(hf.pop(f"model.layers.{i}.mlp.act_fn.{p}").reshape(-1)[0])
                      for i in range(cfg["num_hidden_layers"])]
            getattr(w, f"add_xielu_{p}")(values)
    tensors = _ling3_tensors(cfg, hf) if arch == "bailingmoe3" else _minimax_m3_tensors(cfg, hf) \
        if arch == "minimax-m3" else _chatglm_tensors(cfg, hf) if arch == "chatglm" else _tensors(cfg, arch, hf)
    if arch == "gemma4":
        _gemma4(w, cfg)
        _gemma4_tokenizer(w, hf_dir)
    else:
        if arch in ("qwen35", "qwen35moe", "qwen3next"):
            _qwen35(w, cfg, arch)
        elif arch in OWN_KEYS:
            OWN_KEYS[arch](w, cfg)
        else:
            _metadata(w, cfg, arch, tensors)
        if arch in ("qwen2vl", "qwen3vl", "qwen3vlmoe"):    # Qwen2VLModel's / Qwen3VLTextModel's M-RoPE sections
            half = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) // 2
            w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
            if arch != "qwen2vl":
                w.add_num_deepstack_layers(3)           # the vision tower's deepstack indexes: zeros a text token
        _tokenizer(w, hf_dir, cfg["vocab_size"], pre="qwen35" if arch.startswith("qwen35") else "gpt-2")
    for name, value in tensors.items():
        type_name = (types or {}).get(name, (types or {}).get(name.split(".")[-2], default))
        if isinstance(value, Mxfp4):
            w.add_tensor(name, value.blocks, raw_dtype=QType.MXFP4)
            continue
        if (value.ndim == 1 or not name.endswith(".weight") or type_name == "F32"     # biases: F32 as the converter
                or name.endswith((".ssm_norm.weight", ".ssm_conv1d.weight"))):      # (and its _norm, SSM_CONV1D)
            w.add_tensor(name, np.ascontiguousarray(value, np.float32))
        elif type_name == "F16" or value.shape[-1] % gguf.GGML_QUANT_SIZES[QType[type_name]][0]:
            w.add_tensor(name, value.astype(np.float16))        # rows no block divides: F16, the converter's fallback
        else:
            w.add_tensor(name, quantize(value, type_name), raw_dtype=QType[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Mxfp4:
    """A tensor already in ggml's MXFP4 blocks (uint8 [..., rows, blocks x 17])."""

    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks


def _ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> Mxfp4:
    """OpenAI's MXFP4 (blocks [..., groups, 16], each byte values 2i (low nibble) and 2i + 1; scales [..., groups])
    as ggml's: per group the scale byte, then 16 bytes holding values i (low nibble) and i + 16."""
    values = np.empty((*blocks.shape[:-1], 32), np.uint8)
    values[..., 0::2], values[..., 1::2] = blocks & 0x0F, blocks >> 4
    packed = values[..., :16] | (values[..., 16:] << 4)
    out = np.concatenate([scales[..., None], packed], axis=-1)
    return Mxfp4(np.ascontiguousarray(out.reshape(*out.shape[:-2], -1)))


def _gpt_oss_experts(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray | Mxfp4]:
    """gpt-oss's experts (popped from hf) as GptOssModel writes them: gate / up from the interleaved gate_up_proj
    (its even / odd outputs), every weight [experts, out, in], MXFP4 blocks repacked, biases split alike."""
    out: dict[str, np.ndarray | Mxfp4] = {}
    layers = sorted({int(m[1]) for n in hf if (m := re.search(r"layers\.(\d+)\.mlp\.experts\.", n))})
    for i in layers:
        key, blk = f"model.layers.{i}.mlp.experts", f"blk.{i}"
        gate, up, down = (f"{blk}.ffn_{k}_exps" for k in ("gate", "up", "down"))
        if f"{key}.gate_up_proj_blocks" in hf:
            blocks, scales = hf.pop(f"{key}.gate_up_proj_blocks"), hf.pop(f"{key}.gate_up_proj_scales")
            out[f"{gate}.weight"] = _ggml_mxfp4(blocks[:, 0::2], scales[:, 0::2])
            out[f"{up}.weight"] = _ggml_mxfp4(blocks[:, 1::2], scales[:, 1::2])
        else:
            rows = hf.pop(f"{key}.gate_up_proj").swapaxes(1, 2)           # [experts, 2 x out, in]
            out[f"{gate}.weight"], out[f"{up}.weight"] = rows[:, 0::2], rows[:, 1::2]
        bias = hf.pop(f"{key}.gate_up_proj_bias")
        out[f"{gate}.bias"], out[f"{up}.bias"] = bias[:, 0::2], bias[:, 1::2]
        if f"{key}.down_proj_blocks" in hf:
            out[f"{down}.weight"] = _ggml_mxfp4(hf.pop(f"{key}.down_proj_blocks"), hf.pop(f"{key}.down_proj_scales"))
        else:
            out[f"{down}.weight"] = hf.pop(f"{key}.down_proj").swapaxes(1, 2)
        out[f"{down}.bias"] = hf.pop(f"{key}.down_proj_bias")
    return {k: v if isinstance(v, Mxfp4) else np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def _granite4_arch(cfg: dict) -> str | None:
    """GraniteHybridModel's architecture for a Granite 4.0 config without Mamba layers: granitemoe where it has
    experts per token, else granite."""
    if cfg["model_type"] != "granitemoehybrid" or not all(map(_attention, cfg["layer_types"])):
        return None
    return "granitemoe" if cfg.get("num_experts_per_tok") else "granite"


def _attention(layer_type: str) -> bool:
    """A Granite 4.0 layer type the converter reads as attention (released configs': attention; transformers 5
    saves it as full_attention)."""
    return layer_type in ("attention", "full_attention")


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) of the global layers, from transformers 4 or 5 style fields."""
    params = cfg.get("rope_parameters") or {}
    params = params.get("full_attention", params)
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return theta, (None if kind == "default" else dict(scaling, rope_type=kind))


def _partial(cfg: dict, default: float = 1.0) -> float:
    """The share of each head RoPE rotates (transformers 4 or 5 style)."""
    return (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor") or default)


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg.get("hidden_size", cfg.get("n_embd")) // cfg.get(
        "num_attention_heads", cfg.get("n_head"))


def _metadata(w: gguf.GGUFWriter, cfg: dict, arch: str, tensors: dict) -> None:
    if arch in ("gpt2", "starcoder"):
        w.add_block_count(cfg["n_layer"])
        w.add_context_length(cfg["n_ctx"] if "n_ctx" in cfg else cfg["n_positions"])
        w.add_embedding_length(cfg["n_embd"])
        w.add_feed_forward_length(4 * cfg["n_embd"])
        w.add_head_count(cfg["n_head"])
        if arch == "starcoder":
            w.add_head_count_kv(1)
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
        return
    if arch == "falcon":                            # the converter writes no RoPE base and a context of 2048
        w.add_context_length(2048)
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(4 * cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(_falcon_kv_heads(cfg))
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
        return
    if arch == "minicpm3":                          # MiniCPM3Model writes only these (no RoPE base, no scales)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_vocab_size(cfg["vocab_size"])
        w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(cfg["kv_lora_rank"])
        w.add_key_length(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
        w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
        return
    theta, scaling = _rope(cfg)
    w.add_block_count(_block_count(cfg, arch))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if arch == "phi2":                                 # PhiModel's: 4 x the width, whatever the config says
        w.add_feed_forward_length(4 * cfg["hidden_size"])
    else:
        w.add_feed_forward_length(cfg["intermediate_size_mlp" if arch == "llama4" else "intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if arch in ("stablelm", "phi2", "starcoder2", "gptneox", "command-r", "cohere2", "nemotron", "jais2"):  # LayerNorm
        w.add_layer_norm_eps(cfg.get("layer_norm_eps", cfg.get("norm_epsilon", cfg.get("norm_eps"))))
        if arch not in ("starcoder2", "command-r", "cohere2"):
            w.add_rope_dimension_count(int(_partial(cfg) * _head_dim(cfg)))
        if arch in ("stablelm", "gptneox"):
            w.add_parallel_residual(bool(cfg.get("use_parallel_residual")))
    elif arch == "olmo":                                # OlmoLayerNorm's fixed eps; clip_qkv as clamp_kqv
        w.add_layer_norm_eps(1e-5)
        if cfg.get("clip_qkv") is not None:
            w.add_clamp_kqv(cfg["clip_qkv"])
    else:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if arch.startswith("hunyuan") and scaling and scaling["rope_type"] == "dynamic":   # NTK alpha: the base raised
        d = _head_dim(cfg)
        theta, scaling = theta * scaling["alpha"] ** (d / (d - 2)), None
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(1)
    if arch != "gemma2":                                   # Gemma 2's converter leaves the base at its default
        w.add_rope_freq_base(theta)
    if "head_dim" in cfg or arch.startswith("gemma"):
        w.add_key_length(_head_dim(cfg))
        w.add_value_length(_head_dim(cfg))
    if arch in PERMUTED or arch in ("llama4", "apertus", "afmoe"):   # LlamaModel's keys (these: q/k rows as they are)
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(_head_dim(cfg))
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
    _experts(w, cfg, arch)
    if arch == "afmoe":                                  # AfmoeModel's own keys
        w.add_leading_dense_block_count(cfg["num_dense_layers"])
        w.add_expert_weights_scale(cfg["route_scale"])
    if cfg.get("shared_intermediate_size"):              # Granite MoE Shared
        w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
    if cfg["model_type"] == "granitemoehybrid":                # GraniteHybridModel's, whatever the architecture
        _granite4(w, cfg, arch)
    if cfg["model_type"] == "bamba":
        _bamba(w, cfg)
    if arch == "granite_swa":
        _granite_swa(w, cfg)
    if arch in ("granite", "granitemoe", "granitehybrid", "minicpm", "granite_swa"):
        # GraniteModel's: each multiplier the config has (MiniCPMModel's: all but the attention's)
        scales = (("attention_multiplier", w.add_attention_scale),
                  ("embedding_multiplier", w.add_embedding_scale),
                  ("residual_multiplier", w.add_residual_scale), ("logits_scaling", w.add_logit_scale))
        for key, add in scales[arch == "minicpm":]:
            if cfg.get(key):
                add(cfg[key])
    if scaling and scaling["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    if scaling and scaling["rope_type"] == "yarn":                  # the converter's Qwen2/3 and Llama paths
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        if arch == "mistral3":         # TextModel's betas, Ministral3Model's log multiplier and temperature
            w.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
            w.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
            w.add_rope_scaling_yarn_log_mul(scaling["mscale_all_dim"])
            w.add_attn_temperature_scale(scaling["llama_4_scaling_beta"])
    if arch in ("gemma2", "gemma3"):
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    if arch in ("command-r", "cohere2"):
        w.add_logit_scale(cfg["logit_scale"])
    if arch in ("cohere2", "gpt-oss"):
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "glm4":
        w.add_rope_dimension_count(int(_partial(cfg) * _head_dim(cfg)))
        if (sections := (cfg.get("rope_parameters") or {}).get("mrope_section")):      # GLM-4.1V's (TextModel's)
            w.add_rope_dimension_sections([*sections, 0][:4])
    if arch == "glm4moe":                                       # the converter's default: half of each head
        w.add_rope_dimension_count(int(_partial(cfg, 0.5) * _head_dim(cfg)))
    if arch == "minimax-m2":                                    # released configs' rotary_dim
        w.add_rope_dimension_count(cfg.get("rotary_dim") or int(_partial(cfg) * _head_dim(cfg)))
    if arch == "exaone-moe":
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if arch == "exaone4" and cfg.get("num_nextn_predict_layers"):     # EXAONE 4.5's text model (Exaone4_5_TextModel)
        w.add_nextn_predict_layers(cfg["num_nextn_predict_layers"])
    if arch in ("olmo2", "exaone4", "exaone-moe") and cfg.get("sliding_window") is not None:
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        if "sliding_attention" in (cfg.get("rope_parameters") or {}):      # TextModel's, OLMo 3's
            w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    if arch in ("deepseek2", "mistral4", *DSA):
        _deepseek2(w, cfg)
    if arch in DSA:
        w.add_indexer_head_count(cfg["index_n_heads"])
        w.add_indexer_key_length(cfg["index_head_dim"])
        w.add_indexer_top_k(cfg["index_topk"])
        if cfg.get("indexer_types"):        # the converter's: true where a layer runs its own indexer
            w.add_array(f"{arch}.attention.indexer.types", [t == "full" for t in cfg["indexer_types"]])
    if arch == "bitnet":                                  # BitnetModel's
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0)
    if arch in ("phi3", "phimoe"):                       # Phi3MiniModel's (PhiMoeModel's too)
        original = cfg.get("original_max_position_embeddings") or (scaling or {}).get(
            "original_max_position_embeddings", cfg["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_dimension_count(int(_partial(cfg) * _head_dim(cfg)))
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        if scaling:
            scale = cfg["max_position_embeddings"] / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)


def _gemma4_dims(cfg: dict) -> tuple[int, int]:
    """The global layers' (kv heads, head dim): Google's config.json keys or transformers' per_layer_config."""
    full = next(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    over = (cfg.get("per_layer_config") or {}).get(str(full), {})
    kv = over.get("num_key_value_heads", cfg.get("num_global_key_value_heads") or cfg["num_key_value_heads"])
    return kv, over.get("head_dim", cfg.get("global_head_dim", 512))


def _gemma4(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Gemma4Model's keys over Gemma3Model's (no final_logit_softcapping: llama.cpp's default 30 stands)."""
    n, types, shared = cfg["num_hidden_layers"], cfg["layer_types"], cfg.get("num_kv_shared_layers", 0)
    swa = [t == "sliding_attention" for t in types]
    (global_kv, global_dim), head_dim, kv = _gemma4_dims(cfg), cfg["head_dim"], cfg["num_key_value_heads"]
    ff = cfg["intermediate_size"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n)
    w.add_feed_forward_length([ff if i < n - shared else 2 * ff for i in range(n)] if cfg.get("use_double_wide_mlp")
                              else ff)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(global_dim)
    w.add_value_length(global_dim)
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_head_count_kv([kv if s else global_kv for s in swa] if global_kv != kv else kv)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    w.add_sliding_window_pattern(swa)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_rope_dimension_count(global_dim)
    w.add_rope_dimension_count_swa(head_dim)
    if cfg.get("enable_moe_block"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["top_k_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])


def _gemma3n(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Gemma3Model's keys, then Gemma3NModel's."""
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_altup_active_idx(cfg["altup_active_idx"])
    w.add_altup_num_inputs(cfg["altup_num_inputs"])
    w.add_embedding_length_per_layer_input(cfg["hidden_size_per_layer_input"])
    w.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    w.add_activation_sparsity_scale(_normal_quantiles(cfg["activation_sparsity_pattern"]))
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])


def _normal_quantiles(shares: list[float]) -> list[float]:
    """The standard normal's quantile of each share, in float32 as the converter computes them with torch (the
    quantile of 0: -inf)."""
    import torch
    normal = torch.distributions.normal.Normal(0, 1)
    return [normal.icdf(torch.tensor(s, dtype=torch.float32)).item() for s in shares]


def _lfm2(w: gguf.GGUFWriter, cfg: dict) -> None:
    """LFM2Model's keys: TextModel's (head_count_kv a layer, 0 for conv layers), the vocabulary's size, the conv's
    taps, the MLP's width as block_auto_adjust_ff_dim makes it; LFM2MoeModel's the dense MLPs' width as it is, the
    expert count, top k and width, the leading dense layers and sigmoid scores (no renormalisation or scale key)."""
    ff = cfg["intermediate_size"]
    if cfg["model_type"] == "lfm2_moe":
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_leading_dense_block_count(cfg["num_dense_layers"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    elif cfg.get("block_auto_adjust_ff_dim", True):
        ff = int(2 * ff / 3)
        if cfg.get("block_ffn_dim_multiplier") is not None:
            ff = int(cfg["block_ffn_dim_multiplier"] * ff)
        ff = cfg["block_multiple_of"] * ((ff + cfg["block_multiple_of"] - 1) // cfg["block_multiple_of"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([cfg["num_key_value_heads"] if t != "conv" else 0 for t in cfg["layer_types"]])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_shortconv_l_cache(cfg["conv_L_cache"])
    w.add_layer_norm_rms_eps(cfg["norm_eps"])
    w.add_feed_forward_length(ff)


def _qwen35(w: gguf.GGUFWriter, cfg: dict, arch: str) -> None:
    """Qwen3_5TextModel's keys: TextModel's, Qwen2MoeModel's expert sizes (qwen35moe), Qwen3NextModel's DeltaNet
    sizes as ssm.*, the interval of full-attention layers, the rotated dims, the MRoPE sections (Qwen3NextModel's
    the same but those)."""
    rope, head_dim = cfg["rope_parameters"], cfg["head_dim"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if cfg.get("intermediate_size"):
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch in ("qwen35moe", "qwen3next"):
        _experts(w, cfg, arch)
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    if cfg.get("layer_types"):             # each layer's kind (true: DeltaNet), the converter's since 2026
        w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in cfg["layer_types"]])
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    if arch != "qwen3next":
        w.add_rope_dimension_sections(rope.get("mrope_section", [11, 11, 10]) + [0])


def _qwen35_tensors(cfg: dict, hf: dict[str, np.ndarray], tile: bool = True) -> dict[str, np.ndarray]:
    """Qwen3NextModel's and _LinearAttentionVReorderBase's transforms: A as -exp(A_log), dt_bias renamed dt_proj.bias,
    the conv squeezed, every norm but the DeltaNet's + 1, and (`tile`: Qwen3.5's) where the key heads are fewer, the
    V heads tiled over them ([k0's v0, k1's v0, ..., k0's v1, ...]) in every tensor they index."""
    hk, hv, dk, dv = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim"))

    def tiled(x: np.ndarray, axis: int, d: int, before: int = 0) -> np.ndarray:
        x = np.moveaxis(x, axis, 0)
        v = x[before:].reshape(hk, hv // hk, d, *x.shape[1:]).swapaxes(0, 1).reshape(x[before:].shape)
        return np.moveaxis(np.concatenate([x[:before], v]), 0, axis)
    out = {}
    for name, value in hf.items():
        if name.endswith(".A_log"):
            value = -_exp(value)
        elif name.endswith(".dt_bias"):
            name = name.replace(".dt_bias", ".dt_proj.bias")
        elif name.endswith("conv1d.weight"):
            value = value.squeeze(1)
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            value = value + 1
        if tile and hk != hv and ".linear_attn." in name:
            kind = name.split(".linear_attn.")[1].split(".")[0]
            if kind in ("in_proj_qkv", "conv1d"):
                value = tiled(value, 0, dv, 2 * hk * dk)
            elif kind == "in_proj_z":
                value = tiled(value, 0, dv)
            elif kind in ("in_proj_a", "in_proj_b", "A_log", "dt_proj"):
                value = tiled(value, 0, 1)
            elif kind == "out_proj":
                value = tiled(value, 1, dv)
        out[name] = value
    return out


def _qwen3next_qkvz(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Qwen3NextModel's split of in_proj_qkvz (a key head's q, k, v, z rows, for each key head) into attn_qkv
    (every q, every k, every v) and attn_gate (every z)."""
    hk, dk, r, dv = (cfg["linear_num_key_heads"], cfg["linear_key_head_dim"],
                     cfg["linear_num_value_heads"] // cfg["linear_num_key_heads"], cfg["linear_value_head_dim"])
    out = {}
    for name, value in hf.items():
        if name.endswith("in_proj_qkvz.weight"):
            q, k, v, z = np.split(value.reshape(hk, -1, value.shape[-1]), np.cumsum([dk, dk, r * dv]), axis=1)
            flat = [x.reshape(-1, value.shape[-1]) for x in (q, k, v, z)]
            out[name.replace("qkvz", "qkv")], out[name.replace("qkvz", "z")] = np.concatenate(flat[:3]), flat[3]
        else:
            out[name] = value
    return out


def _gemma4_rope_freqs(cfg: dict) -> np.ndarray:
    """Proportional RoPE as the converter writes it: 1 for each rotated pair of a global head, 1e30 for the rest."""
    _, d = _gemma4_dims(cfg)
    rotated = int(d * cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    return np.array([1.0] * rotated + [1e30] * (d // 2 - rotated), np.float32)


def _gemma4_tokenizer(w: gguf.GGUFWriter, hf_dir: Path) -> None:
    """Gemma4Model.set_vocab: every token of tokenizer.json in id order (specials CONTROL, byte pieces BYTE),
    its merges, the special ids, BOS added, no space prefix."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([3 if t in special else 6 if re.fullmatch(r"<0x[0-9A-F]{2}>", t) else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("unk_token", w.add_unk_token_id), ("pad_token", w.add_pad_token_id)):
        if tok_cfg.get(key) in vocab:
            add(vocab[tok_cfg[key]])
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])


def _deepseek2(w: gguf.GGUFWriter, cfg: dict) -> None:
    """DeepseekV2Model's keys: latent attention as the MQA llama.cpp's weight absorption runs (one kv head of the
    latent and the rotated part; the expanded head's sizes as *_mla), the router's counts and flags where the
    config has them, DeepSeek's mscale_all_dim as 0.1 x it (yarn_log_multiplier); Glm4MoeLiteModel's
    multi-token-prediction layers."""
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    w.add_head_count_kv(1)
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0 if cfg.get("n_routed_experts") else
                                            cfg["num_hidden_layers"]))
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(rank)
    w.add_key_length(rank + rope)
    w.add_value_length(rank)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts") or 0)
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    scaling = _rope(cfg)[1] or {}
    if (mscale_all := scaling.get("mscale_all_dim")) is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * mscale_all)
    if (beta := scaling.get("llama_4_scaling_beta")) is not None:     # the Mistral-format converter's
        w.add_attn_temperature_scale(beta)
        w.add_attn_temperature_length(scaling["original_max_position_embeddings"])
    if cfg["model_type"] == "glm4_moe_lite" and cfg.get("num_nextn_predict_layers"):
        w.add_nextn_predict_layers(cfg["num_nextn_predict_layers"])


def _bloom(w: gguf.GGUFWriter, cfg: dict) -> None:
    """BloomModel's keys: its context the config's seq_length (else, as the converter does, the hidden size)."""
    hidden = cfg.get("hidden_size", cfg.get("n_embed"))
    w.add_context_length(cfg.get("seq_length", hidden))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(4 * hidden)
    w.add_block_count(cfg.get("n_layer", cfg.get("num_hidden_layers")))
    w.add_head_count(cfg.get("n_head", cfg.get("num_attention_heads")))
    w.add_head_count_kv(cfg.get("n_head", cfg.get("num_attention_heads")))
    w.add_layer_norm_eps(cfg["layer_norm_epsilon"])


def _mpt(w: gguf.GGUFWriter, cfg: dict) -> None:
    """MPTModel's keys: LayerNorm's fixed 1e-5, clip_qkv as clamp_kqv, alibi_bias_max as max_alibi_bias."""
    attn = cfg["attn_config"]
    w.add_context_length(cfg["max_seq_len"])
    w.add_embedding_length(cfg["d_model"])
    w.add_block_count(cfg["n_layers"])
    w.add_feed_forward_length(4 * cfg["d_model"])
    w.add_head_count(cfg["n_heads"])
    w.add_layer_norm_eps(1e-5)
    if attn.get("clip_qkv") is not None:
        w.add_clamp_kqv(attn["clip_qkv"])
    w.add_max_alibi_bias(attn["alibi_bias_max"] if attn["alibi"] else 0.0)


def _bailingmoe2(w: gguf.GGUFWriter, cfg: dict) -> None:
    """BailingMoeV2Model's keys: TextModel's (Bailing's names for the counts), RoPE's share of head_dim (0.5 unless
    the config says), the router's dense prefix, experts' and shared expert's widths, scale and norm flag."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for add, value in ((w.add_block_count, cfg["num_hidden_layers"]), (w.add_context_length,
                       cfg["max_position_embeddings"]), (w.add_embedding_length, cfg["hidden_size"]),
                       (w.add_feed_forward_length, cfg["intermediate_size"]),
                       (w.add_head_count, cfg["num_attention_heads"]),
                       (w.add_head_count_kv, cfg["num_key_value_heads"]),
                       (w.add_rope_freq_base, cfg["rope_theta"]), (w.add_layer_norm_rms_eps, cfg["rms_norm_eps"]),
                       (w.add_expert_count, cfg["num_experts"]), (w.add_expert_used_count, cfg["num_experts_per_tok"]),
                       (w.add_expert_group_count, cfg["n_group"]), (w.add_expert_group_used_count, cfg["topk_group"]),
                       (w.add_expert_gating_func, gguf.ExpertGatingFuncType.SIGMOID), (w.add_key_length, head_dim),
                       (w.add_value_length, head_dim),
                       (w.add_rope_dimension_count, int(head_dim * cfg.get("partial_rotary_factor", 0.5))),
                       (w.add_leading_dense_block_count, cfg["first_k_dense_replace"]),
                       (w.add_vocab_size, cfg["vocab_size"]),
                       (w.add_expert_feed_forward_length, cfg["moe_intermediate_size"]),
                       (w.add_expert_shared_feed_forward_length, cfg["moe_shared_expert_intermediate_size"]),
                       (w.add_expert_weights_scale, cfg["routed_scaling_factor"]),
                       (w.add_expert_shared_count, cfg["num_shared_experts"]),
                       (w.add_expert_weights_norm, cfg["norm_topk_prob"])):
        add(value)


def _minimax_m3(w: gguf.GGUFWriter, cfg: dict) -> None:
    """MiniMaxM3Model's keys (this gguf-py predates the indexer's: written by name): TextModel's (the dense layers'
    width as feed_forward_length), MiniMaxM2Model's, the shared expert's count, the routed scale, the leading dense
    layers, the indexer's."""
    key = lambda name: f"minimax-m3.{name}"     # noqa: E731
    head_dim = cfg["head_dim"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["dense_intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(int(head_dim * cfg["rope_parameters"]["partial_rotary_factor"]))
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(True)
    for name, hf in (("head_count", "index_n_heads"), ("key_length", "index_head_dim"), ("top_k", "index_topk_blocks"),
                     ("block_size", "index_block_size"), ("local_blocks", "index_local_blocks")):
        w.add_uint32(key(f"attention.indexer.{name}"), cfg[hf])
    w.add_leading_dense_block_count(cfg["mlp_layer_types"].index("sparse"))


def _minimax_m3_tensors(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """MiniMaxM3Model's tensors by name, from transformers' own layout (fused gate_up, 3-D experts): every norm + 1
    (its Gemma norms baked for llama.cpp's plain ones), the experts split into ffn_{gate,up,down}_exps."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             **{f"self_attn.{x}_proj.weight": f"attn_{x}.weight" for x in "qkv"},
             "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.down_proj.weight": "ffn_down.weight",
             **{f"self_attn.indexer.{x}.weight": f"indexer.{x}.weight" for x in ("q_proj", "k_proj", "q_norm",
                                                                                  "k_norm")},
             "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
             "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}
    out = {}
    for name, value in hf.items():
        value = value.astype(np.float32)
        if name.endswith("norm.weight"):
            value = value + 1.0
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", name)
        if m is None:
            out[names[name]] = value
            continue
        i, rest = int(m[1]), m[2]
        if rest.endswith("gate_up_proj.weight") or rest == "mlp.experts.gate_up_proj":
            kind = "_exps" if ".experts." in rest else "_shexp" if "shared" in rest else ""
            gate, up = np.split(value, 2, axis=-2)
            out[f"blk.{i}.ffn_gate{kind}.weight"], out[f"blk.{i}.ffn_up{kind}.weight"] = (
                np.ascontiguousarray(gate), np.ascontiguousarray(up))
        elif rest == "mlp.experts.down_proj":
            out[f"blk.{i}.ffn_down_exps.weight"] = value
        else:
            out[f"blk.{i}.{layer[rest]}"] = value
    return out


def _mla_keys(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Latent attention as the MQA llama.cpp's weight absorption runs (the KDA hybrids' converters): one kv head of
    the latent and the rotated part, the expanded head's sizes as *_mla."""
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    w.add_kv_lora_rank(rank)
    w.add_rope_dimension_count(rope)
    w.add_key_length(rank + rope)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])


def _bailingmoe3(w: gguf.GGUFWriter, cfg: dict) -> None:
    """BailingMoeV3Model's keys (this gguf-py predates them: written by name): TextModel's, head_count_kv a layer (1
    for latent attention), KDA's sizes and bounded decay, MLA's, the router's and shared expert's, the clamps."""
    n, kinds = cfg["num_hidden_layers"], cfg["layer_types"]
    key = lambda name: f"bailingmoe3.{name}"    # noqa: E731
    w.add_block_count(n)
    w.add_context_length(cfg.get("model_max_length") or cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([1 if t == "full_attention" else 0 for t in kinds])
    w.add_value_length(cfg["linear_head_dim"])      # TextModel's from head_dim, the KDA's (kiln reads value_length_mla)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_token"])
    w.add_expert_group_count(cfg["num_expert_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_ssm_conv_kernel(cfg["short_conv_kernel_size"])
    w.add_uint32(key("kda.head_dim"), cfg["linear_head_dim"])
    w.add_bool(key("kda.safe_gate"), cfg["kda_safe_gate"])
    w.add_float32(key("kda.gate_lower_bound"), cfg["kda_lower_bound"])
    _mla_keys(w, cfg)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["moe_intermediate_size"] * cfg["num_shared_experts"])
    w.add_expert_shared_count(cfg["num_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["moe_renormalize"])
    for hf_key, gguf_key in (("expert_swiglu_limit_list", "swiglu_clamp_exp"),
                             ("share_expert_swiglu_limit_list", "swiglu_clamp_shexp")):
        w.add_array(key(gguf_key), [float(v or 0.0) for v in cfg[hf_key]])


def _ling3_tensors(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BailingMoeV3Model's tensors by name (this gguf-py has no map for them): the KDA's convs [1, channels, 1,
    taps], A as exp(A_log) [heads, 1], dt_bias as ssm_dt.bias, f_proj / g_proj as ssm_f_a / ssm_g_a (an MLA layer's
    g_proj as attn_gate), kv_b_proj split by heads, experts stacked."""
    full = {i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"}
    names = {"model.word_embeddings.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             **{f"attention.{x}_proj.weight": f"attn_{x}.weight" for x in "qkv"},
             "attention.dense.weight": "attn_output.weight",
             **{f"attention.{x}_conv1d.weight": f"ssm_conv1d_{x}.weight" for x in "qkv"},
             "attention.f_proj.weight": "ssm_f_a.weight", "attention.b_proj.weight": "ssm_beta.weight",
             "attention.A_log": "ssm_a", "attention.dt_bias": "ssm_dt.bias",
             "attention.o_norm.weight": "ssm_norm.weight",
             "attention.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
             "attention.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
             "mlp.gate.expert_bias": "exp_probs_b.bias",
             **{f"mlp.experts.{p}_proj.weight": f"ffn_{p}_exps.weight" for p in ("gate", "up", "down")},
             **{f"mlp.shared_experts.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")},
             **{f"mlp.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")}}
    out = {}
    for name, value in _stacked_experts(hf).items():
        value = value.astype(np.float32)
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", name)
        if m is None:
            out[names[name]] = value
            continue
        i, rest = int(m[1]), m[2]
        if rest == "attention.kv_b_proj.weight":        # each head's key rows transposed, then its value rows
            kv_b = value.reshape(cfg["num_attention_heads"], cfg["qk_nope_head_dim"] + cfg["v_head_dim"], -1)
            k_b, v_b = np.split(kv_b, [cfg["qk_nope_head_dim"]], axis=1)
            out[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(k_b.transpose(0, 2, 1))
            out[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(v_b)
            continue
        if rest == "attention.g_proj.weight":
            out[f"blk.{i}.{'attn_gate' if i in full else 'ssm_g_a'}.weight"] = value
            continue
        if rest.endswith("_conv1d.weight"):
            value = value.reshape(1, value.shape[0], 1, value.shape[-1])
        elif rest == "attention.A_log":
            value = _exp(value).reshape(-1, 1)
        out[f"blk.{i}.{layer[rest]}"] = np.ascontiguousarray(value)
    return out


def _kimi_linear(w: gguf.GGUFWriter, cfg: dict) -> None:
    """KimiLinearModel's keys: TextModel's (the router's counts under Moonshot's names; n_group only where the config
    says it so), head_count_kv a layer (0 for KDA, 1 for latent attention as MQA), KDA's and MLA's sizes, the
    router's dense prefix, shared experts and scale (no expert_weights_norm: the graph always renormalises)."""
    linear = cfg["linear_attn_config"]
    if cfg.get("head_dim"):                 # TextModel's (kiln reads value_length_mla)
        w.add_value_length(cfg["head_dim"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["model_max_length"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([1 if i + 1 in linear["full_attn_layers"] else 0 for i in range(cfg["num_hidden_layers"])])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_token"])
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_ssm_conv_kernel(linear["short_conv_kernel_size"])
    w.add_kda_head_dim(linear["head_dim"])
    _mla_keys(w, cfg)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["num_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])


def _granite4(w: gguf.GGUFWriter, cfg: dict, arch: str) -> None:
    """GraniteHybridModel's attention keys: a kv head count a layer (0: Mamba), and RoPE (rope.scaling.finetuned)
    for a model without Mamba layers as the current converter writes it (granite / granitemoe); as granitehybrid,
    as the converter wrote it before or with Mamba layers, none, with a context of 2 ** 20; Mamba-2's sizes."""
    w.add_head_count_kv([cfg["num_key_value_heads"] if _attention(t) else 0 for t in cfg["layer_types"]])
    use_rope = arch != "granitehybrid"
    w.add_rope_scaling_finetuned(use_rope)
    if not use_rope:
        w.add_context_length(2 ** 20)
    if not all(map(_attention, cfg["layer_types"])):
        _mamba2(w, cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_n_groups"], cfg["mamba_d_state"],
                cfg["mamba_d_conv"])


def _bamba(w: gguf.GGUFWriter, cfg: dict) -> None:
    """GraniteHybridModel's keys for Bamba: a kv head count a layer (0 off attn_layer_indices), RoPE (finetuned) on
    attn_rotary_emb dims (released configs': half of each head; written over LlamaModel's whole head), Mamba-2's
    sizes; no multipliers (Bamba's config has none) nor key_length (no head_dim)."""
    attends = set(cfg["attn_layer_indices"])
    w.add_head_count_kv([cfg["num_key_value_heads"] if i in attends else 0 for i in range(cfg["num_hidden_layers"])])
    w.add_rope_dimension_count(_head_dim(cfg) // 2)
    w.add_rope_scaling_finetuned(True)
    _mamba2(w, cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_n_groups"], cfg["mamba_d_state"],
            cfg["mamba_d_conv"])


def _mamba2(w: gguf.GGUFWriter, heads: int, head_dim: int, groups: int, state: int, taps: int) -> None:
    """GraniteHybridModel's ssm.* keys: the heads as time_step_rank, their width as inner_size."""
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_state_size(state)
    w.add_ssm_group_count(groups)
    w.add_ssm_inner_size(heads * head_dim)
    w.add_ssm_time_step_rank(heads)


def _nemotron_h(w: gguf.GGUFWriter, cfg: dict) -> None:
    """NemotronHModel's keys (through GraniteHybridModel's): per-layer kv heads and MLP widths (the experts' in a
    MoE model), the whole head as rope.dimension_count (TextModel's default: the model has no RoPE); a MoE model's
    expert keys (DeepSeek-V3's)."""
    kinds = cfg["layers_block_type"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(2 ** 20)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length([cfg["intermediate_size"] if k == "mlp" else cfg["moe_intermediate_size"]
                               if k == "moe" else 0 for k in kinds])
    if "moe" in kinds:
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["moe_shared_expert_intermediate_size"])
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_head_count_kv([cfg["num_key_value_heads"] if k in ("attention", "full_attention") else 0 for k in kinds])
    w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_scaling_finetuned(False)
    _mamba2(w, cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"], cfg["ssm_state_size"],
            cfg["conv_kernel"])


def _mamba2_only(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Mamba2Model's keys: no attention (_no_attention), ssm.* as granitehybrid's."""
    _no_attention(w, cfg)
    _mamba2(w, cfg["num_heads"], cfg["head_dim"], cfg["n_groups"], cfg["state_size"], cfg["conv_kernel"])
    w.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])


def _falcon_h1(w: gguf.GGUFWriter, cfg: dict) -> None:
    """FalconH1Model's keys: Mamba2Model's (ssm.*: the heads as time_step_rank, mamba_d_ssm as inner_size), then the
    attention's and the MLP's over them."""
    heads = cfg["mamba_n_heads"]
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    _mamba2(w, heads, cfg["mamba_d_ssm"] // heads, cfg["mamba_n_groups"], cfg["mamba_d_state"], cfg["mamba_d_conv"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(_rope(cfg)[0])


def _exp(value: np.ndarray) -> np.ndarray:
    """exp(x) in float32 as the converters compute A from A_log (torch's exp, which numpy's differs from by an
    ulp)."""
    import torch
    return torch.exp(torch.from_numpy(np.ascontiguousarray(value, np.float32))).numpy()


def _falcon_h1_folded(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """FalconH1Model.modify_tensors: every multiplier folded into the weight it scales (in_proj's rows a section of
    z, x, B, C, dt each times its ssm_multipliers entry)."""
    mlp, ssm = cfg["mlp_multipliers"], cfg["ssm_multipliers"]
    inner, bc = cfg["mamba_d_ssm"], cfg["mamba_n_groups"] * cfg["mamba_d_state"]
    ai = cfg["attention_in_multiplier"]
    scales = {"down_proj.weight": (mlp[1],), "gate_proj.weight": (mlp[0],),
              "k_proj.weight": (cfg["key_multiplier"], ai), "q_proj.weight": (ai,), "v_proj.weight": (ai,),
              "o_proj.weight": (cfg["attention_out_multiplier"],), "out_proj.weight": (cfg["ssm_out_multiplier"],),
              "lm_head.weight": (cfg["lm_head_multiplier"],), "embed_tokens.weight": (cfg["embedding_multiplier"],)}
    out = {}
    for name, value in hf.items():
        value = value.astype(np.float32)
        key = next((k for k in scales if name.endswith(k)), None)
        if key:
            for scale in scales[key]:        # one after another, as the converter multiplies
                value = value * scale
        elif name.endswith("in_proj.weight"):
            rows = np.concatenate([np.full(inner, ssm[0]), np.full(inner, ssm[1]), np.full(bc, ssm[2]),
                                   np.full(bc, ssm[3]), np.full(value.shape[0] - 2 * inner - 2 * bc, ssm[4])])
            value = value * cfg["ssm_in_multiplier"] * rows[:, None].astype(np.float32)
        out[name] = value
    return out


def _jamba(w: gguf.GGUFWriter, cfg: dict) -> None:
    """JambaModel's keys: a kv head count a layer (0 but every attn_layer_period-th from attn_layer_offset), Mamba-1's
    sizes as ssm.*, the expert counts (which layers have experts: the tensors say)."""
    n, hidden, offset, period = (cfg[k] for k in ("num_hidden_layers", "hidden_size", "attn_layer_offset",
                                                  "attn_layer_period"))
    w.add_block_count(n)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([cfg["num_key_value_heads"] if i >= offset and (i - offset) % period == 0 else 0
                         for i in range(n)])
    w.add_ssm_conv_kernel(cfg["mamba_d_conv"])
    w.add_ssm_inner_size(cfg["mamba_expand"] * hidden)
    w.add_ssm_state_size(cfg["mamba_d_state"])
    w.add_ssm_time_step_rank(cfg["mamba_dt_rank"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])


def _mamba1(w: gguf.GGUFWriter, cfg: dict) -> None:
    """MambaModel's keys: no attention (_no_attention), dt's rank as ssm.time_step_rank, Falcon Mamba's norms as
    ssm.dt_b_c_rms."""
    _no_attention(w, cfg)
    w.add_ssm_conv_kernel(cfg["conv_kernel"])
    w.add_ssm_inner_size(cfg["intermediate_size"])
    w.add_ssm_state_size(cfg["state_size"])
    w.add_ssm_time_step_rank(cfg["time_step_rank"])
    w.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])
    w.add_ssm_dt_b_c_rms(cfg["model_type"] == "falcon_mamba")


def _no_attention(w: gguf.GGUFWriter, cfg: dict) -> None:
    """The keys MambaModel and Mamba2Model write for a model without attention: a context of 2 ** 20, head_count and
    feed_forward_length 0."""
    w.add_context_length(2 ** 20)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(cfg["num_hidden_layers"])


def _mamba2_tensors(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Mamba2Model's transforms: A as -exp(A_log), A and D as [heads, 1], the gated norm's weight as [groups,
    inner / groups], dt_bias renamed dt_proj.bias, the conv squeezed."""
    groups = cfg.get("mamba_n_groups", cfg.get("n_groups"))
    out = {}
    for name, value in hf.items():
        if name.endswith(".A_log"):
            value = -_exp(value)
            value = value if cfg.get("model_type") in MAMBA1 else value.reshape(-1, 1)
        elif name.endswith((".mamba.D", ".mixer.D")) and cfg.get("model_type") not in MAMBA1:
            value = value.reshape(-1, 1)
        elif name.endswith(".dt_bias"):
            name = name.replace(".dt_bias", ".dt_proj.bias")
        elif name.endswith("conv1d.weight"):
            value = value.squeeze(1)
        elif name.endswith((".mamba.norm.weight", ".mixer.norm.weight")):
            value = value.reshape(groups, -1)
        out[name] = value
    return out


def _block_count(cfg: dict, arch: str) -> int:
    """Layers, with the multi-token-prediction ones GLM-4.5's, K-EXAONE's and EXAONE 4.5's converters append."""
    n_layer = cfg.get("num_hidden_layers", cfg.get("n_layer", cfg.get("n_layers")))
    mtp = arch in ("glm4moe", "exaone-moe", "exaone4") or cfg.get("model_type") == "glm4_moe_lite"
    return n_layer + (cfg.get("num_nextn_predict_layers") or 0 if mtp else 0)


def _experts(w: gguf.GGUFWriter, cfg: dict, arch: str) -> None:
    """Expert metadata as the converter writes it: TextModel's keys from the config's names for them, then
    the family's own (Qwen2MoeModel's sizes; Glm4MoeModel's, Dots1Model's, ExaoneMoEModel's router keys;
    Ernie4_5MoeModel's layer step; HunYuanMoEModel's lists, of which it writes the first)."""
    count = next((cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
                  if k in cfg), None)
    if count is None:
        return
    w.add_expert_count(count)
    if arch == "hunyuan-moe" and len(set(cfg["moe_topk"])) > 1:
        raise ValueError(f"llama.cpp's converter takes one top k for every layer, not moe_topk {cfg['moe_topk']}")
    w.add_expert_used_count(cfg["moe_topk"][0] if arch == "hunyuan-moe" else cfg.get("num_experts_per_tok",
                                                                                      cfg.get("moe_k")))
    if "n_group" in cfg:
        w.add_expert_group_count(cfg["n_group"])
    if "topk_group" in cfg:
        w.add_expert_group_used_count(cfg["topk_group"])
    if arch == "glm4moe":
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    elif cfg.get("scoring_func"):
        w.add_expert_gating_func(gguf.ExpertGatingFuncType[cfg["scoring_func"].upper()])
    # Hunyuan's released config.json lists moe_intermediate_size and num_shared_expert per layer; transformers'
    # has neither (its experts are intermediate_size wide, one shared MLP).
    ffn = cfg["intermediate_size"] if arch in ("minimax-m2", "hunyuan-moe", "gpt-oss", "llama4") else cfg.get(
        "moe_intermediate_size")
    if ffn:
        w.add_expert_feed_forward_length(ffn)
    shared = next((cfg[k] for k in ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts") if k in cfg),
                  1 if arch == "hunyuan-moe" else None)
    if shared is not None and arch != "hy_v3":          # HYV3Model writes none
        w.add_expert_shared_count(shared)
    shared_ffn = cfg.get("shared_expert_intermediate_size")
    if arch in ("exaone-moe", "hy_v3"):
        shared_ffn = cfg["moe_intermediate_size"] * shared
    elif arch == "hunyuan-moe":
        shared_ffn = cfg["intermediate_size"]
    elif arch == "ernie4_5-moe" and shared:     # sic: ERNIE-4.5-21B's 12288 // 4 kv heads = its 2 x 1536
        shared_ffn = cfg["intermediate_size"] // cfg["num_key_value_heads"]
    if shared_ffn:
        w.add_expert_shared_feed_forward_length(shared_ffn)
    if arch == "mellum":                        # MellumModel's, and TextModel's base for the sliding layers
        if cfg.get("use_sliding_window") in (True, None) and cfg.get("sliding_window") is not None:
            w.add_sliding_window(cfg["sliding_window"])
            w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    if arch == "hy_v3":                         # HYV3Model's (no leading_dense_block_count: the tensors say)
        w.add_expert_weights_norm(cfg.get("route_norm", True))
        w.add_expert_weights_scale(float(cfg.get("router_scaling_factor", 1.0)))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "llama4":
        w.add_interleave_moe_layer_step(cfg["interleave_moe_layer_step"])
        if "layer_types" in cfg and all(kind == "full_attention" for kind in cfg["layer_types"]):
            w.add_sliding_window(0)                     # MobileLLM's: Llama4Model turns the chunks off
    if arch == "ernie4_5-moe":
        w.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
        w.add_leading_dense_block_count(cfg["moe_layer_start_index"])
    if arch in ("glm4moe", "dots1", "exaone-moe"):
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
    if arch == "exaone-moe" or (arch == "glm4moe" and "num_nextn_predict_layers" in cfg):
        w.add_nextn_predict_layers(cfg.get("num_nextn_predict_layers") or 0)


def _normal_to_neox(rows: np.ndarray, heads: int, head_dim: int, rotary: int) -> np.ndarray:
    """Glm4Model.normal_to_neox: each head's rotated rows, even ones first, then odd ones (M-RoPE's pairing)."""
    shaped = rows.reshape(heads, head_dim, -1)
    rot = shaped[:, :rotary]
    return np.concatenate([rot[:, 0::2], rot[:, 1::2], shaped[:, rotary:]], axis=1).reshape(rows.shape)


def _tensors(cfg: dict, arch: str, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array as llama.cpp stores it (HF name mapped, values transformed)."""
    if arch == "glm4" and (cfg.get("rope_parameters") or {}).get("mrope_section"):     # GLM-4.1V's q/k rows
        rotary = int(_partial(cfg) * _head_dim(cfg))
        for name in [n for n in hf if re.search(r"\.(q|k)_proj\.(weight|bias)$", n)]:
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            hf[name] = _normal_to_neox(hf[name], heads, _head_dim(cfg), rotary)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == NAMED_AS.get(arch, arch)),
                                     _block_count(cfg, arch))
    n_head = cfg.get("num_attention_heads", cfg.get("n_head"))
    n_kv = cfg.get("num_key_value_heads") or n_head
    out = {}
    if arch == "granite_swa":       # GraniteSWAModel's names (gguf-py's granite_swa map); experts and shared MLP fused
        for name in [n for n in hf if re.search(r"\.(sinks|router\.weight|experts\.gate_up_proj|experts\.down_proj|"
                                                r"shared_mlp\.(input|output)_linear\.weight)$", n)]:
            i = re.search(r"layers\.(\d+)\.", name).group(1)
            key = next(k for part, k in GRANITE_SWA_NAMES.items() if part in name)
            out[f"blk.{i}.{key}.weight"] = np.ascontiguousarray(hf.pop(name), np.float32)
    dense = cfg["model_type"] == "granitemoehybrid" and not cfg.get("num_local_experts")
    for hf_name in [n for n in hf if n.endswith("input_linear.weight")]:   # Granite MoE: gate then up rows
        gate, up = np.split(hf.pop(hf_name), 2, axis=-2)
        i, kind = re.search(r"layers\.(\d+)\.(\w+)\.input_linear", hf_name).groups()
        suffix = "_exps" if kind == "block_sparse_moe" else "" if dense else "_shexp"   # Granite 4.0's dense MLP
        out[f"blk.{i}.ffn_gate{suffix}.weight"], out[f"blk.{i}.ffn_up{suffix}.weight"] = (
            np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32))
        if dense:
            out[f"blk.{i}.ffn_down.weight"] = hf.pop(f"model.layers.{i}.shared_mlp.output_linear.weight")
    if arch == "kimi-linear":      # KimiLinearModel's: convs [1, channels, 1, taps], A as -exp(A_log), dt_proj.bias
        hf = {k.replace(".dt_bias", ".dt_proj.bias"): -_exp(v) if k.endswith(".A_log") else
              v.reshape(1, v.shape[0], 1, v.shape[-1]) if k.endswith("_conv1d.weight") else v for k, v in hf.items()}
    for hf_name in [n for n in hf if n.endswith("kv_b_proj.weight") and arch in ("deepseek2", "mistral4", "kimi-linear",
                                                                                 *DSA)]:
        # split for llama.cpp's MLA weight absorption: each head's key rows transposed, then its value rows
        kv_b = hf.pop(hf_name).reshape(n_head, cfg["qk_nope_head_dim"] + cfg["v_head_dim"], -1)
        i = re.search(r"layers\.(\d+)\.", hf_name).group(1)
        k_b, v_b = np.split(kv_b.astype(np.float32), [cfg["qk_nope_head_dim"]], axis=1)
        out[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(k_b.transpose(0, 2, 1))
        out[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(v_b)
    if arch == "gemma4":           # the converter names the layer's scalar and experts weights, the router's scales
        for name in [n for n in hf if n.endswith((".router.scale", ".router.per_expert_scale"))]:   # the FFN's
            i = re.search(r"layers\.(\d+)\.", name).group(1)
            out[f"blk.{i}.ffn_gate_inp.scale" if name.endswith(".scale") and "per_expert" not in name
                else f"blk.{i}.ffn_down_exps.scale"] = hf.pop(name).astype(np.float32)
        hf = {k + ".weight" if k.endswith((".layer_scalar", ".gate_up_proj", ".down_proj")) and ".experts." in k
              or k.endswith(".layer_scalar") else k: v for k, v in hf.items()}
        out["rope_freqs.weight"] = _gemma4_rope_freqs(cfg)
    if arch == "gemma3n":          # AltUp's projections stacked; *_scale named a weight
        for kind in ("altup_projections", "altup_unembed_projections"):
            parts = sorted(n for n in hf if n.startswith(f"model.{kind}."))
            hf[f"model.{kind}.weight"] = np.stack([hf.pop(n) for n in parts])
        hf = {k + ".weight" if k.endswith("_scale") else k: v for k, v in hf.items()}
    if arch in ("qwen35", "qwen35moe"):
        hf = _qwen35_tensors(cfg, hf)
    if arch == "qwen3next":
        hf = _qwen35_tensors(cfg, _qwen3next_qkvz(cfg, hf), tile=False)
    if arch == "falcon-h1":
        hf = _falcon_h1_folded(cfg, hf)
    if arch in ("granitehybrid", "nemotron_h", "nemotron_h_moe", "mamba2", "mamba", "falcon-h1", "jamba"):
        hf = _mamba2_tensors(cfg, hf)
    if arch in ("lfm2", "lfm2moe"):    # the conv op takes a 2-D weight
        hf = {k: v.squeeze(1) if k.endswith("conv.conv.weight") else v for k, v in hf.items()}
    if arch == "hy_v3":            # HYV3Model's names (gguf-py's HY_V3 map), as dots1's map names them
        for name in [n for n in hf if n.endswith(".mlp.expert_bias")]:
            layer = re.search(r"layers\.(\d+)\.", name).group(1)
            out[f"blk.{layer}.exp_probs_b"] = hf.pop(name).astype(np.float32)
        hf = {k.replace(".mlp.router.gate.", ".mlp.gate.").replace(".mlp.shared_mlp.", ".mlp.shared_experts."): v
              for k, v in hf.items()}
    if arch == "mistral4":         # Mistral4Model's: the experts stacked already, named as weights
        hf = {k + ".weight" if k.endswith((".experts.gate_up_proj", ".experts.down_proj")) else k: v
              for k, v in hf.items()}
    if arch == "llama4":           # Llama4Model's split: gate_up_proj's halves and down_proj, each [experts, out, in]
        for name in [n for n in hf if n.endswith(".experts.gate_up_proj")]:
            gate, up = np.split(hf.pop(name).swapaxes(-1, -2), 2, axis=-2)
            hf[f"{name[:-12]}gate_proj.weight"], hf[f"{name[:-12]}up_proj.weight"] = gate, up
        for name in [n for n in hf if n.endswith(".experts.down_proj")]:
            hf[f"{name}.weight"] = hf.pop(name).swapaxes(-1, -2)
    if arch == "bitnet":           # BitnetModel's: 1bitLLM's norm names; each Linear made ternary (weight_quant)
        hf = {k.replace(".attn_sub_norm.", ".inner_attn_ln.").replace(".ffn_sub_norm.", ".ffn_layernorm."):
              _bitnet_weight_quant(v) if re.search(r"\.(q|k|v|o|gate|up|down)_proj\.weight$", k) else v
              for k, v in hf.items()}
    if arch == "dbrx":             # DbrxModel's: each expert tensor viewed [experts, ffn, d_model], w2 transposed
        ffn = cfg["ffn_config"]
        shape = (ffn["moe_num_experts"], ffn["ffn_hidden_size"], cfg["d_model"])
        hf = {k + ".weight" if k.endswith((".mlp.w1", ".mlp.v1", ".mlp.w2")) else k:
              (v.reshape(shape).transpose(0, 2, 1) if k.endswith(".mlp.w2") else v.reshape(shape))
              if k.endswith((".mlp.w1", ".mlp.v1", ".mlp.w2")) else v for k, v in hf.items()}
    if arch == "gpt-oss":
        out.update(_gpt_oss_experts(hf))
    if arch in ("gpt-oss", "mimo2"):   # the converters' renames
        hf = {k + ".weight" if k.endswith((".sinks", ".attention_sink_bias")) else k: v for k, v in hf.items()}
    for hf_name, value in _stacked_experts(hf).items():
        value = value.astype(np.float32)
        if hf_name == "lm_head.weight" and (cfg.get("tie_word_embeddings", True) or arch == "gpt2"):
            continue
        if hf_name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")   # the converter's rename
        if arch == "bloom":                    # BloomModel.modify_tensors strips it
            hf_name = re.sub(r"^transformer\.", "", hf_name)
        if arch in ("afmoe", "bailingmoe2"):   # AfmoeModel's and BailingMoeV2Model's filter_tensors
            hf_name = hf_name.replace(".expert_bias", ".expert_bias.bias")
        if arch == "lfm2moe":                  # the converter's merged experts' name, which gguf-py maps
            hf_name = re.sub(r"^model\.(layers\.\d+\.feed_forward\.experts\.)", r"\1", hf_name)
            hf_name = hf_name.replace(".expert_bias", ".expert_bias.bias")
        if arch == "nemotron_h_moe":           # its merged experts renamed as a Llama MoE's, which gguf-py maps
            hf_name = re.sub(r"backbone\.layers\.(\d+)\.mixer\.experts\.", r"model.layers.\1.mlp.experts.", hf_name)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        nextn = re.match(r"model\.layers\.(\d+)\.(eh_proj|enorm|hnorm|shared_head\.norm)\.weight$", hf_name)
        if name is None and nextn:              # this gguf-py's exaone4 lists no nextn tensors; the converter's does
            name = f"blk.{nextn[1]}.nextn.{nextn[2].replace('.', '_')}.weight"
        if name is None:
            raise ValueError(f"gguf-py maps no {arch} tensor to {hf_name}")
        if arch in ("gptneox", "bloom") and ".attn_qkv." in name:   # each head's q, k, v -> every q, k, v
            value = value.reshape(n_head, 3, -1, *value.shape[1:]).swapaxes(0, 1).reshape(value.shape)
        if arch == "falcon" and ".attn_qkv." in name:   # each kv group's [q heads, k, v] -> every q, k, v
            kv, d = _falcon_kv_heads(cfg), _head_dim(cfg)
            grouped, cols = value.reshape(kv, n_head // kv + 2, d, -1), value.shape[1]
            value = np.concatenate([grouped[:, :-2].reshape(-1, cols), grouped[:, -2].reshape(-1, cols),
                                    grouped[:, -1].reshape(-1, cols)])
        if arch in PERMUTED and name.endswith(("attn_q.weight", "attn_k.weight")):
            value = _permute(value, n_head if "attn_q" in name else n_kv)
        if (arch.startswith("gemma") and arch not in ("gemma4", "gemma3n") or arch == "nemotron") \
                and name.endswith("norm.weight"):
            value = value + 1
        if arch == "gpt2" and value.ndim == 2 and name.split(".")[-2] in ("attn_qkv", "attn_output", "ffn_up",
                                                                          "ffn_down"):
            value = value.T
        out[name] = np.ascontiguousarray(value)
    if arch == "gpt2":
        out["output.weight"] = out["token_embd.weight"]
    _, scaling = _rope(cfg)
    if arch in ("llama", "exaone", "llama4", "apertus") and scaling and scaling["rope_type"] == "llama3":
        out["rope_freqs.weight"] = _llama3_factors(cfg, scaling)
    if arch in ("phi3", "phimoe", "minicpm3") and scaling:
        out["rope_factors_long.weight"] = np.asarray(scaling["long_factor"], np.float32)
        out["rope_factors_short.weight"] = np.asarray(scaling["short_factor"], np.float32)
    return out


def _stacked_experts(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's per-expert tensors stacked into one [experts, rows, cols] tensor under the merged name
    gguf-py maps to ffn_*_exps (llama.cpp's converter merges them so): experts.{j}.w1 -> experts.w1."""
    out, experts = {}, {}
    for name, value in hf.items():
        m = re.fullmatch(r"(.*\.experts)\.(\d+)\.(\w+)\.weight", name)
        if m is None:
            out[name] = value
        else:
            experts.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = value
    for name, parts in experts.items():
        out[name] = np.stack([parts[j] for j in sorted(parts)])
    return out


def _falcon_kv_heads(cfg: dict) -> int:
    """Falcon's kv heads as a real checkpoint's config.json gives them to the converter (num_kv_heads, else 1:
    multi-query Falcon-7B writes none; transformers' saved config fills it with the head count)."""
    return cfg["num_kv_heads"] if cfg.get("new_decoder_architecture") else 1


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: interleave each head's two rotary halves."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(cfg: dict, s: dict) -> np.ndarray:
    """llama.cpp's rope_freqs.weight for Llama 3 scaling: one divisor per RoPE frequency."""
    theta, dim = _rope(cfg)[0], _head_dim(cfg)
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    old = s.get("original_max_position_embeddings", 8192)
    low, high, factor = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0), s.get("factor", 8.0)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _tokenizer(w: gguf.GGUFWriter, hf_dir: Path, vocab_size: int, pre: str = "gpt-2") -> None:
    """A byte-level BPE tokenizer.json as llama.cpp's _set_vocab_gpt2 writes it: ids the tokenizer
    lacks, up to the model's vocab_size, become [PAD<i>] tokens of type UNUSED."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab.update(special)
    tokens = [None] * max(max(vocab.values()) + 1, vocab_size)
    for text, i in vocab.items():
        tokens[i] = text
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 5 if t.startswith("[PAD") else 1 for t in tokens])
    w.add_token_merges(merges)
    for key, add in (("eos_token", w.add_eos_token_id), ("bos_token", w.add_bos_token_id)):
        if tok_cfg.get(key) in special:
            add(special[tok_cfg[key]])
    w.add_add_bos_token(bool(tok_cfg.get("add_bos_token")))
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])


# The families whose converter writes its own keys, not TextModel's (_metadata): writer(w, cfg).
GRANITE_SWA_NAMES = {".sinks": "attn_sinks", ".router.": "ffn_gate_inp", ".gate_up_proj": "ffn_gate_up_exps",
                     ".down_proj": "ffn_down_exps", ".input_linear.": "ffn_up_shexp",
                     ".output_linear.": "ffn_down_shexp"}


def _granite_swa(w: gguf.GGUFWriter, cfg: dict) -> None:
    """GraniteSWAModel's own keys: the window, each layer's kind, and which layers rotate from the config's
    no_rope_layers (1: RoPE). The converter writes one RoPE base: a config whose layer_rope_theta has another (or a
    0 no_rope_layers does not say) loses it, so the writer refuses it."""
    w.add_sliding_window(cfg.get("sliding_window", 128))
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    rotates = [bool(x) for x in cfg.get("no_rope_layers") or [1] * cfg["num_hidden_layers"]]
    theta = _rope(cfg)[0]
    if cfg.get("layer_rope_theta") and list(cfg["layer_rope_theta"]) != [theta if r else 0 for r in rotates]:
        raise ValueError(f"layer_rope_theta {cfg['layer_rope_theta']} is not what GraniteSWAModel writes "
                         f"(rope_theta {theta} where no_rope_layers is 1)")
    if cfg.get("no_rope_layers"):
        w.add_array(f"{w.arch}.attention.rope_pattern", rotates)


def _chatglm(w: gguf.GGUFWriter, cfg: dict) -> None:
    """ChatGLMModel's keys, from the original checkpoint's config that transformers' Glm config stands for
    (seq_length, ffn_hidden_size, multi_query_group_num, layernorm_epsilon, rope_ratio x 10000 as the base):
    RoPE on half of each head (hidden / heads: kv_channels), no BOS added."""
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg.get("head_dim") not in (None, head):
        raise ValueError(f"ChatGLM's heads are hidden_size / num_attention_heads ({head}) wide, not {cfg['head_dim']}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(int(head * _partial(cfg, 0.5)))
    w.add_add_bos_token(False)
    w.add_rope_freq_base(_rope(cfg)[0])


def _chatglm_tensors(cfg: dict, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The original checkpoint's tensors as ChatGLMModel names them: query_key_value (q, k, v rows) as attn_qkv,
    dense_h_to_4h (the gate rows, then the up rows) as ffn_up."""
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    out = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    if not cfg.get("tie_word_embeddings"):
        out["output.weight"] = hf["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        k = f"model.layers.{i}"
        for part in ("weight", "bias"):
            if f"{k}.self_attn.q_proj.{part}" in hf:
                out[f"blk.{i}.attn_qkv.{part}"] = np.concatenate(
                    [hf[f"{k}.self_attn.{x}_proj.{part}"] for x in "qkv"])
        out.update({f"blk.{i}.{name}": hf[f"{k}.{hf_name}"] for hf_name, name in names.items()})
    return {name: np.ascontiguousarray(value, np.float32) for name, value in out.items()}


def _bitnet_weight_quant(w: np.ndarray) -> np.ndarray:
    """BitnetModel.weight_quant: round(W s).clip(-1, 1) / s, s = 1 / mean|W| (at least 1e-5), in float32."""
    w = w.astype(np.float32)
    s = np.float32(1) / np.maximum(np.abs(w).mean(dtype=np.float32), np.float32(1e-5))
    return np.clip(np.round(w * s), -1, 1) / s


MIMO2_NEXTN = 3      # MimoV2Model's: the three multi-token-prediction layers every released MiMo-V2 has, counted


def _mimo2(w: gguf.GGUFWriter, cfg: dict) -> None:
    """MimoV2Model's keys (TextModel's, then its own): block_count and the per-layer arrays counting the three
    multi-token-prediction layers (sliding, as the converter extends the pattern) whether or not the checkpoint has
    them; head_count_kv a layer (the sliding layers' twice), key_length the head size and value_length v_head_dim,
    the window (the released config's sliding_window: transformers' - 1) and each layer's kind, each kind's RoPE
    base, the rotated share as rope.dimension_count, the experts' keys (no gating function: llama.cpp's graph scores
    by sigmoid), attention.value_scale."""
    rope, n = cfg["rope_parameters"], cfg["num_hidden_layers"]
    hybrid = [t == "sliding_attention" for t in cfg["layer_types"]] + [True] * MIMO2_NEXTN
    w.add_block_count(n + MIMO2_NEXTN)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([cfg["num_key_value_heads"] * (2 if slides else 1) for slides in hybrid])
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["v_head_dim"])
    w.add_sliding_window(cfg["sliding_window"] - 1)     # the released config's: the positions before the query
    w.add_sliding_window_pattern(hybrid)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_rope_dimension_count(int(cfg["head_dim"] * rope["full_attention"]["partial_rotary_factor"]))
    if cfg.get("attention_value_scale") is not None:
        w.add_float32(f"{w.arch}.attention.value_scale", float(cfg["attention_value_scale"]))
    w.add_nextn_predict_layers(MIMO2_NEXTN)


def _dbrx(w: gguf.GGUFWriter, cfg: dict) -> None:
    """DbrxModel's keys: attn_config's and ffn_config's, clip_qkv as clamp_kqv, torch's LayerNorm epsilon."""
    attn, ffn = cfg["attn_config"], cfg["ffn_config"]
    w.add_block_count(cfg["n_layers"])
    w.add_context_length(cfg["max_seq_len"])
    w.add_embedding_length(cfg["d_model"])
    w.add_feed_forward_length(ffn["ffn_hidden_size"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(attn["kv_n_heads"])
    w.add_rope_freq_base(attn["rope_theta"])
    w.add_clamp_kqv(attn["clip_qkv"])
    w.add_expert_count(ffn["moe_num_experts"])
    w.add_expert_used_count(ffn["moe_top_k"])
    w.add_layer_norm_eps(1e-5)


def _cohere2moe(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Cohere2MoeModel's keys: TextModel's (the dense prefix's width as feed_forward_length, RMSNorm's or the
    LayerNorm's eps, expert_selection_fn as the gating function), the logit scale, the window and each layer's kind,
    the experts' width, the leading dense layers, expert_weights_norm, the shared experts' count and width (only
    "average" converts), the head size as rope.dimension_count."""
    if cfg.get("num_shared_experts") and cfg.get("shared_expert_combination_strategy", "average") != "average":
        raise ValueError("Cohere2 MoE only supports average shared expert combination")   # the converter's refusal
    n_dense = next((i for i, t in enumerate(cfg["mlp_layer_types"]) if t != "dense"), len(cfg["mlp_layer_types"])) \
        if cfg.get("mlp_layer_types") else cfg.get("first_k_dense_replace", 0)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg.get("prefix_dense_intermediate_size") or cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    if cfg.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType[cfg.get("expert_selection_fn", "softmax").upper()])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_logit_scale(cfg["logit_scale"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_leading_dense_block_count(n_dense)
    w.add_expert_weights_norm(cfg.get("norm_topk_prob", False))
    if cfg.get("num_shared_experts"):
        w.add_expert_shared_count(cfg["num_shared_experts"])
        w.add_expert_shared_feed_forward_length(cfg["intermediate_size"] * cfg["num_shared_experts"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)


# architectures the installed gguf-py does not know yet -> one whose tensor names it maps the same way
DSA = ("deepseek32", "glm-dsa")     # DeepSeek Sparse Attention: deepseek2 and the indexer's keys and tensors
NAMED_AS = {"deepseek32": "glm-dsa", "cohere2moe": "glm4moe", "hy_v3": "dots1", "mellum": "qwen3moe",
            "granite_swa": "granite"}
OWN_KEYS = {"cohere2moe": _cohere2moe, "gemma3n": _gemma3n, "lfm2": _lfm2, "lfm2moe": _lfm2, "nemotron_h": _nemotron_h,
            "nemotron_h_moe": _nemotron_h, "mamba2": _mamba2_only, "mamba": _mamba1, "falcon-h1": _falcon_h1,
            "jamba": _jamba, "kimi-linear": _kimi_linear, "bailingmoe2": _bailingmoe2, "bailingmoe3": _bailingmoe3,
            "bloom": _bloom, "mpt": _mpt, "minimax-m3": _minimax_m3, "dbrx": _dbrx,
            "mimo2": _mimo2, "chatglm": _chatglm}
