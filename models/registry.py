"""Every architecture kiln can compile, registered in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import (
    alibi,
    apertus,
    beam,
    bitnet,
    cohere,
    dbrx,
    deci,
    deepseek,
    ergo,
    ernie4_5,
    falcon,
    falcon_h1,
    gemma,
    gemma3n,
    gemma4,
    glm,
    glm4_moe,
    gpt2,
    gpt_neo,
    gpt_neox,
    gpt_oss,
    gptj,
    granite,
    helium,
    hunyuan,
    kimi_linear,
    laguna,
    lfm2,
    llama,
    llama4,
    longcat,
    mamba1,
    mamba2,
    mixtral,
    modernbert_decoder,
    nanochat,
    nemotron,
    olmo,
    olmo2,
    olmo_hybrid,
    olmoe,
    opt,
    phi,
    phi3,
    qwen2,
    qwen3,
    qwen3_5,
    qwen_moe,
    qwen_vl,
    recurrent_gemma,
    smollm3,
    stablelm,
    starcoder2,
    zamba2,
)
from .source import ModelLoadError
from .unsupported import unsupported_reason


@dataclass(frozen=True)
class Architecture:
    name: str
    hf_architectures: tuple[str, ...]     # config.json "architectures"
    model_types: tuple[str, ...]          # config.json "model_type"
    config_cls: Any                       # has from_hf(dict)
    model_cls: Callable                   # nn.Module taking the config
    weight_map: Callable                  # config -> {param name: [hf names] or WeightSpec}


def _arch(name, hf_architectures, model_types, module, config_cls, model_cls) -> Architecture:
    return Architecture(name, hf_architectures, model_types, config_cls, model_cls, module.weight_map)


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    _arch("llama", ("LlamaForCausalLM", "MistralForCausalLM", "MinistralForCausalLM", "IQuestCoderForCausalLM"),
          ("llama", "mistral", "ministral", "iquestcoder"), llama, llama.LlamaConfig, llama.LlamaForCausalLM),
    _arch("llama4", ("Llama4ForCausalLM", "Llama4ForConditionalGeneration"), ("llama4_text", "llama4"), llama4,
          llama4.Llama4Config, llama4.Llama4ForCausalLM),
    _arch("ministral3", ("Ministral3ForCausalLM", "Mistral3ForConditionalGeneration"), ("ministral3", "mistral3"),
          llama, llama.Ministral3Config, llama.Ministral3ForCausalLM),
    _arch("minicpm", ("MiniCPMForCausalLM",), ("minicpm",), llama, llama.MiniCPMConfig, llama.MiniCPMForCausalLM),
    _arch("internlm2", ("InternLM2ForCausalLM",), ("internlm2",), llama, llama.InternLM2Config,
          llama.InternLM2ForCausalLM),
    _arch("internlm3", ("InternLM3ForCausalLM",), ("internlm3",), llama, llama.InternLM3Config,
          llama.InternLM3ForCausalLM),
    _arch("seed_oss", ("SeedOssForCausalLM",), ("seed_oss",), llama, llama.SeedOssConfig, llama.SeedOssForCausalLM),
    _arch("cwm", ("CwmForCausalLM",), ("cwm",), llama, llama.CwmConfig, llama.CwmForCausalLM),
    _arch("exaone", ("ExaoneForCausalLM",), ("exaone",), llama, llama.ExaoneConfig, llama.ExaoneForCausalLM),
    _arch("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), qwen2, qwen2.Qwen2Config, qwen2.Qwen2ForCausalLM),
    _arch("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), qwen3, qwen3.Qwen3Config, qwen3.Qwen3ForCausalLM),
    _arch("gemma", ("GemmaForCausalLM",), ("gemma",), gemma, gemma.GemmaConfig, gemma.GemmaForCausalLM),
    _arch("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), gemma, gemma.Gemma2Config, gemma.Gemma2ForCausalLM),
    _arch("gemma3", ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), ("gemma3_text", "gemma3"), gemma,
          gemma.Gemma3Config, gemma.Gemma3ForCausalLM),
    Architecture("qwen2_vl", ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"),
                 ("qwen2_vl", "qwen2_5_vl"), qwen_vl.Qwen2VLConfig, qwen_vl.Qwen2VLForCausalLM, qwen_vl.weight_map),
    Architecture("qwen3_vl", ("Qwen3VLForConditionalGeneration",), ("qwen3_vl",), qwen_vl.Qwen3VLConfig,
                 qwen_vl.Qwen3VLForCausalLM, qwen_vl.weight_map),
    Architecture("qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",), ("qwen3_vl_moe",), qwen_vl.Qwen3VLMoeConfig,
                 qwen_vl.Qwen3VLForCausalLM, qwen_vl.moe_map),
    _arch("qwen3_5", ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"), ("qwen3_5_text", "qwen3_5"), qwen3_5,
          qwen3_5.Qwen35Config, qwen3_5.Qwen35ForCausalLM),
    _arch("qwen3_5_moe", ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
          ("qwen3_5_moe_text", "qwen3_5_moe"), qwen3_5, qwen3_5.Qwen35MoeConfig, qwen3_5.Qwen35ForCausalLM),
    Architecture("qwen3_next", ("Qwen3NextForCausalLM",), ("qwen3_next",), qwen3_5.Qwen3NextConfig,
                 qwen3_5.Qwen35ForCausalLM, qwen3_5.next_weight_map),
    _arch("lfm2", ("Lfm2ForCausalLM",), ("lfm2",), lfm2, lfm2.Lfm2Config, lfm2.Lfm2ForCausalLM),
    _arch("lfm2_moe", ("Lfm2MoeForCausalLM",), ("lfm2_moe",), lfm2, lfm2.Lfm2MoeConfig, lfm2.Lfm2ForCausalLM),
    _arch("lfm3", ("Lfm3ForCausalLM",), ("lfm3",), lfm2, lfm2.Lfm3Config, lfm2.Lfm2ForCausalLM),
    _arch("gemma3n", ("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration"), ("gemma3n_text", "gemma3n"), gemma3n,
          gemma3n.Gemma3nConfig, gemma3n.Gemma3nForCausalLM),
    _arch("gemma4", ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForCausalLM",
                     "Gemma4UnifiedForConditionalGeneration"),
          ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified"), gemma4,
          gemma4.Gemma4Config, gemma4.Gemma4ForCausalLM),
    _arch("vaultgemma", ("VaultGemmaForCausalLM",), ("vaultgemma",), gemma, gemma.VaultGemmaConfig,
          gemma.VaultGemmaForCausalLM),
    _arch("phi3", ("Phi3ForCausalLM",), ("phi3",), phi3, phi3.Phi3Config, phi3.Phi3ForCausalLM),
    _arch("gpt2", ("GPT2LMHeadModel",), ("gpt2",), gpt2, gpt2.GPT2Config, gpt2.GPT2LMHeadModel),
    _arch("gpt_bigcode", ("GPTBigCodeForCausalLM",), ("gpt_bigcode",), gpt2, gpt2.GPTBigCodeConfig,
          gpt2.GPTBigCodeForCausalLM),
    _arch("gpt_neo", ("GPTNeoForCausalLM",), ("gpt_neo",), gpt_neo, gpt_neo.GPTNeoConfig, gpt_neo.GPTNeoForCausalLM),
    _arch("gptj", ("GPTJForCausalLM",), ("gptj",), gptj, gptj.GPTJConfig, gptj.GPTJForCausalLM),
    _arch("codegen", ("CodeGenForCausalLM",), ("codegen",), gptj, gptj.CodeGenConfig, gptj.CodeGenForCausalLM),
    _arch("opt", ("OPTForCausalLM",), ("opt",), opt, opt.OPTConfig, opt.OPTForCausalLM),
    _arch("biogpt", ("BioGptForCausalLM",), ("biogpt",), opt, opt.BioGptConfig, opt.BioGptForCausalLM),
    _arch("apertus", ("ApertusForCausalLM", "Apertus1p5TextForCausalLM"), ("apertus", "apertus1p5_text"), apertus,
          apertus.ApertusConfig, apertus.ApertusForCausalLM),
    _arch("nanochat", ("NanoChatForCausalLM",), ("nanochat",), nanochat, nanochat.NanoChatConfig,
          nanochat.NanoChatForCausalLM),
    _arch("olmo", ("OlmoForCausalLM",), ("olmo",), olmo, olmo.OlmoConfig, olmo.OlmoForCausalLM),
    _arch("falcon", ("FalconForCausalLM", "RWForCausalLM"), ("falcon", "RefinedWeb", "RefinedWebModel"), falcon,
          falcon.FalconConfig, falcon.FalconForCausalLM),
    _arch("granite", ("GraniteForCausalLM",), ("granite",), granite, granite.GraniteConfig,
          granite.GraniteForCausalLM),
    _arch("granite_swa", ("GraniteSWAForCausalLM",), ("granite_swa",), granite, granite.GraniteSWAConfig,
          granite.GraniteSWAForCausalLM),
    _arch("granitemoe_swa", ("GraniteMoeSWAForCausalLM",), ("granitemoe_swa",), granite, granite.GraniteMoeSWAConfig,
          granite.GraniteMoeSWAForCausalLM),
    _arch("granitemoe", ("GraniteMoeForCausalLM",), ("granitemoe",), granite, granite.GraniteMoeConfig,
          granite.GraniteMoeForCausalLM),
    _arch("granitemoeshared", ("GraniteMoeSharedForCausalLM",), ("granitemoeshared",), granite,
          granite.GraniteMoeSharedConfig, granite.GraniteMoeSharedForCausalLM),
    _arch("granitemoehybrid", ("GraniteMoeHybridForCausalLM",), ("granitemoehybrid",), granite,
          granite.GraniteMoeHybridConfig, granite.GraniteMoeHybridForCausalLM),
    Architecture("bamba", ("BambaForCausalLM",), ("bamba",), mamba2.BambaConfig, mamba2.HybridLM,
                 mamba2.bamba_weight_map),
    Architecture("nemotron_h", ("NemotronHForCausalLM",), ("nemotron_h",), mamba2.NemotronHConfig,
                 mamba2.NemotronHForCausalLM, mamba2.nemotron_h_weight_map),
    _arch("falcon_h1", ("FalconH1ForCausalLM",), ("falcon_h1",), falcon_h1, falcon_h1.FalconH1Config,
          falcon_h1.FalconH1ForCausalLM),
    _arch("recurrent_gemma", ("RecurrentGemmaForCausalLM",), ("recurrent_gemma",), recurrent_gemma,
          recurrent_gemma.RecurrentGemmaConfig, recurrent_gemma.RecurrentGemmaForCausalLM),
    _arch("zamba2", ("Zamba2ForCausalLM",), ("zamba2",), zamba2, zamba2.Zamba2Config, zamba2.Zamba2ForCausalLM),
    _arch("mamba", ("MambaForCausalLM",), ("mamba",), mamba1, mamba1.MambaConfig, mamba1.MambaForCausalLM),
    _arch("falcon_mamba", ("FalconMambaForCausalLM",), ("falcon_mamba",), mamba1, mamba1.FalconMambaConfig,
          mamba1.MambaForCausalLM),
    Architecture("jamba", ("JambaForCausalLM",), ("jamba",), mamba1.JambaConfig, mamba1.JambaForCausalLM,
                 mamba1.jamba_weight_map),
    Architecture("mamba2", ("Mamba2ForCausalLM",), ("mamba2",), mamba2.Mamba2Config, mamba2.NemotronHForCausalLM,
                 mamba2.nemotron_h_weight_map),
    _arch("hyperclovax", ("HyperCLOVAXForCausalLM",), ("hyperclovax",), granite, granite.HyperCLOVAXConfig,
          granite.HyperCLOVAXForCausalLM),
    _arch("olmo2", ("Olmo2ForCausalLM",), ("olmo2",), olmo2, olmo2.Olmo2Config, olmo2.Olmo2ForCausalLM),
    _arch("olmo3", ("Olmo3ForCausalLM",), ("olmo3",), olmo2, olmo2.Olmo3Config, olmo2.Olmo3ForCausalLM),
    _arch("modernbert_decoder", ("ModernBertDecoderForCausalLM",), ("modernbert-decoder",), modernbert_decoder,
          modernbert_decoder.ModernBertDecoderConfig, modernbert_decoder.ModernBertDecoderForCausalLM),
    _arch("kimi_linear", ("KimiLinearForCausalLM",), ("kimi_linear",), kimi_linear, kimi_linear.KimiLinearConfig,
          kimi_linear.KimiLinearForCausalLM),
    _arch("bailing_hybrid", ("BailingHybridForCausalLM", "BailingMoeV3ForCausalLM"),
          ("bailing_hybrid", "bailing_moe_v3"), kimi_linear, kimi_linear.BailingHybridConfig,
          kimi_linear.BailingHybridForCausalLM),
    Architecture("lara_mini", ("LaraMiniForCausalLM",), ("lara_mini",), olmo_hybrid.LaraMiniConfig,
                 olmo_hybrid.LaraMiniForCausalLM, olmo_hybrid.lara_weight_map),
    _arch("olmo_hybrid", ("OlmoHybridForCausalLM",), ("olmo_hybrid",), olmo_hybrid, olmo_hybrid.OlmoHybridConfig,
          olmo_hybrid.OlmoHybridForCausalLM),
    _arch("exaone4", ("Exaone4ForCausalLM",), ("exaone4",), olmo2, olmo2.Exaone4Config, olmo2.Exaone4ForCausalLM),
    _arch("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",), smollm3, smollm3.SmolLM3Config,
          smollm3.SmolLM3ForCausalLM),
    _arch("stablelm", ("StableLmForCausalLM",), ("stablelm",), stablelm, stablelm.StableLmConfig,
          stablelm.StableLmForCausalLM),
    _arch("starcoder2", ("Starcoder2ForCausalLM",), ("starcoder2",), starcoder2, starcoder2.Starcoder2Config,
          starcoder2.Starcoder2ForCausalLM),
    _arch("phi", ("PhiForCausalLM",), ("phi",), phi, phi.PhiConfig, phi.PhiForCausalLM),
    _arch("gpt_neox", ("GPTNeoXForCausalLM",), ("gpt_neox",), gpt_neox, gpt_neox.GPTNeoXConfig,
          gpt_neox.GPTNeoXForCausalLM),
    _arch("persimmon", ("PersimmonForCausalLM",), ("persimmon",), gpt_neox, gpt_neox.PersimmonConfig,
          gpt_neox.PersimmonForCausalLM),
    _arch("mixtral", ("MixtralForCausalLM",), ("mixtral",), mixtral, mixtral.MixtralConfig, mixtral.MixtralForCausalLM),
    _arch("phimoe", ("PhimoeForCausalLM",), ("phimoe",), mixtral, mixtral.PhimoeConfig, mixtral.PhimoeForCausalLM),
    _arch("aria_text", ("AriaTextForCausalLM",), ("aria_text",), mixtral, mixtral.AriaTextConfig,
          mixtral.AriaTextForCausalLM),
    _arch("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), qwen_moe, qwen_moe.Qwen2MoeConfig,
          qwen_moe.Qwen2MoeForCausalLM),
    _arch("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), qwen_moe, qwen_moe.Qwen3MoeConfig,
          qwen_moe.Qwen3MoeForCausalLM),
    _arch("mellum", ("MellumForCausalLM",), ("mellum",), qwen_moe, qwen_moe.MellumConfig, qwen_moe.MellumForCausalLM),
    _arch("gpt_oss", ("GptOssForCausalLM",), ("gpt_oss",), gpt_oss, gpt_oss.GptOssConfig, gpt_oss.GptOssForCausalLM),
    _arch("flint", ("FlintForCausalLM",), ("flint",), qwen_moe, qwen_moe.FlintConfig, qwen_moe.FlintForCausalLM),
    _arch("olmoe", ("OlmoeForCausalLM",), ("olmoe",), olmoe, olmoe.OlmoeConfig, olmoe.OlmoeForCausalLM),
    _arch("dbrx", ("DbrxForCausalLM",), ("dbrx",), dbrx, dbrx.DbrxConfig, dbrx.DbrxForCausalLM),
    _arch("flex_olmo", ("FlexOlmoForCausalLM",), ("flex_olmo",), olmoe, olmoe.FlexOlmoConfig,
          olmoe.FlexOlmoForCausalLM),
    _arch("ernie4_5", ("Ernie4_5ForCausalLM",), ("ernie4_5",), ernie4_5, ernie4_5.Ernie4_5Config,
          ernie4_5.Ernie4_5ForCausalLM),
    _arch("ernie4_5_moe", ("Ernie4_5_MoeForCausalLM",), ("ernie4_5_moe",), ernie4_5, ernie4_5.Ernie4_5MoeConfig,
          ernie4_5.Ernie4_5MoeForCausalLM),
    _arch("glm", ("GlmForCausalLM",), ("glm",), glm, glm.GlmConfig, glm.GlmForCausalLM),
    _arch("glm4", ("Glm4ForCausalLM",), ("glm4",), glm, glm.Glm4Config, glm.Glm4ForCausalLM),
    _arch("glm4_moe", ("Glm4MoeForCausalLM",), ("glm4_moe",), glm4_moe, glm4_moe.Glm4MoeConfig,
          glm4_moe.Glm4MoeForCausalLM),
    _arch("solar_open", ("SolarOpenForCausalLM",), ("solar_open",), glm4_moe, glm4_moe.SolarOpenConfig,
          glm4_moe.SolarOpenForCausalLM),
    _arch("dots1", ("Dots1ForCausalLM",), ("dots1",), glm4_moe, glm4_moe.Dots1Config, glm4_moe.Dots1ForCausalLM),
    _arch("minimax_m2", ("MiniMaxM2ForCausalLM",), ("minimax_m2",), glm4_moe, glm4_moe.MiniMaxM2Config,
          glm4_moe.MiniMaxM2ForCausalLM),
    _arch("minimax_m3", ("MiniMaxM3VLForCausalLM", "MiniMaxM3SparseForCausalLM"), ("minimax_m3_vl_text", "minimax_m3"),
          glm4_moe, glm4_moe.MiniMaxM3Config, glm4_moe.MiniMaxM3ForCausalLM),
    _arch("exaone_moe", ("ExaoneMoeForCausalLM",), ("exaone_moe",), glm4_moe, glm4_moe.ExaoneMoeConfig,
          glm4_moe.ExaoneMoeForCausalLM),
    _arch("hy_v3", ("HYV3ForCausalLM",), ("hy_v3",), glm4_moe, glm4_moe.HyV3Config, glm4_moe.HyV3ForCausalLM),
    _arch("minicpm5_moe", ("MiniCPM5MoeForCausalLM", "MiniCPM5MoEForCausalLM"), ("minicpm5_moe",), glm4_moe,
          glm4_moe.MiniCPM5MoeConfig, glm4_moe.MiniCPM5MoeForCausalLM),
    _arch("beam", ("BeamForCausalLM",), ("beam",), beam, beam.BeamConfig, beam.BeamForCausalLM),
    _arch("ergo", ("ErgoForCausalLM",), ("ergo",), ergo, ergo.ErgoConfig, ergo.ErgoForCausalLM),
    _arch("mimo_v2_flash", ("MiMoV2FlashForCausalLM",), ("mimo_v2_flash",), glm4_moe, glm4_moe.MiMoV2FlashConfig,
          glm4_moe.MiMoV2FlashForCausalLM),
    _arch("afmoe", ("AfmoeForCausalLM",), ("afmoe",), glm4_moe, glm4_moe.AfmoeConfig, glm4_moe.AfmoeForCausalLM),
    _arch("deci", ("DeciLMForCausalLM",), ("nemotron-nas", "deci"), deci, deci.DeciConfig, deci.DeciForCausalLM),
    _arch("laguna", ("LagunaForCausalLM",), ("laguna",), laguna, laguna.LagunaConfig, laguna.LagunaForCausalLM),
    _arch("kolibri1", ("Kolibri1ForCausalLM",), ("kolibri1",), glm4_moe, glm4_moe.Kolibri1Config,
          glm4_moe.Kolibri1ForCausalLM),
    _arch("sarvam_moe", ("SarvamMoEForCausalLM",), ("sarvam_moe",), glm4_moe, glm4_moe.SarvamMoeConfig,
          glm4_moe.SarvamMoeForCausalLM),
    _arch("bailing_moe_v2", ("BailingMoeV2ForCausalLM",), ("bailing_moe_v2",), glm4_moe, glm4_moe.BailingMoeV2Config,
          glm4_moe.BailingMoeV2ForCausalLM),
    _arch("param2moe", ("Param2MoeForCausalLM",), ("param2moe",), glm4_moe, glm4_moe.Param2MoeConfig,
          glm4_moe.Param2MoeForCausalLM),
    _arch("deepseek_v2", ("DeepseekV2ForCausalLM",), ("deepseek_v2",), deepseek, deepseek.DeepseekV2Config,
          deepseek.DeepseekV2ForCausalLM),
    _arch("longcat_flash", ("LongcatFlashForCausalLM",), ("longcat_flash",), longcat, longcat.LongcatFlashConfig,
          longcat.LongcatFlashForCausalLM),
    _arch("deepseek_v3", ("DeepseekV3ForCausalLM",), ("deepseek_v3", "kimi_k2"), deepseek, deepseek.DeepseekV3Config,
          deepseek.DeepseekV3ForCausalLM),
    _arch("sarvam_mla", ("SarvamMLAForCausalLM",), ("sarvam_mla",), deepseek, deepseek.SarvamMLAConfig,
          deepseek.SarvamMLAForCausalLM),
    _arch("axk1", ("AXK1ForCausalLM",), ("axk1",), deepseek, deepseek.AXK1Config, deepseek.AXK1ForCausalLM),
    _arch("glm4_moe_lite", ("Glm4MoeLiteForCausalLM",), ("glm4_moe_lite",), deepseek, deepseek.Glm4MoeLiteConfig,
          deepseek.Glm4MoeLiteForCausalLM),
    _arch("deepseek_v32", ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"), ("deepseek_v32", "glm_moe_dsa"), deepseek,
          deepseek.DeepseekV32Config, deepseek.DeepseekV32ForCausalLM),
    _arch("minicpm3", ("MiniCPM3ForCausalLM",), ("minicpm3",), deepseek, deepseek.MiniCPM3Config,
          deepseek.MiniCPM3ForCausalLM),
    _arch("mistral4", ("Mistral4ForCausalLM",), ("mistral4",), deepseek, deepseek.Mistral4Config,
          deepseek.Mistral4ForCausalLM),
    _arch("youtu", ("YoutuForCausalLM",), ("youtu",), deepseek, deepseek.YoutuConfig, deepseek.YoutuForCausalLM),
    _arch("cohere", ("CohereForCausalLM",), ("cohere",), cohere, cohere.CohereConfig, cohere.CohereForCausalLM),
    _arch("cohere2", ("Cohere2ForCausalLM",), ("cohere2",), cohere, cohere.Cohere2Config, cohere.Cohere2ForCausalLM),
    _arch("cohere2_moe", ("Cohere2MoeForCausalLM",), ("cohere2_moe",), cohere, cohere.Cohere2MoeConfig,
          cohere.Cohere2MoeForCausalLM),
    _arch("nemotron", ("NemotronForCausalLM",), ("nemotron",), nemotron, nemotron.NemotronConfig,
          nemotron.NemotronForCausalLM),
    _arch("arcee", ("ArceeForCausalLM",), ("arcee",), nemotron, nemotron.ArceeConfig, nemotron.ArceeForCausalLM),
    _arch("bloom", ("BloomForCausalLM",), ("bloom",), alibi, alibi.BloomConfig, alibi.BloomForCausalLM),
    _arch("mpt", ("MptForCausalLM", "MPTForCausalLM"), ("mpt",), alibi, alibi.MptConfig, alibi.MptForCausalLM),
    _arch("helium", ("HeliumForCausalLM",), ("helium",), helium, helium.HeliumConfig, helium.HeliumForCausalLM),
    _arch("bitnet", ("BitNetForCausalLM",), ("bitnet",), bitnet, bitnet.BitNetConfig, bitnet.BitNetForCausalLM),
    _arch("jais2", ("Jais2ForCausalLM",), ("jais2",), nemotron, nemotron.Jais2Config, nemotron.Jais2ForCausalLM),
    _arch("hunyuan_v1_dense", ("HunYuanDenseV1ForCausalLM",), ("hunyuan_v1_dense",), hunyuan,
          hunyuan.HunYuanDenseConfig, hunyuan.HunYuanDenseV1ForCausalLM),
    _arch("hunyuan_v1_moe", ("HunYuanMoEV1ForCausalLM",), ("hunyuan_v1_moe",), hunyuan, hunyuan.HunYuanMoEConfig,
          hunyuan.HunYuanMoEV1ForCausalLM),
)}


def gguf_architectures(arch: Architecture) -> tuple[str, ...]:
    """The GGUF `general.architecture` names that load as `arch` (models/gguf.py maps them)."""
    from .gguf import GGUF_MODEL_TYPES
    return tuple(g for g, types in GGUF_MODEL_TYPES.items() if set(types) & set(arch.model_types))


def supported() -> str:
    """Every family with the config.json architectures and GGUF architecture names it accepts."""
    rows = []
    for a in ARCHITECTURES.values():
        gguf = gguf_architectures(a)
        rows.append(f"{a.name} ({'/'.join(a.hf_architectures)}{'; GGUF ' + '/'.join(gguf) if gguf else ''})")
    return ", ".join(rows)


def find_architecture(hf_config: dict) -> Architecture:
    """The registered architecture for a config.json dict: by `model_type`, as transformers' Auto
    classes choose (transformers 5 saves EXAONE 3 as model_type exaone with architectures
    LlamaForCausalLM, its tensors under EXAONE's names), then by `architectures`."""
    names = hf_config.get("architectures") or []
    model_type = hf_config.get("model_type")
    for arch in ARCHITECTURES.values():
        if model_type in arch.model_types:
            return arch
    for arch in ARCHITECTURES.values():
        if any(n in arch.hf_architectures for n in names):
            return arch
    if (reason := unsupported_reason(model_type)) is not None:
        raise ModelLoadError(reason)
    what = "/".join(names) or model_type or "no 'architectures' or 'model_type' field"
    raise ModelLoadError(f"unknown architecture: {what}. Supported: {supported()}.")
