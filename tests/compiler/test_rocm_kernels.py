"""The ROCm artifact's GPU code object, read back out of lib.so: an AMDGPU ELF for the preset's
architecture, linked (a shared object, as the HIP runtime loads it), whose kernels are exactly
the model's (one per GPU launch of each scheduled PrimFunc). No AMD GPU is needed."""

from __future__ import annotations

import math
import re
import struct

import pytest

from kiln.targets import ToolchainError, get_profile

from gpu_kernels import build, row_branches

pytestmark = pytest.mark.compiler

_EM_AMDGPU, _ET_DYN, _SHT_SYMTAB, _SHT_DYNSYM, _STT_FUNC = 224, 3, 2, 11, 2
_FLAT_WORK_GROUP = 256                                          # what TVM declares without a GPU to ask
_MACH = {"gfx90a": 0x3F, "gfx942": 0x4C, "gfx1100": 0x41}          # EF_AMDGPU_MACH_AMDGCN_*


def code_objects(lib: bytes) -> list[bytes]:
    """The AMDGPU ELF images packed into a host library (length-prefixed blobs)."""
    out, at = [], lib.find(b"\x7fELF", 1)
    while at != -1:
        if struct.unpack_from("<H", lib, at + 18)[0] == _EM_AMDGPU:
            (length,) = struct.unpack_from("<Q", lib, at - 8)
            out.append(lib[at:at + length])
        at = lib.find(b"\x7fELF", at + 1)
    return out


def elf_symbols(elf: bytes) -> tuple[int, int, dict[str, int]]:
    """(e_type, e_flags, {symbol name: STT type}) of a 64-bit little-endian ELF."""
    e_type, _machine, _version, _entry, _phoff, shoff, e_flags = struct.unpack_from("<HHIQQQI", elf, 16)
    shentsize, shnum = struct.unpack_from("<HH", elf, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = {}
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind not in (_SHT_SYMTAB, _SHT_DYNSYM):
            continue
        strtab = sections[link][4]
        for i in range(size // entsize):
            strx, info = struct.unpack_from("<IB", elf, offset + i * entsize)
            names[elf[strtab + strx:elf.index(b"\0", strtab + strx)].decode()] = info & 0xF
    return e_type, e_flags, names


@pytest.mark.parametrize("preset,arch", [("rocm-gfx90a", "gfx90a")])
def test_rocm_code_object_holds_the_models_kernels(preset, arch, tiny_dirs, tmp_path):
    profile = get_profile(preset)
    try:
        profile.check_toolchain(profile)
    except ToolchainError as e:
        pytest.skip(str(e))
    built = build(tiny_dirs["tied"], preset, "q4f16")
    lib = tmp_path / "lib.so"
    built.profile.export(built.executable, lib)
    objects = code_objects(lib.read_bytes())
    assert len(objects) == 1
    e_type, e_flags, symbols = elf_symbols(objects[0])
    assert e_type == _ET_DYN and e_flags & 0xFF == _MACH[arch]
    # Each kernel: its code (a function) and its kernel descriptor (NAME.kd), which the runtime launches.
    kernels = {n.removesuffix(".kd") for n in symbols if n.endswith(".kd")}
    assert all(symbols.get(k) == _STT_FUNC for k in kernels)
    funcs = {n for n, f in built.prim_funcs().items() if 'thread="threadIdx.' in f.script()}
    assert {k for k in kernels if not any(k.startswith(f"{f}_kernel") for f in funcs)} == set()
    assert {f for f in funcs if not any(k.startswith(f"{f}_kernel") for k in kernels)} == set()
    assert len(kernels) > 30
    # The 4-bit matmuls branch on their rows (GEMV / GEMV / tiled: three kernels each), int32-indexed here.
    assert len([k for k in kernels if "NT_matmul" in k and k.endswith("_kernel_2")]) >= 5
    # Every launch (each branch of a kernel that branches on its rows) within the 256 threads the
    # code object declares (amdgpu-flat-work-group-size).
    for name in funcs:
        for _, branch in row_branches(built.func(name)):
            per_axis = {}
            for m in re.finditer(r'T\.thread_binding\((?:T\.int\d+\()?(\d+)\)?, thread="threadIdx\.([xyz])"',
                                 branch.script()):
                per_axis[m.group(2)] = max(per_axis.get(m.group(2), 1), int(m.group(1)))
            assert math.prod(per_axis.values()) <= _FLAT_WORK_GROUP, (name, per_axis)
