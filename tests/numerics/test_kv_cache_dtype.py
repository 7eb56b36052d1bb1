"""`kiln compile --kv-cache-dtype float16` under float32 compute: the cache holds half the bytes, and the
logits are transformers float32's with q, k and v rounded to float16 where kiln rounds them (the fused
qkv into the cache's call, q and k again after RoPE, as they are stored) and the attention output
rounded on its way back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln import Engine, SamplingParams
from kiln.compiler.build import CompileOptions
from kiln.runtime import Artifact
from kiln.runtime.check import TOLERANCES, check_artifact, tolerance_for
from kiln.runtime.model_runner import ModelRunner
from tiny_models import reference_logits

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def half_kv(tiny_dirs, tmp_path_factory):
    import kiln
    return kiln.compile(str(tiny_dirs["untied"]), target="cpu", quant="q0f32", kv_cache_dtype="float16",
                        output=tmp_path_factory.mktemp("kv16") / "untied")


def _half(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


@pytest.fixture(scope="module")
def references(tiny_dirs):
    """(transformers float32, the same model rounding q, k, v and the attention output to float16)."""
    import transformers
    from transformers.models.llama import modeling_llama

    def load():
        return transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["untied"], torch_dtype=torch.float32).eval()

    plain, rounded = load(), load()
    for layer in rounded.model.layers:
        layer.self_attn.v_proj.register_forward_hook(lambda mod, args, out: _half(out))
        layer.self_attn.o_proj.register_forward_pre_hook(lambda mod, args: (_half(args[0]),))
    rope = modeling_llama.apply_rotary_pos_emb

    def rounded_rope(q, k, *args, **kwargs):
        return tuple(_half(t) for t in rope(_half(q), _half(k), *args, **kwargs))

    return plain, rounded, rounded_rope


def _logits(reference, ids, rope=None):
    from transformers.models.llama import modeling_llama
    saved = modeling_llama.apply_rotary_pos_emb
    modeling_llama.apply_rotary_pos_emb = rope or saved
    try:
        return reference_logits(reference, ids)
    finally:
        modeling_llama.apply_rotary_pos_emb = saved


def test_float16_cache_logits_are_float32_with_q_k_v_rounded(half_kv, references):
    plain, rounded, rope = references
    runner = ModelRunner(Artifact.load(half_kv))
    ids = np.random.default_rng(7).integers(0, 512, size=23).tolist()
    runner.add_sequence(0)
    got = [runner.verify(0, ids)]                                    # every prefill position
    want_plain, want_rounded = [reference_logits(plain, ids)], [_logits(rounded, ids, rope)]
    runner.add_sequence(1)
    logits, seq = runner.prefill([1], [ids])[0], list(ids)
    for _ in range(3):                                               # decode steps read the float16 pages
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        got.append(logits[None])
        want_plain.append(reference_logits(plain, seq)[-1:])
        want_rounded.append(_logits(rounded, seq, rope)[-1:])
    err_plain = max(float(np.abs(g - w).max()) for g, w in zip(got, want_plain))
    err_rounded = max(float(np.abs(g - w).max()) for g, w in zip(got, want_rounded))
    # Measured: 1.6e-3 against float32 (logits up to 2.5), 2.1e-4 against the rounded reference
    # (float32 sums in another order move a few roundings by one float16 step).
    assert err_rounded < 6e-4 and err_rounded < err_plain / 4, (err_rounded, err_plain)
    assert 1e-4 < err_plain < 1e-2


def test_float16_cache_halves_the_bytes_and_serves(half_kv, tiny_artifacts):
    layout, full = Artifact.load(half_kv).config.kv_cache, Artifact.load(tiny_artifacts["untied"]).config.kv_cache
    assert (layout.dtype, full.dtype) == ("float16", "float32")
    assert layout.bytes_per_token * 2 == full.bytes_per_token
    engine = Engine(half_kv)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = list(range(40, 80))                     # 40 tokens: the second run reuses cached pages
    first, again = engine.generate(prompt, params), engine.generate(prompt, params)
    assert engine.stats().prefix_cache_hit_tokens >= 32                 # two whole pages reused
    batched = engine.generate([prompt, [3, 4, 5]], params)
    assert first.token_ids == again.token_ids == batched[0].token_ids and len(first.token_ids) == 12


def test_check_holds_a_float16_cache_to_q0f16s_bounds(half_kv):
    report = check_artifact(half_kv)
    assert report.ok, report.reason()
    assert tolerance_for("q0f32", "float16") == report.tolerance == TOLERANCES["q0f16"]
    assert tolerance_for("q4f32", "float16") == TOLERANCES["q4f32"]           # already looser
    assert tolerance_for("q0f32", "float32") == TOLERANCES["q0f32"]


def test_an_unknown_cache_dtype_or_one_the_target_cannot_store_is_refused(tmp_path, tiny_dirs):
    import kiln
    with pytest.raises(ValueError, match="--kv-cache-dtype 'int8' is not one of auto, float32, float16"):
        CompileOptions(model=str(tmp_path / "missing"), kv_cache_dtype="int8").validate()
    with pytest.raises(ValueError, match="the webgpu target stores no 16-bit values; use --kv-cache-dtype auto"):
        kiln.compile(str(tiny_dirs["tied"]), target="webgpu", kv_cache_dtype="float16", output=tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_kiln_info_names_the_cache_dtype_and_its_bytes(half_kv):
    from click.testing import CliRunner

    from kiln.cli import main
    out = CliRunner().invoke(main, ["info", str(half_kv)])
    assert out.exit_code == 0, out.output
    # 2 layers x 2 kv heads x head_dim 16 x (key, value) x 2 bytes
    assert "kv cache   float16, 0.25 KiB a token" in out.output
