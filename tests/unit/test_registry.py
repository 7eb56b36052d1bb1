"""The family registry: lookups by config.json fields, the unknown-architecture error, `kiln models`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.models import ModelLoadError, find_architecture
from kiln.models.registry import ARCHITECTURES

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("hf, family", [
    ({"architectures": ["MistralForCausalLM"]}, "llama"),
    ({"model_type": "qwen3"}, "qwen3"),
    ({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}, "gemma3"),
    ({"model_type": "gemma3_text"}, "gemma3"),
    ({"architectures": ["GPT2LMHeadModel"]}, "gpt2"),
    ({"architectures": ["Phi3ForCausalLM"]}, "phi3"),
    ({"architectures": ["GraniteForCausalLM"]}, "granite"),
    ({"model_type": "olmo2"}, "olmo2"),
    ({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3"}, "smollm3"),
    ({"architectures": ["StableLmForCausalLM"]}, "stablelm"),
    ({"architectures": ["Starcoder2ForCausalLM"]}, "starcoder2"),
    ({"architectures": ["PhiForCausalLM"], "model_type": "phi"}, "phi"),
    ({"model_type": "gpt_neox"}, "gpt_neox"),
    ({"architectures": ["MixtralForCausalLM"]}, "mixtral"),
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe"}, "qwen2_moe"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}, "qwen3_moe"),
    ({"model_type": "olmoe"}, "olmoe"),
    ({"architectures": ["InternLM3ForCausalLM"], "model_type": "internlm3"}, "internlm3"),
    ({"architectures": ["IQuestCoderForCausalLM"], "model_type": "iquestcoder"}, "llama"),
    ({"model_type": "ministral"}, "llama"),
    ({"architectures": ["HunYuanDenseV1ForCausalLM"]}, "hunyuan_v1_dense"),
    ({"model_type": "granitemoeshared"}, "granitemoeshared"),
    ({"architectures": ["ExaoneForCausalLM"], "model_type": "exaone"}, "exaone"),
    ({"architectures": ["MellumForCausalLM"], "model_type": "mellum"}, "mellum"),
    ({"architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3"}, "hy_v3"),
    ({"architectures": ["MiniCPM5MoEForCausalLM"]}, "minicpm5_moe"),           # the released config's spelling
    ({"architectures": ["AfmoeForCausalLM"], "model_type": "afmoe"}, "afmoe"),
    ({"architectures": ["Kolibri1ForCausalLM"], "model_type": "kolibri1"}, "kolibri1"),
    ({"architectures": ["DbrxForCausalLM"]}, "dbrx"),
    ({"architectures": ["Glm4MoeForCausalLM"], "model_type": "sarvam_moe"}, "sarvam_moe"),    # as transformers saves it
    ({"architectures": ["Glm4MoeForCausalLM"], "model_type": "param2moe"}, "param2moe"),
    # transformers 5 saves EXAONE 3 so (its tensors under EXAONE's names): model_type decides, as in transformers
    ({"architectures": ["LlamaForCausalLM"], "model_type": "exaone"}, "exaone"),
])
def test_find_architecture(hf, family):
    assert find_architecture(hf).name == family


def test_unknown_architecture_lists_every_family_and_its_names():
    with pytest.raises(ModelLoadError) as e:
        find_architecture({"architectures": ["RetNetForCausalLM"]})
    msg = str(e.value)
    assert msg.startswith("unknown architecture: RetNetForCausalLM. Supported: ")
    for a in ARCHITECTURES.values():
        assert a.name in msg and a.hf_architectures[0] in msg
    assert "GGUF llama" in msg


@pytest.mark.parametrize("model_type, reason", [
    ("xglm", r"XGLM \(xglm\) .* sinusoidal position embeddings"),
    ("openai-gpt", r"GPT-1 \(openai-gpt\) .*\(post-LN\)"),
    ("minimax", "MiniMax-Text-01 .* linear-attention layers"),
    ("zamba", r"Zamba \(zamba\) .* Mamba state-space layers"),
    ("deepseek_v4", r"DeepSeek-V4 \(deepseek_v4\) .* compressed sparse attention"),
    ("qwen4_exp_text", r"Qwen4-Exp \(qwen4_exp_text\) .* hyper-connections"),
    ("unlimited_ocr", r"Unlimited-OCR \(unlimited_ocr\) .* reference sliding-window attention"),
    ("hy_v4_vl", r"HY V4 VL \(hy_v4_vl\) .* sparse attention"),
    ("glm5_next", r"GLM-5-Next \(glm5_next\) .* hyper-connections"),
    ("mistral_large4_text", r"Mistral Large 4 \(mistral_large4_text\) .* an earlier layer's latent KV cache"),
    ("gemma4_assistant", r"Gemma 4 assistant \(gemma4_assistant\) .* compile the Gemma 4 it drafts for"),
    ("inkling_text", r"Inkling \(inkling_text\) .* relative position bias"),
    ("inkling2_loop", r"Inkling 2 Loop \(inkling2_loop\) .* layers run in loops"),
    ("roberta", r"RoBERTa \(roberta\) .* encoder .*not a causal language model"),
    ("bart", r"BART \(bart\) .* encoder-decoder layout"),
    ("blt", r"Byte Latent Transformer \(blt\) .* dynamic patches"),
    ("cpmant", r"CPM-Ant \(cpmant\) .* bucketed distance"),
    ("blip-2", r"BLIP-2 \(blip-2\) .* Q-Former's query tokens .* compile that checkpoint"),
    ("pi0", r"pi0 \(pi0\) .* robot actions"),
])
def test_known_families_kiln_cannot_run_are_refused_with_the_reason(model_type, reason):
    with pytest.raises(ModelLoadError, match=reason) as e:
        find_architecture({"architectures": ["SomethingForCausalLM"], "model_type": model_type})
    assert str(e.value).endswith("`kiln models` lists the families kiln compiles")


def test_kiln_models_lists_families():
    out = CliRunner().invoke(main, ["models", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [r["family"] for r in rows] == list(ARCHITECTURES)
    assert next(r for r in rows if r["family"] == "qwen2")["gguf_architectures"] == ["qwen2", "qwen2vl"]
    text = CliRunner().invoke(main, ["models"]).output.splitlines()
    assert len(text) == len(ARCHITECTURES) + 1          # the vision-language wrappers read as their language model
    assert "LlavaForConditionalGeneration" in text[-1] and "MllamaForConditionalGeneration" in text[-1]


BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
ROUTED = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
MLA = dict(ROUTED, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


@pytest.mark.parametrize("hf, message", [
    (dict(BASE, model_type="stablelm", use_parallel_residual=True), "use_parallel_residual is not supported"),
    (dict(BASE, model_type="stablelm", qk_layernorm=True), "qk_layernorm is not supported"),
    (dict(BASE, model_type="smollm3", use_sliding_window=True, sliding_window=64), "use_sliding_window"),
    (dict(BASE, model_type="smollm3", no_rope_layers=[1, 1, 0]), "no_rope_layers must hold 1 .* 4 layers"),
    (dict(BASE, model_type="phi3", partial_rotary_factor=0.1), "partial_rotary_factor 0.1 gives 1.6 rotary dims"),
    (dict(BASE, model_type="phi", qk_layernorm=True), "qk_layernorm is not supported"),
    (dict(BASE, model_type="gpt_neox", hidden_act="relu"), "hidden_act 'relu' is not supported for gpt_neox"),
    (dict(BASE, model_type="olmoe", num_experts=4, num_experts_per_tok=2, clip_qkv=8.0), "clip_qkv is not supported"),
    (dict(BASE, model_type="iquestcoder", clip_qkv=8.0), "llama with clip_qkv is not supported"),
    (dict(BASE, model_type="hunyuan_v1_dense", use_cla=True), "use_cla"),
    (dict(BASE, model_type="hunyuan_v1_dense", rope_scaling={"type": "dynamic", "factor": 2.0}),
     "'dynamic' without 'alpha'"),
    (dict(BASE, model_type="exaone4", sliding_window=64, sliding_window_pattern="LLXG"), "string of L and G"),
    (dict(BASE, model_type="olmo3", rope_parameters={"full_attention": {"rope_theta": 1e4},
                                                     "sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
     "sliding_attention type 'linear' is not supported"),
    (dict(BASE, model_type="llama4_text", intermediate_size_mlp=128, no_rope_layers=[1, 0]),
     "no_rope_layers lists 2 layers for 4"),
    (dict(BASE, model_type="deepseek_v2", **MLA, topk_method="noaux_tc"), "topk_method 'noaux_tc' is not supported"),
    (dict(BASE, model_type="deepseek_v2", **MLA, moe_layer_freq=2), "moe_layer_freq other than 1"),
    (dict(BASE, model_type="granitemoehybrid", layer_types=["mamba", "attention", "conv", "mamba"]),
     "layer_types must list 'mamba' or 'attention'"),
    (dict(BASE, model_type="granitemoehybrid", layer_types=["mamba"] * 4, mamba_n_heads=5), "mamba_n_heads .5. must "
     "divide"),
    (dict(BASE, model_type="nemotron_h", hybrid_override_pattern="M*-X"), "block 'X' is not supported"),
    (dict(BASE, model_type="nemotron_h", hybrid_override_pattern="M*-E", moe_latent_size=16),
     "latent space .moe_latent_size"),
    (dict(BASE, model_type="minimax_m2", **ROUTED, use_routing_bias=False), "use_routing_bias false"),
    (dict(BASE, model_type="ernie4_5_moe", moe_num_experts=[8, 8], moe_k=2, moe_intermediate_size=32),
     "list for num_experts .* load a text model"),
    (dict(BASE, model_type="hunyuan_v1_moe", num_experts=8, moe_topk=[2, 2]), "moe_topk lists 2 values for 4 layers"),
    (dict(BASE, model_type="exaone_moe", **ROUTED, mlp_layer_types=["dense", "moe", "sparse", "sparse"]),
     "mlp_layer_types must list 'dense' or 'sparse'"),
    (dict(BASE, model_type="deepseek_ocr2_text", **ROUTED, topk_method="noaux_tc"),
     "deepseek_ocr2_text topk_method 'noaux_tc' is not supported"),
    (dict(BASE, model_type="ernie4_5_vl_moe_text", moe_num_experts=8, moe_k=2, moe_intermediate_size=[32, 16],
          mlp_layer_types=["dense", "sparse", "dense", "sparse"]), r"sparse layers \[1, 3\] .* not one run"),
    (dict(BASE, model_type="cohere_compass_text", rope_parameters={"full_attention": {"rope_theta": 1e4},
                                                                   "sliding_attention": {"rope_theta": 1e4}}),
     "RoPE on its full-attention layers"),
    (dict(BASE, model_type="molmo2_text", qk_norm_type="gemma"), "qk_norm_type 'gemma' is not supported"),
    (dict(BASE, model_type="muse_glimmer_text", hidden_activation="gelu"), "hidden_activation 'gelu'"),
    (dict(BASE, model_type="hrm_text", num_key_value_heads=4, attention_bias=True), "HRM-Text with attention_bias"),
    (dict(BASE, model_type="chameleon", rms_norm_eps=1e-6), "Chameleon with rms_norm_eps 1e-06"),
    (dict(BASE, model_type="muse_spark_text", num_local_experts=8, num_experts_per_tok=2,
          mlp_layer_types=["dense", "moe", "sparse", "sparse"]), "mlp_layer_types must give 'dense' or 'sparse'"),
    (dict(BASE, model_type="jetmoe", kv_channels=16, num_local_experts=4, num_experts_per_tok=2,
          activation_function="tanh"), "JetMoE with activation_function 'tanh'"),
])
def test_a_config_kiln_cannot_build_is_refused_naming_the_field(hf, message):
    arch = find_architecture(hf)
    with pytest.raises(ValueError, match=message):
        arch.config_cls.from_hf(hf)


def test_smollm3_layers_without_rope_and_partial_rotary_are_read():
    from kiln.models.causal_lm import rope_in_graph
    c = find_architecture(dict(BASE, model_type="smollm3")).config_cls.from_hf(dict(BASE, model_type="smollm3"))
    assert [a.rope for a in c.layer_attention()] == [True, True, True, False]    # transformers' interval: 4
    assert rope_in_graph(c.layer_attention()) and c.tie_word_embeddings
    hf = dict(BASE, model_type="stablelm", rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.25})
    c = find_architecture(hf).config_cls.from_hf(hf)
    assert (c.rotary_dim, c.rope_scaling, c.flags().norm) == (4, None, "layer")


def test_partial_rotary_with_every_layer_sliding_takes_the_kv_cache_kiln_owns():
    from kiln.models.causal_lm import CausalLM
    hf = dict(BASE, model_type="phi3", partial_rotary_factor=0.5, sliding_window=64)
    model = CausalLM(find_architecture(hf).config_cls.from_hf(hf))
    assert "partial_rotary_factor" in model.tvm_cache_problem()            # auto: kiln's cache
    with pytest.raises(ValueError, match="partial_rotary_factor.*with --kv-cache kiln"):
        _ = model.window_mode
    model.own_kv_cache(16)
    assert model.window_mode is None and model.owned_layout.windows == (64,) * model.config.num_hidden_layers



def test_moe_layers():
    hf = dict(BASE, model_type="qwen2_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=64, decoder_sparse_step=2, mlp_only_layers=[3])
    c = find_architecture(hf).config_cls.from_hf(hf)
    specs = [c.layer_moe(i) for i in range(4)]
    assert [s is not None for s in specs] == [False, True, False, False]    # every 2nd layer, not layer 3
    assert (specs[1].num_experts, specs[1].top_k, specs[1].shared_intermediate_size) == (8, 2, 64)
    with pytest.raises(ValueError, match="num_experts_per_tok \\(9\\) must be from 1"):
        find_architecture(hf).config_cls.from_hf(dict(hf, num_experts_per_tok=9)).layer_moe(1)


@pytest.mark.parametrize("hf, message", [
    (dict(BASE, model_type="glm4_moe", **ROUTED, n_group=3), "n_group \\(3\\) must divide the 8 experts"),
    (dict(BASE, model_type="glm4_moe", **dict(ROUTED, num_experts_per_tok=5), n_group=4, topk_group=2),
     "num_experts_per_tok \\(5\\) exceeds the experts of topk_group \\(2\\) groups of 2"),
    (dict(BASE, model_type="phimoe", num_local_experts=8, num_experts_per_tok=3), "sparsemixer routing takes 2"),
])
def test_a_router_kiln_cannot_run_is_refused_naming_the_field(hf, message):
    c = find_architecture(hf).config_cls.from_hf(hf)
    with pytest.raises(ValueError, match=message):
        c.layer_moe(3)


def test_llama4_text_model_of_the_multimodal_checkpoint():
    """Llama4ForConditionalGeneration: the text_config read, weights under language_model.model (transformers
    4's names), every 4th layer NoPE, MoE on the layers interleave_moe_layer_step picks, the context capped at
    the attention chunk with a note."""
    text = dict(BASE, intermediate_size_mlp=128, num_local_experts=4, interleave_moe_layer_step=2,
                attention_chunk_size=128, max_position_embeddings=1024)
    hf = dict(model_type="llama4", architectures=["Llama4ForConditionalGeneration"], text_config=text,
              transformers_version="4.51.0")
    arch = find_architecture(hf)
    c = arch.config_cls.from_hf(hf)
    assert (c.weight_prefix, c.rope_layers, c.moe_layers) == ("language_model.model", (True,) * 3 + (False,), (1, 3))
    assert (c.context_window_size, c.intermediate_size, c.moe_intermediate_size) == (128, 128, 128)
    assert any("attention_chunk_size" in n for n in c.notes)
    assert "language_model.model.layers.1.feed_forward.experts.gate_up_proj" in \
        arch.weight_map(c)["model.layers.1.mlp.experts_gate_up.weight"].hf_names


def test_latent_attention_is_read_as_the_attention_it_expands_to():
    """DeepSeek-V3's cache holds q's heads, [rotated | nope] dims each; the rotated dims exactly (4 + 94 dims:
    int(98 * (4 / 98)) is 3 in floating point)."""
    hf = dict(BASE, model_type="deepseek_v3", **dict(MLA, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128))
    c = find_architecture(hf).config_cls.from_hf(hf)
    assert (c.head_dim, c.num_key_value_heads, c.rotary_dim) == (192, 4, 64)
    hf = dict(hf, qk_nope_head_dim=94, qk_rope_head_dim=4)
    assert find_architecture(hf).config_cls.from_hf(hf).rotary_dim == 4
    assert [c.layer_moe(i) is None for i in range(4)] == [True, True, True, False]     # first_k_dense_replace 3


def test_layer_patterns_written_nowhere_follow_transformers_defaults():
    """CWM without layer_types, window or RoPE: full first of every 4, a window of 8192, Llama 3 scaling;
    EXAONE 4's "LLLG" pattern string; a Ministral's layer_types; Hunyuan's NTK-alpha base."""
    def read(**hf):
        hf = dict(BASE, **hf)
        return find_architecture(hf).config_cls.from_hf(hf)
    c = read(model_type="cwm", num_hidden_layers=8, max_position_embeddings=16384)
    assert [a.kind for a in c.layer_attention()] == ["full", "sliding", "sliding", "sliding"] * 2
    assert (c.sliding_window, c.rope_theta, c.rope_scaling["rope_type"]) == (8192, 1e6, "llama3")
    c = read(model_type="exaone4", sliding_window=16, sliding_window_pattern="LLLG")
    assert [(a.kind, a.rope) for a in c.layer_attention()] == [("sliding", True)] * 3 + [("full", False)]
    c = read(model_type="exaone4", num_hidden_layers=8)                  # transformers' 4096 and every 4th
    assert [a.rope for a in c.layer_attention()] == [True, True, True, False] * 2
    c = read(model_type="exaone4", sliding_window=None)                  # no window: RoPE everywhere
    assert {(a.kind, a.rope) for a in c.layer_attention()} == {("full", True)}
    c = read(model_type="ministral", sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2)
    assert [a.kind for a in c.layer_attention()] == ["sliding", "full"] * 2
    c = read(model_type="hunyuan_v1_dense", head_dim=16, rope_scaling={"type": "dynamic", "alpha": 50.0})
    assert c.rope_scaling is None and c.rope_theta == pytest.approx(10000.0 * 50.0 ** (16 / 14))


def test_mistral3_reads_its_text_model_under_the_language_model_prefix():
    """Mistral3ForConditionalGeneration (Ministral 3, Mistral Small 3.1): the text_config, the weights under
    model.language_model (transformers 5) or language_model.model (4), the queries' temperature."""
    from kiln.models.llama import weight_map
    text = dict(BASE, model_type="ministral3", head_dim=16, rope_parameters=dict(
        rope_type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=64, llama_4_scaling_beta=0.1))
    hf = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "text_config": text,
          "vision_config": {}, "transformers_version": "5.0.0"}
    c = find_architecture(hf).config_cls.from_hf(hf)
    assert (c.weight_prefix, c.attn_temperature, c.rope_scaling["rope_type"]) == \
        ("model.language_model", (0.1, 64), "yarn")
    m = weight_map(c)
    assert m["model.layers.0.input_layernorm.weight"] == ["model.language_model.layers.0.input_layernorm.weight"]
    assert m["lm_head.weight"] == ["lm_head.weight"]
    c = find_architecture(hf).config_cls.from_hf(dict(hf, transformers_version="4.57.0"))
    assert weight_map(c)["lm_head.weight"] == ["language_model.lm_head.weight"]


@pytest.mark.parametrize("rope, read", [
    ({"type": "mrope", "mrope_section": [16, 24, 24]}, {"rope_type": "default"}),          # Qwen2-VL as released
    ({"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True},
     {"rope_type": "default", "rope_theta": 5e6}),                                         # Qwen3-VL
    ({"type": "xdrope", "xdrope_section": [16, 16, 16, 16], "alpha": 1000.0, "factor": 1.0},
     {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0}),                            # HunYuan-VL as released
    ({"rope_type": "yarn", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}),          # no M-RoPE: as it is
])
def test_mrope_is_read_as_the_rope_it_is_on_text(rope, read):
    from kiln.models.config import mrope_as_rope
    assert mrope_as_rope({"rope_scaling": rope})["rope_scaling"] == read
