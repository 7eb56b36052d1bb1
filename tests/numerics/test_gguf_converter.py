"""tests/gguf_writer.py against llama.cpp's own converter (convert_hf_to_gguf.py, tools/llama_cpp_files.py fetches
it): for each case of test_gguf_families.py it takes, the converter's GGUF holds the writer's metadata (but the
tokenizer's and general.*) and the same tensors, so what test_gguf_families checks of kiln's reading (logits equal
transformers') holds for the files llama.cpp writes. Running the converter over the cases found AFMoE's q/k rows kept
as they are, Hy V3's shared MLP without a count, Phi-2's MLP width written as 4 x the width, OLMo 3's sliding base,
GPT-BigCode's kv head count 1 without multi_query, MiMo-V2-Flash's window as the positions before the query (one less
than transformers') and GLM-4-9B-chat-hf's q, k and v apart, which the writer (and kiln's reader) had otherwise.

Each case's folder is first given what its released checkpoint has and transformers' saved one lacks, where the
converter reads it (RELEASED config keys, TOKENIZER_CONFIG keys, ADDED_TOKENS, a SentencePiece model); the other
cases' converter classes need more than a tiny checkpoint can have (CANNOT), or drop what the test keeps (gemma3: the
embedding rows past the tokenizer's). The recurrent and hybrid families' GGUF tests' models (HYBRIDS: Mamba-1 / 2,
Jamba, Granite 4.0-H, Bamba, Nemotron-H, Falcon-H1, Qwen3.5 / Next, LFM2, Gemma 3n, Kimi Linear, Ling 3) are compared
alike."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
import transformers

import kiln

from conftest import LLAMA_CPP_FILES
from gguf_writer import write_gguf
from test_families import RENAMED, write_family
from test_gguf_families import CASES, IDS, TOL, WRITTEN_AS, write_hf
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
CANNOT = {
    "falcon-7b": "its view of query_key_value by num_kv_heads, which transformers fills with the head count where "
                 "multi_query leaves it unset (it then fails on any Falcon-7B)",
    "hunyuan-moe": "a tiktoken tokenizer (mergeable_ranks)", "deepseek32": "add_bos_token on the tokenizer",
    "mistral4": "the Mistral-format checkpoint",
    "gemma3": "nothing it lacks, but it drops the embedding rows past the tokenizer's (the test's 468 of 512)",
    "chatglm": "nothing, but from transformers' Glm it writes q, k and v apart (the writer writes ChatGLM's own "
               "checkpoints' attn_qkv), ChatGLM's default epsilon and the width as the context: "
               "test_chatglm_hf_as_the_converter_writes_it",
}
TAKEN = [case for case in CASES if case not in CANNOT and case not in WRITTEN_AS]


def _mimo2_released(c: dict) -> dict:
    """MiMo-V2-Flash's config.json as released: each kind's heads and RoPE as swa_* keys, the layer kinds as
    hybrid_layer_pattern, the window as the positions before the query (transformers' sliding_window - 1)."""
    rope, window = c["rope_parameters"], c["sliding_window"] - 1
    return dict(c, rope_parameters=None, hybrid_layer_pattern=[int(t == "sliding_attention") for t in c["layer_types"]],
                swa_num_key_value_heads=2 * c["num_key_value_heads"], swa_num_attention_heads=c["num_attention_heads"],
                swa_head_dim=c["head_dim"], swa_v_head_dim=c["v_head_dim"], topk_method="noaux_tc",
                sliding_window=window, sliding_window_size=window, layernorm_epsilon=c["rms_norm_eps"],
                rope_theta=rope["full_attention"]["rope_theta"], swa_rope_theta=rope["sliding_attention"]["rope_theta"],
                partial_rotary_factor=rope["full_attention"]["partial_rotary_factor"])


# Each config.json as the released checkpoints write it, where the converter reads keys transformers' saved one lacks
RELEASED = {"gpt2": lambda c: dict(c, n_ctx=c["n_positions"]), "cohere2": lambda c: dict(c, rotary_pct=1.0),
            "minimax-m2": lambda c: dict(c, rotary_dim=int(c["head_dim"] *
                                                           c["rope_parameters"]["partial_rotary_factor"])),
            "gpt-neox": lambda c: dict(c, rotary_pct=c["rope_parameters"]["partial_rotary_factor"]),
            **dict.fromkeys(["granite4", "granite4-moe"],
                            lambda c: dict(c, layer_types=["attention"] * c["num_hidden_layers"])),
            "phimoe": lambda c: dict(c, architectures=["PhiMoEForCausalLM"]),     # its remote code's name
            "hunyuan": lambda c: dict(c, max_position_embeddings=32768),     # the converter asserts a released one
            "mimo2": _mimo2_released, "exaone": RENAMED["exaone"]}     # EXAONE 3's own config names
# tokenizer_config.json's keys the converter reads: Phi-3 / Phi-4 take a GPT-2 tokenizer's vocabulary by its class
TOKENIZER_CONFIG = dict.fromkeys(["phi3", "phi4-partial-rotary", "phimoe"], {"tokenizer_class": "GPT2Tokenizer"})
# Families whose converter takes the vocabulary from a SentencePiece tokenizer.model (one is trained for them: the
# comparison leaves the tokenizer's keys out)
SENTENCEPIECE = ("gemma", "gemma2", "ernie4_5", "ernie4_5-moe", "nemotron", "minicpm3", "jamba")
# Special tokens the converter looks up in the tokenizer: GLM's
GLM_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>", "[gMASK]"]
ADDED_TOKENS = dict.fromkeys(["glm4", "glm4v", "glm4-moe", "deepseek2-glm4-moe-lite", "glm-dsa", "chatglm"], GLM_TOKENS)


# The recurrent and hybrid families' GGUF tests' models (each test module's config), with the released checkpoints'
# config keys the converter reads: Granite 4.0-H's layer kinds as "mamba" / "attention", Bamba's rotated width,
# Nemotron-H's blocks as hybrid_override_pattern (and a dense one without the experts' keys transformers saves),
# Mamba-2's width from expand only. Jamba's converter takes a SentencePiece tokenizer.model.
_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}
_BLOCKS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
_EXPERT_KEYS = ("num_experts_per_tok", "n_routed_experts", "moe_intermediate_size",
                "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap", "n_group", "topk_group",
                "n_shared_experts", "routed_scaling_factor", "norm_topk_prob", "mtp_layers_block_type",
                "num_nextn_predict_layers", "moe_latent_size")


def _nemotron_h_released(c: dict) -> dict:
    blocks = c["layers_block_type"]
    c = {k: v for k, v in c.items() if k != "layers_block_type" and ("moe" in blocks or k not in _EXPERT_KEYS)}
    return dict(c, hybrid_override_pattern="".join(_BLOCKS[b] for b in blocks), num_hidden_layers=len(blocks))


def _hybrids() -> dict:
    """name -> (a function writing the test's model into a folder, one making the folder its released checkpoint's
    where the converter needs that, converter flags)."""
    import test_gemma3n
    import test_kimi_linear
    import test_lfm2
    import test_mamba1
    import test_mamba2
    import test_qwen3_5

    def widened(model_cls, config_cls, cfg, seed=2, then=None):
        def write(hf):
            write_widened(model_cls, config_cls, cfg, hf, seed=seed)
            if then:
                then(hf)
        return write

    def config(edit):
        return lambda hf: _edit_json(hf / "config.json", edit)

    qwen_moe = dict(test_qwen3_5.CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48)
    granite = config(lambda c: dict(c, layer_types=[_KINDS[t] for t in c["layer_types"]]))
    ling = dict(test_kimi_linear.LING, expert_swiglu_limit_list=[0, 0.3, 0, 0.2],
                share_expert_swiglu_limit_list=[0, 0.25, 0, 0])

    def ling_released(hf):
        test_kimi_linear._as_ling_release(hf, kda_layers=(0, 2))
        config(lambda c: dict(c, norm_topk_prob=c.get("moe_renormalize", True), n_group=c["num_expert_group"],
                              score_function="sigmoid"))(hf)

    return {
        "granitehybrid-moe": (widened("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
                                      dict(test_mamba2.GRANITE, num_local_experts=4, num_experts_per_tok=2)),
                              granite, []),
        "granitehybrid-dense-rope": (widened(*test_mamba2.FAMILIES["granite4-h-dense-rope"]), granite, []),
        "bamba": (widened(*test_mamba2.FAMILIES["bamba"]), config(lambda c: dict(c, attn_rotary_emb=int(
            c["hidden_size"] // c["num_attention_heads"] * c["rope_parameters"]["partial_rotary_factor"]))), []),
        **{name: (widened(*test_mamba2.FAMILIES[name]), config(_nemotron_h_released), [])
           for name in ("nemotron-h", "nemotron-h-moe")},
        "mamba2": (widened(*test_mamba2.FAMILIES["mamba2"]),
                   config(lambda c: {k: v for k, v in c.items() if k != "intermediate_size"}), []),
        **{name: (widened(*test_mamba2.FAMILIES[name]), None, [])
           for name in ("falcon-h1", "falcon-h1-norm-before-gate")},
        **{name: (widened(*test_mamba1.FAMILIES[name]), None, []) for name in test_mamba1.FAMILIES},
        "jamba": (widened("JambaForCausalLM", "JambaConfig", test_mamba1.JAMBA), None, []),
        "qwen35": (widened("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", test_qwen3_5.CONFIG), None, ["--no-mtp"]),
        "qwen3next": (widened("Qwen3NextForCausalLM", "Qwen3NextConfig",
                              dict(qwen_moe, mlp_only_layers=[], decoder_sparse_step=1)), None, ["--no-mtp"]),
        "qwen35moe": (widened("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
                              {k: v for k, v in qwen_moe.items() if k != "intermediate_size"}), None, ["--no-mtp"]),
        "lfm2": (widened("Lfm2ForCausalLM", "Lfm2Config", test_lfm2.CONFIG), None, []),
        "lfm2moe": (widened("Lfm2MoeForCausalLM", "Lfm2MoeConfig", dict(
            test_lfm2.CONFIG, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, num_dense_layers=1,
            routed_scaling_factor=2.5, intermediate_size=96)), None, []),
        "gemma3n": (widened("Gemma3nForCausalLM", "Gemma3nTextConfig",
                            dict(test_gemma3n.TEXT, vocab_size_per_layer_input=512)), None, []),
        "kimi-linear": (widened("KimiLinearForCausalLM", "KimiLinearConfig", dict(test_kimi_linear.CONFIG, n_group=1),
                                then=test_kimi_linear._as_moonshot), None, []),
        "bailingmoe3": (widened("BailingHybridForCausalLM", "BailingHybridConfig", ling), ling_released, []),
    }


HYBRIDS = _hybrids()
# Metadata the converter writes otherwise, by key (after the architecture's name), each read alike by kiln: a value
# equal to the default where the other leaves it out, a key kiln does not read, (mistral) the window an older
# converter wrote, which kiln still reads, or (hunyuan) the 256k context it writes for any NTK-alpha Hunyuan
KNOWN = {"mistral": {"attention.sliding_window"}, "stablelm": {"rope.freq_base"}, "phi2": {"rope.freq_base"},
         "mixtral": {"attention.key_length", "attention.value_length"}, "cohere": {"rope.scaling.type"},
         "command-r-plus": {"rope.scaling.type"}, "exaone4": {"vocab_size"}, "exaone-moe": {"vocab_size"},
         "olmo": {"rope.dimension_count", "vocab_size"}, "falcon-40b": {"tensor_data_layout"},
         "deepseek2-v3": {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"},
         "gpt-oss": {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"},
         "cohere2": {"rope.dimension_count", "rope.scaling.type", "vocab_size"},
         "gpt-neox": {"attention.head_count_kv", "rope.freq_base"}, "gemma": {"rope.freq_base"},
         "hunyuan": {"context_length", "rope.scaling.original_context_length"},
         "nemotron": {"attention.layer_norm_rms_epsilon", "rope.scaling.type", "vocab_size"},
         # from EXAONE 3's layer_norm_epsilon the converter writes attention.layer_norm_epsilon, which llama.cpp's
         # exaone loader does not read (older converters wrote the rms key, as the writer does); kiln reads either
         "exaone": {"attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.dimension_count"},
         **dict.fromkeys(["granite4", "granite4-moe"], {"ssm.conv_kernel", "ssm.group_count", "ssm.inner_size",
                                                        "ssm.state_size", "ssm.time_step_rank"})}
# Tensors the writer writes that the converter does not: GPT-2's head, a copy of its embedding (older converters
# wrote it; kiln reads the head tied either way)
EXTRA_TENSORS = {"gpt2": {"output.weight"}}


@pytest.fixture(scope="module")
def converted(llama_cpp_files, tmp_path_factory) -> dict:
    """case -> (the writer's GGUF of its Hugging Face folder, None for CONVERTED_ONLY's; llama.cpp's GGUF of it),
    every case converted by one converter process; the writer writes each before the folder gets its released
    config."""
    root = tmp_path_factory.mktemp("converter")
    pairs, args = {}, []
    for case in TAKEN + list(HYBRIDS) + list(CONVERTED_ONLY):
        hf, theirs = root / case / "hf", root / case / "llama.gguf"
        mine = None if case in CONVERTED_ONLY else root / case / "mine.gguf"
        write, released, flags = HYBRIDS.get(case) or CONVERTED_ONLY.get(case) or (_write(case), None, [])
        write(hf)
        if mine:
            write_gguf(hf, mine)
        _release(case, hf)
        if released:
            released(hf)
        pairs[case] = (mine, theirs)
        args += [*flags, str(hf), str(theirs)]
    run = subprocess.run([sys.executable, str(LLAMA_CPP_FILES.__file__), "convert", *args], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return pairs


def _write(case: str):
    return lambda hf: write_hf(case, hf)


def _qwen35_with_mtp(hf) -> None:
    """test_qwen3_5's model with a multi-token-prediction block as Qwen3.5's releases hold one (mtp.*: a full-attention
    layer, its fc over [embedding; hidden] and three norms; mtp_num_hidden_layers 1), which transformers leaves unread
    and the converter keeps (block_count one more, nextn_predict_layers 1)."""
    import test_qwen3_5
    from safetensors.numpy import load_file, save_file
    cfg = test_qwen3_5.CONFIG
    write_widened("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", cfg, hf, seed=1)
    weights, rng = load_file(hf / "model.safetensors"), np.random.default_rng(0)
    full = f"model.layers.{cfg['num_hidden_layers'] - 1}."          # the full-attention layer, its shapes
    weights.update({"mtp.layers.0." + k[len(full):]: rng.normal(0, 0.1, v.shape).astype(np.float32)
                    for k, v in list(weights.items()) if k.startswith(full)})
    width = cfg["hidden_size"]
    weights["mtp.fc.weight"] = rng.normal(0, 0.1, (width, 2 * width)).astype(np.float32)
    weights.update({f"mtp.{n}.weight": np.ones(width, np.float32)
                    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")})
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    _edit_json(hf / "config.json", lambda c: dict(c, mtp_num_hidden_layers=1))


# PaddleOCR-VL (transformers' class: a vision tower beside Ernie 4.5's layers with RoPE over halves, every projection
# biased), with Ernie's SentencePiece tokenizer: the converter keeps its language model (arch paddleocr)
PADDLEOCR_VL = dict(
    text_config=dict(model_type="paddleocr_vl_text", vocab_size=512, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_bias=True,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
                     pad_token_id=0),
    vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
                       image_size=28),
    image_token_id=511)


def _paddleocr_vl(hf) -> None:
    write_widened("PaddleOCRVLForConditionalGeneration", "PaddleOCRVLConfig", PADDLEOCR_VL, hf, seed=1)
    _sentencepiece_model(hf / "tokenizer.model")


# HunyuanOCR (transformers' HunYuanVL: a vision tower beside Hunyuan's dense layers under XD-RoPE with an NTK alpha,
# which transformers saves as dynamic with mrope_section), with a byte-level BPE tokenizer.json: the converter keeps
# its language model (arch hunyuan_vl: the base and alpha written apart)
HUNYUAN_VL = dict(
    text_config=dict({k: v for k, v in PADDLEOCR_VL["text_config"].items() if k != "use_bias"},
                     model_type="hunyuan_vl_text", rope_parameters=dict(rope_type="xdrope", rope_theta=10000.0,
                                                                       alpha=1000.0, factor=1.0,
                                                                       xdrope_section=[2, 2, 2, 2])),
    vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
                       out_hidden_size=64, text_hidden_size=64, max_image_size=224),
    image_token_id=511, im_start_id=508, im_end_id=509, im_newline_id=510)


def _muse_glimmer_case() -> tuple[str, str, dict]:
    """test_vision_text's Muse Glimmer case with its post norms' released epsilon (llama.cpp's graph fixes 1e-8)."""
    from test_vision_text import CASES as VISION_CASES
    cls, config_cls, cfg = VISION_CASES["muse-glimmer"]
    return cls, config_cls, dict(cfg, text_config={k: v for k, v in cfg["text_config"].items() if k != "post_norm_eps"})


# Files only the converter writes here, each compiled against transformers below, as HYBRIDS' entries
def _xverse_released(hf) -> None:
    """The folder as XVERSE's: its architecture, and a tokenizer with a token for every id of the vocabulary (the
    converter writes each id's; the test's has fewer)."""
    _edit_json(hf / "config.json", lambda c: dict(c, model_type="xverse", architectures=["XverseForCausalLM"]))
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(XVERSE["vocab_size"] - len(tokenizer))])
    tokenizer.save_pretrained(hf)


PANGU = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, attention_bias=True, eos_token_id=2, bos_token_id=1)
XVERSE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
MAINCODER = dict(XVERSE, num_key_value_heads=2, head_dim=16, pad_token_id=0)


COGVLM = dict(XVERSE, num_key_value_heads=4, pad_token_id=0, sliding_window=None)


def _cogvlm_released(hf) -> None:
    """test_families_read_as_another's Phi-3 model as CogVLM's checkpoint: its language expert's tensors (q, k and v
    as language_expert_query_key_value, the output as language_expert_dense, the MLP as language_mlp's gate / up /
    down) beside a vision expert's of the same shapes (random: no text token reaches them), its config's
    architectures CogVLMForCausalLM."""
    from safetensors.numpy import load_file, save_file
    weights, rng = load_file(hf / "model.safetensors"), np.random.default_rng(3)
    ffn = COGVLM["intermediate_size"]
    for layer in range(COGVLM["num_hidden_layers"]):
        k = f"model.layers.{layer}"
        qkv, dense = weights.pop(f"{k}.self_attn.qkv_proj.weight"), weights.pop(f"{k}.self_attn.o_proj.weight")
        gate_up, down = weights.pop(f"{k}.mlp.gate_up_proj.weight"), weights.pop(f"{k}.mlp.down_proj.weight")
        for expert, (a, o, g, u, d) in (("language", (qkv, dense, gate_up[:ffn], gate_up[ffn:], down)),
                                        ("vision", tuple(rng.normal(0, 0.08, t.shape).astype(np.float32)
                                                         for t in (qkv, dense, gate_up[:ffn], gate_up[ffn:], down)))):
            weights.update({f"{k}.self_attn.{expert}_expert_query_key_value.weight": a,
                            f"{k}.self_attn.{expert}_expert_dense.weight": o,
                            f"{k}.mlp.{expert}_mlp.gate_proj.weight": g, f"{k}.mlp.{expert}_mlp.up_proj.weight": u,
                            f"{k}.mlp.{expert}_mlp.down_proj.weight": d})
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, hf / "model.safetensors",
              metadata={"format": "pt"})
    _edit_json(hf / "config.json", lambda c: dict(c, architectures=["CogVLMForCausalLM"]))


def _maincoder_released(hf) -> None:
    """test_maincoder_as_the_converter_writes_it's Hunyuan dense model as Maincoder's checkpoint computing it under
    llama.cpp's reading (its q/k rows taken as pairs for RoPE, q_norm / k_norm after it): q's and k's rows in pair
    order (the Llama converter's permute), the norms' dims alike, the norms as q_norm / k_norm."""
    from safetensors.numpy import load_file, save_file
    d, weights = MAINCODER["head_dim"], load_file(hf / "model.safetensors")

    def pairs(w):                           # each head's rows [half 0 | half 1] -> [(0, 0), (1, 0), (0, 1), ...]
        return w.reshape(-1, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    out = {}
    for name, w in weights.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "layernorm.weight")) and ".self_attn." in name:
            w = pairs(w)
        out[name.replace("query_layernorm", "q_norm").replace("key_layernorm", "k_norm")] = np.ascontiguousarray(w)
    save_file(out, hf / "model.safetensors", metadata={"format": "pt"})
    _edit_json(hf / "config.json", lambda c: dict(c, model_type="maincoder", architectures=["MaincoderForCausalLM"]))


LING = dict(vocab_size=512, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
            attention_multiplier=0.25, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)


def _ling_released(hf) -> None:
    """test_ling_v1_as_the_converter_writes_it's Granite MoE Shared model as Ling v1's checkpoint (BailingMoe's
    names: word_embeddings, attention.query_key_value / dense, mlp.gate, each expert's gate / up / down, one shared
    expert of the shared MLP's width; norm_topk_prob, no leading dense layers)."""
    from safetensors.numpy import load_file, save_file
    weights, i, out = load_file(hf / "model.safetensors"), LING["intermediate_size"], {}
    for layer in range(LING["num_hidden_layers"]):
        k, a = f"model.layers.{layer}", f"model.layers.{layer}.self_attn"
        out[f"{k}.attention.query_key_value.weight"] = np.concatenate([weights.pop(f"{a}.{x}_proj.weight")
                                                                       for x in "qkv"])
        out[f"{k}.attention.dense.weight"] = weights.pop(f"{a}.o_proj.weight")
        out[f"{k}.mlp.gate.weight"] = weights.pop(f"{k}.block_sparse_moe.router.layer.weight")
        gate_up, down = (weights.pop(f"{k}.block_sparse_moe.{x}_linear.weight") for x in ("input", "output"))
        for j in range(LING["num_local_experts"]):
            e = f"{k}.mlp.experts.{j}"
            out.update({f"{e}.gate_proj.weight": gate_up[j, :i], f"{e}.up_proj.weight": gate_up[j, i:],
                        f"{e}.down_proj.weight": down[j]})
        shared, s = weights.pop(f"{k}.shared_mlp.input_linear.weight"), LING["shared_intermediate_size"]
        out.update({f"{k}.mlp.shared_experts.gate_proj.weight": shared[:s],
                    f"{k}.mlp.shared_experts.up_proj.weight": shared[s:],
                    f"{k}.mlp.shared_experts.down_proj.weight": weights.pop(f"{k}.shared_mlp.output_linear.weight")})
    out["model.word_embeddings.weight"] = weights.pop("model.embed_tokens.weight")
    out.update(weights)                 # the norms and the head
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, hf / "model.safetensors", metadata={"format": "pt"})
    _edit_json(hf / "config.json", lambda c: dict(
        c, model_type="bailing_moe", architectures=["BailingMoeForCausalLM"], num_experts=LING["num_local_experts"],
        moe_intermediate_size=i, num_shared_experts=LING["shared_intermediate_size"] // i, first_k_dense_replace=0,
        norm_topk_prob=True, head_dim=16, norm_head=False))


CODESHELL = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, use_bias=True, norm_epsilon=1e-5,
                 tie_word_embeddings=False, sliding_window=None, eos_token_id=2, bos_token_id=1)


def _codeshell_released(hf) -> None:
    """test_codeshell_as_the_converter_writes_it's StarCoder 2 model as CodeShell's checkpoint (its GPT-2-like
    names: transformer.wte / h.N.ln_1 / attn.c_attn (q, k, v) / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj / ln_f;
    its config's n_embd, n_head, num_query_groups, n_layer, n_positions, layer_norm_epsilon). The converter takes the
    MLP as 4 x n_embd wide and RoPE's base as 10000, as CodeShell's are."""
    from safetensors.numpy import load_file, save_file
    weights, out = load_file(hf / "model.safetensors"), {}
    names = {"self_attn.o_proj": "attn.c_proj", "input_layernorm": "ln_1", "post_attention_layernorm": "ln_2",
             "mlp.c_fc": "mlp.c_fc", "mlp.c_proj": "mlp.c_proj"}
    for layer in range(CODESHELL["num_hidden_layers"]):
        k, h = f"model.layers.{layer}", f"transformer.h.{layer}"
        for part in ("weight", "bias"):
            out[f"{h}.attn.c_attn.{part}"] = np.concatenate([weights.pop(f"{k}.self_attn.{x}_proj.{part}")
                                                             for x in "qkv"])
            out.update({f"{h}.{theirs}.{part}": weights.pop(f"{k}.{mine}.{part}") for mine, theirs in names.items()})
    out.update({"transformer.wte.weight": weights.pop("model.embed_tokens.weight"),
                "transformer.ln_f.weight": weights.pop("model.norm.weight"),
                "transformer.ln_f.bias": weights.pop("model.norm.bias"),
                "lm_head.weight": weights.pop("lm_head.weight")})
    assert not weights, sorted(weights)
    save_file(out, hf / "model.safetensors", metadata={"format": "pt"})
    c = CODESHELL
    _edit_json(hf / "config.json", lambda cfg: dict(
        {k: v for k, v in cfg.items() if k not in ("hidden_size", "num_attention_heads", "num_hidden_layers")},
        model_type="codeshell", architectures=["CodeShellForCausalLM"], n_embd=c["hidden_size"],
        n_head=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"], n_layer=c["num_hidden_layers"],
        n_positions=c["max_position_embeddings"], layer_norm_epsilon=c["norm_epsilon"]))


SMALLTHINKER_4B = dict(softmax=True, tied=False, rope_layout=[1] * 4, sliding_window_layout=[0] * 4)
CONVERTED_ONLY = {"chatglm": (_write("chatglm"), None, []), "qwen35-mtp": (_qwen35_with_mtp, None, []),
                  "llama-fused-qkv": (_write("llama"), None, ["--fuse-qkv"]),
                  "starcoder2-fused-qkv": (_write("starcoder2"), None, ["--fuse-qkv"]),
                  "cohere2moe-fused-gate-up": (_write("cohere2moe"), None, ["--fuse-gate-up-exps"]),
                  "llama-split": (_write("llama"), None, ["--split-max-tensors=8"]),
                  "laguna": (lambda hf: write_family("laguna", hf), None, []),
                  "deci": (lambda hf: __import__("test_deci").write_for_the_converter(hf), None, []),
                  "orion": (lambda hf: (__import__("test_orion").write_orion(hf, tokenizer=None),
                                        _sentencepiece_model(hf / "tokenizer.model")), None, []),
                  "step35": (lambda hf: __import__("test_step").write_released(
                      hf, __import__("test_step").CONVERTER_TEXT), None, []),
                  # OpenELM ships no tokenizer (Apple's use Llama 2's): a SentencePiece one beside it
                  "openelm": (lambda hf: (__import__("test_openelm").write_openelm(hf, tokenizer=None),
                                          _sentencepiece_model(hf / "tokenizer.model")), None, []),
                  "paddleocr-vl": (_paddleocr_vl, None, []),
                  # DeepSeek-OCR's language model in DeepSeek-OCR's released form
                  "deepseek-ocr": (lambda hf: __import__("test_vision_text").write_deepseek_ocr_released(hf), None,
                                   []),
                  "chameleon": (lambda hf: __import__("test_chameleon").write_for_the_converter(hf), None, []),
                  # openPangu-Embedded: Llama's layers with biases on q, k, v and o, its tokenizer SentencePiece's
                  "pangu": (lambda hf: (write_widened("LlamaForCausalLM", "LlamaConfig", PANGU, hf, seed=1),
                                        _sentencepiece_model(hf / "tokenizer.model")),
                            lambda hf: _edit_json(hf / "config.json", lambda c: dict(
                                c, architectures=["PanguEmbeddedForCausalLM"])), []),
                  "deepseek-moe": (lambda hf: __import__("test_deepseek_moe").write_deepseek_moe(hf), None, []),
                  # XVERSE: Llama's layers (its converter un-permutes q/k as for heads == kv heads, as XVERSE's are)
                  "xverse": (lambda hf: write_widened("LlamaForCausalLM", "LlamaConfig", XVERSE, hf, seed=1),
                             lambda hf: _xverse_released(hf), []),
                  "hrm-text": (lambda hf: __import__("test_hrm_text").write_hrm(hf), None, []),
                  # CodeShell: StarCoder 2's layers under GPT-2-like names
                  "codeshell": (lambda hf: write_widened("Starcoder2ForCausalLM", "Starcoder2Config", CODESHELL, hf,
                                                         seed=1), _codeshell_released, []),
                  # Ling v1: Granite MoE Shared's model under BailingMoe's names (its routing is Granite's)
                  "bailingmoe": (lambda hf: write_widened("GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig", LING,
                                                          hf, seed=1), _ling_released, []),
                  # Maincoder: Hunyuan dense's layers as llama.cpp reads its checkpoints (RoPE on adjacent pairs)
                  "maincoder": (lambda hf: write_widened("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config",
                                                         MAINCODER, hf, seed=1), _maincoder_released, []),
                  # CogVLM: Phi-3's layers as its language expert's (a vision expert's beside them)
                  "cogvlm": (lambda hf: write_widened("Phi3ForCausalLM", "Phi3Config", COGVLM, hf, seed=1),
                             _cogvlm_released, []),
                  # JAIS: GPT-2's layers with SwiGLU, ALiBi and muP scales (its own code; a PyTorch reference of it)
                  "jais": (lambda hf: __import__("test_jais").write_jais(hf), None, []),
                  # Refact: Llama's layers with ALiBi and one KV head (its own code; a PyTorch reference of it)
                  "refact": (lambda hf: __import__("test_baichuan").write_refact(hf), None, []),
                  # Nanbeige 4.2: Llama's layers run in loops (num_loops, skip_loop_final_norm in its config)
                  "nanbeige": (lambda hf: __import__("test_nanbeige").write_nanbeige(hf, loops=2), None, []),
                  # SmallThinker: experts routed from the layer's input (its own code; a PyTorch reference of it),
                  # the 21B's layout (sigmoid routing, a window), the 4B's (softmax, none, an untied head)
                  "smallthinker": (lambda hf: __import__("test_smallthinker").write_smallthinker(hf), None, []),
                  "smallthinker-4b": (lambda hf: __import__("test_smallthinker").write_smallthinker(
                      hf, **SMALLTHINKER_4B), None, []),
                  # PLM: Youtu's latent attention with an ungated squared-ReLU MLP (its own code; the reference
                  # transformers' Youtu with that MLP)
                  "plm": (lambda hf: __import__("test_plm").write_plm(hf), None, []),
                  "muse-glimmer": (lambda hf: write_widened(*_muse_glimmer_case(), hf, seed=1), None, []),
                  "hunyuan-vl": (lambda hf: write_widened("HunYuanVLForConditionalGeneration", "HunYuanVLConfig",
                                                          HUNYUAN_VL, hf, seed=1), None, []),
                  # Laguna-M.1's released config sets no window (transformers' default, 512, the converter writes)
                  "laguna-m1": (lambda hf: write_family("laguna-m1", hf), lambda hf: _edit_json(
                      hf / "config.json", lambda c: {k: v for k, v in c.items() if k != "sliding_window"}), [])}


def _release(case: str, hf) -> None:
    """The case's folder as its released checkpoint has it, where the converter needs that."""
    if case in RELEASED:
        _edit_json(hf / "config.json", RELEASED[case])
    if case in TOKENIZER_CONFIG:
        _edit_json(hf / "tokenizer_config.json", lambda c: dict(c, **TOKENIZER_CONFIG[case]))
    if case in SENTENCEPIECE:
        _sentencepiece_model(hf / "tokenizer.model")
    if case in ADDED_TOKENS:
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
        tokenizer.add_special_tokens({"additional_special_tokens": ADDED_TOKENS[case]})
        tokenizer.save_pretrained(hf)


def _edit_json(path, edit) -> None:
    """A JSON file rewritten as `edit` (its dict -> the new dict) makes it."""
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _sentencepiece_model(path, vocab_size: int = 300) -> None:
    """A small SentencePiece BPE model (fewer pieces than the test models' 512 rows: the converter pads the rest)."""
    import random

    import sentencepiece
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "kiln", "compiler", "hello", "world"]
    rng = random.Random(0)
    corpus = path.with_suffix(".txt")
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)))
    prefix = path.with_suffix("")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size,
                                             byte_fallback=True, character_coverage=1.0, minloglevel=2,
                                             model_type="bpe")
    corpus.unlink()
    prefix.with_suffix(".vocab").unlink()


def _fields(reader: gguf.GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith(("tokenizer.", "general.", "GGUF."))}


@pytest.mark.parametrize("case", TAKEN + list(HYBRIDS))
def test_the_writer_writes_what_llama_cpps_converter_writes(case, converted, tmp_path):
    theirs, mine = (gguf.GGUFReader(path) for path in converted[case][::-1])
    ta, tb = ({t.name: t for t in r.tensors} for r in (theirs, mine))
    assert sorted(ta) == sorted(set(tb) - EXTRA_TENSORS.get(case, set()))
    for name, t in ta.items():
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        y = np.asarray(gguf.quants.dequantize(tb[name].data, tb[name].tensor_type), np.float32)
        assert x.shape == y.shape and np.array_equal(x, y), name
    a, b = _fields(theirs), _fields(mine)
    known = KNOWN.get(case, set())
    differ = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys()
              if not _same(a.get(k), b.get(k)) and k.split(".", 1)[-1] not in known}
    assert not differ, f"metadata (llama.cpp's, the writer's): {differ}"


def _same(x, y) -> bool:
    """Equal metadata values, floats as float32 (the file's)."""
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    if isinstance(x, float) or isinstance(y, float):
        return x is not None and y is not None and np.float32(x) == np.float32(y)
    return x == y


def test_chatglm_hf_as_the_converter_writes_it(converted, tmp_path):
    """A GLM-4-9B-chat-hf GGUF (transformers' Glm through the converter's ChatGLMModel): q, k and v apart with their
    biases, the norms' epsilon ChatGLM's default 1e-5 (the converter reads ChatGLM's own key, layernorm_epsilon) and
    the width as the context; kiln runs what the file says, transformers' logits with that epsilon."""
    theirs = converted["chatglm"][1]
    ref = transformers.AutoModelForCausalLM.from_pretrained(theirs.parent / "hf", dtype=torch.float32,
                                                            rms_norm_eps=1e-5).eval()
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_qwen35_with_its_mtp_layer_as_the_converter_writes_it(converted, tmp_path):
    """A Qwen3.5 GGUF from a released checkpoint keeps its multi-token-prediction layer (block_count one more than the
    model's layers, nextn_predict_layers 1, attention.recurrent_layers one longer): kiln leaves it unread and gives
    transformers' logits (it ran the block as a fifth decoder layer before)."""
    import test_qwen3_5
    theirs = converted["qwen35-mtp"][1]
    reader = gguf.GGUFReader(theirs)
    assert reader.fields["qwen35.nextn_predict_layers"].contents() == 1
    ref = transformers.AutoModelForCausalLM.from_pretrained(theirs.parent / "hf", dtype=torch.float32).eval()
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, test_qwen3_5.IDS[:12], test_qwen3_5.CHUNKED)


@pytest.mark.parametrize("case, fused", [("llama-fused-qkv", "blk.0.attn_qkv.weight"),
                                         ("starcoder2-fused-qkv", "blk.0.attn_qkv.weight"),
                                         ("cohere2moe-fused-gate-up", "blk.1.ffn_gate_up_exps.weight")])
def test_fused_tensors_as_the_converter_writes_them(case, fused, converted, tmp_path):
    """The converter's --fuse-qkv (any architecture with an attn_qkv kind; llama.cpp runs either): q, k and v in one
    attn_qkv, each as the architecture stores it apart (Llama's q and k permuted; StarCoder 2's biases, by which kiln
    knows it has them), read back as q_proj / k_proj / v_proj; --fuse-gate-up-exps: each expert's gate rows, then its
    up rows, in one ffn_gate_up_exps, read back as its gate_proj and up_proj."""
    theirs = converted[case][1]
    assert fused in {t.name for t in gguf.GGUFReader(theirs).tensors}
    ref = transformers.AutoModelForCausalLM.from_pretrained(theirs.parent / "hf", dtype=torch.float32).eval()
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_a_split_gguf_is_read_from_its_first_file(converted, tmp_path):
    """--split-max-tensors (llama.cpp's gguf-split alike): llama-00001-of-0000N.gguf holds the metadata and some
    tensors, the others the rest; kiln reads every part from the first, and names the first where given another, and
    the missing part where one is not beside it, and a part under another's name."""
    import shutil
    from kiln.models.gguf import load_gguf
    from kiln.models.source import ModelLoadError
    parts = sorted(converted["llama-split"][1].parent.glob("llama-*-of-*.gguf"))
    assert len(parts) == 3
    ref = transformers.AutoModelForCausalLM.from_pretrained(parts[0].parent / "hf", dtype=torch.float32).eval()
    art = kiln.compile(str(parts[0]), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    with pytest.raises(ModelLoadError, match=r"part 2 of a GGUF split into 3 files; pass the first, "
                                                  r"llama-00001-of-00003\.gguf"):
        load_gguf(parts[1])
    for part in parts[:2]:
        shutil.copy(part, tmp_path / part.name)
    with pytest.raises(ModelLoadError, match=r"llama-00003-of-00003\.gguf is not beside it"):
        load_gguf(tmp_path / parts[0].name)
    shutil.copy(parts[2], tmp_path / parts[1].name)          # the third part under the second's name
    with pytest.raises(ModelLoadError, match=r"llama-00002-of-00003\.gguf is not part 2 of llama-00001-of-00003"):
        load_gguf(tmp_path / parts[0].name)


def test_laguna_as_the_converter_writes_it(converted, tmp_path):
    """Laguna-XS.2's shape through the converter (tests/numerics/test_families.py's case: which the test writer does
    not write): a query head count a layer as head_count's array, each layer kind's RoPE (YaRN on half of each head on
    the full layer, rope.*_swa on the sliding ones), the gate a head as attn_gate; llama.cpp's pattern (every 4th layer
    full from the first) where the file writes none. The router's logit cap is written nowhere and llama.cpp applies
    none: kiln reads the file as llama.cpp runs it, transformers' model without the cap. Laguna-M.1's (no window, a gate
    a value dim, two dense layers) is read as its config says."""
    from kiln.models.gguf import load_gguf
    theirs = converted["laguna"][1]
    assert gguf.GGUFReader(theirs).fields["laguna.attention.head_count"].contents() == [4, 8, 2]
    ref = transformers.AutoModelForCausalLM.from_pretrained(theirs.parent / "hf", dtype=torch.float32,
                                                            moe_router_logit_softcapping=0.0).eval()
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    m1 = load_gguf(converted["laguna-m1"][1]).hf_config
    assert m1["gating"] == "per-element" and m1["layer_types"] == ["full_attention"] * 3
    assert m1["mlp_layer_types"] == ["dense", "dense", "sparse"] and m1["num_attention_heads_per_layer"] == [4] * 3


def test_nemotron_nas_as_the_converter_writes_it(converted, tmp_path):
    """Nemotron-NAS (tests/numerics/test_deci.py's layers) through the converter: head_count, head_count_kv and
    feed_forward_length a value a layer (0 query heads: no attention; 0 KV heads: the Linear in its place, stored as
    attn_output; 0 width: no MLP), each layer's k rows permuted by its own KV heads."""
    import test_deci
    theirs = converted["deci"][1]
    fields = gguf.GGUFReader(theirs).fields
    assert fields["deci.attention.head_count_kv"].contents() == [2, 1, 0, 0, 4]
    assert fields["deci.feed_forward_length"].contents() == [256, 0, 768, 256, 256]
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_deci.reference(test_deci.CONVERTER_CONFIG), test_deci.IDS, test_deci.TOL)


def test_openelm_as_the_converter_writes_it(converted, tmp_path):
    """OpenELM (tests/numerics/test_openelm.py's) through the converter: heads, KV heads and MLP widths a value a
    layer, proj_1 split into ffn_gate / ffn_up (joined back), the head the embedding."""
    import test_openelm
    theirs = converted["openelm"][1]
    fields = gguf.GGUFReader(theirs).fields
    assert fields["openelm.attention.head_count"].contents() == [2, 4, 6]
    assert fields["openelm.feed_forward_length"].contents() == [32, 128, 256]
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_openelm.reference(test_openelm.CONFIG), test_openelm.IDS,
                                    test_openelm.TOL)


def test_step35_as_the_converter_writes_it(converted, tmp_path):
    """Step-3.5-Flash's released form (tests/numerics/test_step.py's) through the converter: head_count a layer, the
    sliding layers by sliding_window_pattern, the experts stacked as released, the SwiGLU clamps a layer, the norms
    stored + 1, its multi-token-prediction layer counted in block_count."""
    import test_step
    theirs = converted["step35"][1]
    fields = gguf.GGUFReader(theirs).fields
    assert fields["step35.attention.head_count"].contents()[:4] == [4, 8, 8, 4]
    assert fields["step35.nextn_predict_layers"].contents() == 1
    ref = test_step.write_released(tmp_path / "ref", test_step.CONVERTER_TEXT)
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, test_step.IDS, test_step.TOL)


def test_orion_as_the_converter_writes_it(converted, tmp_path):
    """Orion (tests/numerics/test_orion.py's) through the converter: the LayerNorms' biases, q and k as stored."""
    import test_orion
    theirs = converted["orion"][1]
    assert "blk.0.attn_norm.bias" in {t.name for t in gguf.GGUFReader(theirs).tensors}
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_orion.write_orion(tmp_path / "ref", tokenizer=None), test_orion.IDS,
                                    test_orion.TOL)


def test_paddleocr_vl_as_the_converter_writes_it(converted, tmp_path):
    """PaddleOCR-VL through the converter: its language model (arch paddleocr: Ernie's biased projections, q and k
    as stored for RoPE over halves) gives the wrapper's own logits on text."""
    theirs = converted["paddleocr-vl"][1]
    assert {"blk.0.attn_q.bias", "blk.0.ffn_up.bias"} <= {t.name for t in gguf.GGUFReader(theirs).tensors}
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = transformers.PaddleOCRVLForConditionalGeneration.from_pretrained(theirs.parent / "hf",
                                                                                 attn_implementation="eager")
    assert_prefill_and_decode_match(art, reference.eval(), IDS, TOL)


def test_hunyuan_ocr_as_the_converter_writes_it(converted, tmp_path):
    """HunyuanOCR through the converter: its language model (arch hunyuan_vl: the XD-RoPE base and its NTK alpha
    written apart, joined as HunYuan's) gives the wrapper's own logits on text."""
    theirs = converted["hunyuan-vl"][1]
    assert gguf.GGUFReader(theirs).fields["hunyuan_vl.rope.scaling.alpha"].contents() == 1000.0
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = transformers.HunYuanVLForConditionalGeneration.from_pretrained(theirs.parent / "hf",
                                                                               attn_implementation="eager")
    assert_prefill_and_decode_match(art, reference.eval(), IDS, TOL)


def test_deepseek_ocr_as_the_converter_writes_it(converted, tmp_path):
    """DeepSeek-OCR through the converter: its language model (arch deepseek2-ocr: DeepSeek-V2's experts under
    multi-head attention, RoPE on halves) gives transformers' DeepSeek-OCR 2 logits for the same text model."""
    theirs = converted["deepseek-ocr"][1]
    assert gguf.GGUFReader(theirs).fields["general.architecture"].contents() == "deepseek2-ocr"
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = write_widened(*__import__("test_vision_text").deepseek_ocr_case(), tmp_path / "ref", seed=1)
    assert_prefill_and_decode_match(art, reference, IDS, TOL)


def test_muse_glimmer_as_the_converter_writes_it(converted, tmp_path):
    """Muse Glimmer through the converter (arch muse-glimmer: its layer norms stored + 1, q/k rows permuted, q_norm /
    k_norm synthesized as the q scale and ones, the output multiplier as logit_scale): the wrapper's own logits."""
    theirs = converted["muse-glimmer"][1]
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = transformers.MuseGlimmerForConditionalGeneration.from_pretrained(theirs.parent / "hf",
                                                                                 attn_implementation="eager")
    assert_prefill_and_decode_match(art, reference.eval(), IDS, TOL)


def test_hrm_text_as_the_converter_writes_it(converted, tmp_path):
    """HRM-Text through the converter (arch hrm_text: the cache's slots as block_count, the two stacks' layers as the
    blocks, gate / q / k / v apart, hrm.z_l_init): transformers' logits."""
    import test_hrm_text
    theirs = converted["hrm-text"][1]
    assert "hrm.z_l_init" in {t.name for t in gguf.GGUFReader(theirs).tensors}
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_hrm_text.write_hrm(tmp_path / "ref"), IDS, TOL)



def test_chameleon_as_the_converter_writes_it(converted, tmp_path):
    """Chameleon through the converter (arch chameleon: q/k rows permuted, q_norm / k_norm in llama.cpp's pair order,
    the image tokens named in the vocabulary): transformers' logits, the image tokens' the lowest."""
    import test_chameleon
    theirs = converted["chameleon"][1]
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = test_chameleon.write_for_the_converter(tmp_path / "ref")
    assert len(reference.model.vocabulary_mapping.image_tokens) == 8
    assert_prefill_and_decode_match(art, reference, IDS, TOL)


def test_deepseek_moe_as_the_converter_writes_it(converted, tmp_path):
    """DeepSeek-MoE through the converter (arch deepseek: q/k rows permuted, the experts stacked, the shared experts
    as one MLP, leading dense blocks): the logits of transformers' class for its layers (test_deepseek_moe)."""
    import test_deepseek_moe
    theirs = converted["deepseek-moe"][1]
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = write_widened(*test_deepseek_moe.deepseek_moe_case(), tmp_path / "ref", seed=1)
    assert_prefill_and_decode_match(art, reference, IDS, TOL)


# case -> (its GGUF architecture, the transformers class (and config class, config) computing it over the same weights)
READ_AS_STAND_IN = {
    # XVERSE: Llama's tensors, q/k rows permuted as Meta's; read as Llama
    "xverse": ("xverse", "LlamaForCausalLM", "LlamaConfig", XVERSE),
    # openPangu-Embedded: Llama's tensors unpermuted, q/k/v/o biases; read as Llama with attention_bias
    "pangu": ("pangu-embedded", "LlamaForCausalLM", "LlamaConfig", PANGU),
    # CodeShell: c_attn as attn_qkv with its bias, LayerNorms with biases, RoPE on halves; read as StarCoder 2 with
    # biases
    "codeshell": ("codeshell", "Starcoder2ForCausalLM", "Starcoder2Config", CODESHELL),
    # Ling v1: q/k/v split from query_key_value and permuted, the experts stacked, the shared experts as ffn_*_shexp,
    # expert_weights_norm; read as Granite MoE Shared
    "bailingmoe": ("bailingmoe", "GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig", LING),
    # Maincoder: q/k rows as stored, which llama.cpp rotates as adjacent pairs before the q/k norms; read as Hunyuan
    # dense with those rows and the norms' dims in rotate-half order (the checkpoint: that model's weights laid out so)
    "maincoder": ("maincoder", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", MAINCODER),
    # CogVLM / CogVLM2: the language expert's fused q/k/v (as stored: RoPE on halves) and MLP, the vision expert's
    # tensors unread (a text prompt never takes them); read as Phi-3 (q/k/v fused, gate and up joined)
    "cogvlm": ("cogvlm", "Phi3ForCausalLM", "Phi3Config", COGVLM),
}


@pytest.mark.parametrize("case", list(READ_AS_STAND_IN))
def test_families_read_as_another_as_the_converter_writes_them(case, converted, tmp_path):
    """A family llama.cpp converts under an architecture of its own that kiln reads as a transformers family computing
    the same (READ_AS_STAND_IN): that class's logits over the same weights."""
    arch, model_cls, config_cls, config = READ_AS_STAND_IN[case]
    theirs = converted[case][1]
    assert gguf.GGUFReader(theirs).fields["general.architecture"].contents() == arch
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = write_widened(model_cls, config_cls, config, tmp_path / "ref", seed=1)
    assert_prefill_and_decode_match(art, reference, IDS, TOL)


def test_jais_as_the_converter_writes_it(converted, tmp_path):
    """JAIS through the converter (arch jais: Conv1D weights transposed, c_fc2 as ffn_gate, muP's embedding and output
    scales folded into those tensors, max_alibi_bias): the PyTorch reference of its code (test_jais.JaisReference)."""
    import test_jais
    theirs = converted["jais"][1]
    assert gguf.GGUFReader(theirs).fields["general.architecture"].contents() == "jais"
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_jais.write_jais(tmp_path / "ref"), test_jais.IDS, TOL)


def test_refact_as_the_converter_writes_it(converted, tmp_path):
    """Refact through the converter (arch refact: q, attn.kv split into k and v (one KV head), gate_up_proj split,
    ALiBi in llama.cpp's graph): read as Baichuan's ALiBi form; the PyTorch reference of its code
    (test_baichuan.RefactReference) over the same tensors."""
    import test_baichuan
    theirs = converted["refact"][1]
    assert gguf.GGUFReader(theirs).fields["general.architecture"].contents() == "refact"
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    reference = test_baichuan.write_refact(tmp_path / "ref")
    assert_prefill_and_decode_match(art, reference, test_baichuan.IDS, TOL)


@pytest.mark.parametrize("case", ["smallthinker", "smallthinker-4b"])
def test_smallthinker_as_the_converter_writes_it(case, converted, tmp_path):
    """SmallThinker through the converter (arch smallthinker: the experts stacked, the router as ffn_gate_inp, its
    gating as expert_gating_func, the window where a layer slides; the layer kinds and NoPE layers llama.cpp's
    graph's): the PyTorch reference of its code (test_smallthinker.SmallThinkerReference) over the same tensors."""
    import test_smallthinker
    theirs = converted[case][1]
    fields = gguf.GGUFReader(theirs).fields
    assert fields["general.architecture"].contents() == "smallthinker"
    assert ("smallthinker.attention.sliding_window" in fields) == (case == "smallthinker")
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    layout = SMALLTHINKER_4B if case == "smallthinker-4b" else {}
    reference = test_smallthinker.write_smallthinker(tmp_path / "ref", **layout)
    assert_prefill_and_decode_match(art, reference, test_smallthinker.IDS, TOL)


def test_plm_as_the_converter_writes_it(converted, tmp_path):
    """PLM through the converter (arch plm: its tensors as named, kv_b_proj whole, the latent's sizes as kv_lora_rank /
    key_length / value_length / rope.dimension_count, the head tied): transformers' Youtu attention with PLM's MLP
    (test_plm.py's reference) over the same weights."""
    import test_plm
    theirs = converted["plm"][1]
    assert gguf.GGUFReader(theirs).fields["general.architecture"].contents() == "plm"
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, test_plm.write_plm(tmp_path / "ref"), test_plm.IDS, TOL)


def test_nanbeige_as_the_converter_writes_it(converted, tmp_path):
    """Nanbeige 4.2 through the converter (arch nanbeige: Llama's tensors, q/k rows permuted, num_loops and
    skip_loop_final_norm): its looped Llama's logits (test_nanbeige.py's reference), and `kiln check` compares the
    GGUF with transformers' Llama over its tensors run in those loops (its STAND_IN, compiler/golden.py looped)."""
    import test_nanbeige
    theirs = converted["nanbeige"][1]
    fields = gguf.GGUFReader(theirs).fields
    assert fields["general.architecture"].contents() == "nanbeige" and fields["nanbeige.num_loops"].contents() == 2
    art = kiln.compile(str(theirs), target="cpu", quant="q0f32", output=tmp_path / "art")
    reference = test_nanbeige.write_nanbeige(tmp_path / "ref", loops=2)
    assert_prefill_and_decode_match(art, reference, test_nanbeige.IDS, TOL)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
