"""Metal (macOS .dylib) and iOS (static system library) artifacts, checked without a Mac: the Metal
source of every kernel and a host function for it are in the library, the library is an arm64
Mach-O for the right platform, and its symbols are those TVM's runtime binds (no Metal compiler
or Apple linker exists here, so the kernels are not compiled or run)."""

from __future__ import annotations

import re
import struct
import tarfile

import pytest

import kiln

from gpu_kernels import build

pytestmark = pytest.mark.compiler

_MH_MAGIC_64, _CPU_ARM64 = 0xFEEDFACF, 0x0100000C
_MH_OBJECT, _MH_DYLIB = 1, 6
_LC_SYMTAB, _LC_BUILD_VERSION, _LC_ID_DYLIB = 0x2, 0x32, 0xD
_PLATFORM = {1: "macos", 2: "ios"}


def macho(data: bytes) -> dict:
    """What the checks need from a 64-bit Mach-O: file type, platform, install name, symbols."""
    magic, cpu, _sub, filetype, ncmds, _size, _flags, _res = struct.unpack_from("<8I", data)
    assert magic == _MH_MAGIC_64 and cpu == _CPU_ARM64, "not an arm64 Mach-O"
    info = {"filetype": filetype, "platform": None, "install_name": None, "defined": set(), "undefined": set()}
    at = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<2I", data, at)
        if cmd == _LC_BUILD_VERSION:
            info["platform"] = _PLATFORM.get(struct.unpack_from("<I", data, at + 8)[0])
        elif cmd == _LC_ID_DYLIB:
            (offset,) = struct.unpack_from("<I", data, at + 8)
            info["install_name"] = data[at + offset:at + size].split(b"\0")[0].decode()
        elif cmd == _LC_SYMTAB:
            symoff, nsyms, stroff, _strsize = struct.unpack_from("<4I", data, at + 8)
            for i in range(nsyms):
                strx, ntype, _sect, _desc, _value = struct.unpack_from("<IBBhQ", data, symoff + 16 * i)
                name = data[stroff + strx:data.index(b"\0", stroff + strx)].decode()
                if ntype & 0x01:                                           # N_EXT
                    info["defined" if ntype & 0x0E else "undefined"].add(name)
        at += size
    return info


def metal_sources(blob: bytes) -> dict[str, str]:
    """The packed Metal module's per-kernel sources: name -> source (each a length-prefixed string)."""
    out = {}
    for m in re.finditer(rb"#include <metal_stdlib>", blob):
        (length,) = struct.unpack_from("<Q", blob, m.start() - 8)
        name_end = m.start() - 8
        name = re.search(rb"(\w+)$", blob[name_end - 200:name_end]).group(1)
        while struct.unpack_from("<Q", blob, name_end - len(name) - 8)[0] != len(name):
            name = name[1:]                                # drop bytes of the length before it
        out[name.decode()] = blob[m.start():m.start() + length].decode()
    return out


def kernel_funcs(built) -> set[str]:
    """The model's PrimFuncs that launch GPU kernels (those with thread bindings)."""
    return {n for n, f in built.prim_funcs().items() if 'thread="threadIdx.' in f.script()}


@pytest.fixture(scope="module")
def metal(tiny_dirs, tmp_path_factory):
    """The tiny model's Metal build and its linked dylib (skips, naming the fix, where ld64.lld is not installed)."""
    from kiln.targets import ToolchainError, get_profile
    profile = get_profile("metal")
    try:
        profile.check_toolchain(profile)
    except ToolchainError as e:
        pytest.skip(str(e))
    built = build(tiny_dirs["tied"], "metal", "q4f16")
    lib = tmp_path_factory.mktemp("metal") / "lib.dylib"
    built.profile.export(built.executable, lib)
    return built, lib.read_bytes()


def test_metal_dylib_carries_every_kernel_and_its_host_function(metal):
    built, dylib = metal
    info = macho(dylib)
    assert info["filetype"] == _MH_DYLIB and info["platform"] == "macos"
    assert info["install_name"] == "@rpath/lib.dylib"
    sources = metal_sources(dylib)
    declared = set(re.findall(r"kernel void (\w+)\(", built.device_source()))
    assert set(sources) == declared and len(declared) > 30
    funcs = kernel_funcs(built)
    assert {k for k in sources if not any(k.startswith(f"{f}_kernel") for f in funcs)} == set()
    assert {f for f in funcs if not any(k.startswith(f"{f}_kernel") for k in sources)} == set()
    assert {f"___tvm_ffi_{f}" for f in funcs} <= info["defined"]
    assert "___tvm_ffi__library_bin" in info["defined"]
    # Bound at load from the process (kiln's Python Engine has TVM loaded): TVM's runtime only.
    assert info["undefined"] and all(s.startswith("_TVM") for s in info["undefined"])
    for name, src in sources.items():
        assert src.count("{") == src.count("}") and re.search(rf"kernel void {name}\(", src)


def test_ios_static_library_registers_the_same_kernels(metal, tiny_dirs, tmp_path):
    built, dylib = metal
    art = kiln.compile(str(tiny_dirs["tied"]), target="ios", quant="q4f16", output=tmp_path / "ios")
    with tarfile.open(art / "lib.tar") as tar:
        objects = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    infos = {n: macho(data) for n, data in objects.items()}
    assert all(i["filetype"] == _MH_OBJECT and i["platform"] == "ios" for i in infos.values())
    assert metal_sources(objects["devc.o"]) == metal_sources(dylib)      # the same device code as macOS
    defined = set().union(*(i["defined"] for i in infos.values()))
    assert {f"___tvm_ffi_{f}" for f in kernel_funcs(built)} <= defined
    # A system library: each object registers its functions with TVM's runtime at start-up.
    assert all("_TVMFFIEnvModRegisterSystemLibSymbol" in i["undefined"] for i in infos.values())
