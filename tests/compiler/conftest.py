"""Compiler-test fixtures: tiny-Llama builds whose IR is dumped per phase, built once per session."""

from __future__ import annotations

import re

import pytest

import kiln


def ir_functions(ir: str) -> dict[str, str]:
    """TVMScript text of each function (Relax and TIR) of a dumped module, by name."""
    parts = re.split(r"\n    @(?:R\.function|T\.prim_func)[^\n]*\n    def ", ir)
    return {p.split("(", 1)[0]: p for p in parts[1:]}


@pytest.fixture(scope="session")
def dumped_ir(tiny_dirs, tmp_path_factory):
    """dumped_ir(target, phase): the tied tiny Llama built for `target` (4-bit: q4f32 on the CPU,
    q4f16 elsewhere) as `kiln compile --dump-ir` writes it; the functions after `phase`
    ("graph", "legalize", "schedule", "lower", "finalize"), by name."""
    built = {}

    def dump(target: str, phase: str) -> dict[str, str]:
        if target not in built:
            out = tmp_path_factory.mktemp(f"ir-{target}")
            kiln.compile(str(tiny_dirs["tied"]), target=target, quant="q4f32" if target == "cpu" else "q4f16",
                         output=out / "art", dump_ir=out / "ir", golden=False)
            built[target] = out / "ir"
        (path,) = built[target].glob(f"*-{phase}.py")
        return ir_functions(path.read_text())
    return dump
