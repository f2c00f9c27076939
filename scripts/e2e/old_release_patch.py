#!/usr/bin/env python3
"""Mark the symbol-version references of a shared object weak when this system's libraries lack them.

    python scripts/e2e/old_release_patch.py SITE-PACKAGES/vllm/_C.abi3.so

Used by old_release_venv.sh (NOT in CI). vLLM's old CPU wheels (0.10.2, 0.11.2) were built against a
newer glibc/libstdc++ than Debian 12's and their ``_C.abi3.so`` needs, e.g., ``GLIBC_2.38``
(``__isoc23_strtol``) or ``GLIBCXX_3.4.32`` (``std::ios_base_library_init``). The dynamic loader refuses
to load an object whose required version its library lacks, unless the reference carries
``VER_FLG_WEAK``: then it loads, and the symbol binds to any unversioned definition found first (the
preloaded ``libvllm-old-preload.so``). This sets that flag (``vna_flags |= 2`` in ``.gnu.version_r``)
for exactly the versions the installed libraries do not define, in place (a ``.orig`` copy is kept),
and prints what it changed. Idempotent.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

VER_FLG_WEAK = 0x2
LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")


def defined_versions(lib: str) -> set[str] | None:
    """The version names a system library defines (readelf's version definitions), None if not found."""
    for d in LIB_DIRS:
        p = Path(d) / lib
        if p.exists():
            out = subprocess.run(["readelf", "-V", "--wide", str(p)], capture_output=True, text=True, check=True).stdout
            names: set[str] = set()
            in_def = False
            for line in out.splitlines():
                if line.startswith("Version definition"):
                    in_def = True
                elif line.startswith("Version needs") or line.startswith("Version symbols"):
                    in_def = False
                elif in_def and "Name:" in line:
                    names.add(line.split("Name:")[1].split()[0])
            return names
    return None


def _cstr(data: bytearray, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def patch(path: Path) -> list[str]:
    data = bytearray(path.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"{path}: not a 64-bit little-endian ELF")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        _name, sh_type, _fl, _addr, sh_offset, sh_size, sh_link, sh_info = struct.unpack_from("<IIQQQQII", data, off)
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_info))
    SHT_GNU_VERNEED = 0x6FFFFFFE
    changed: list[str] = []
    for sh_type, off, _size, link, count in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][1]
        vn = off
        for _ in range(count):
            _ver, cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, vn)
            lib = _cstr(data, strtab + vn_file)
            have = defined_versions(lib)
            aux = vn + vn_aux
            for _ in range(cnt):
                _h, flags, _other, name_off, aux_next = struct.unpack_from("<IHHII", data, aux)
                name = _cstr(data, strtab + name_off)
                if have is not None and name not in have:
                    if not flags & VER_FLG_WEAK:
                        struct.pack_into("<H", data, aux + 4, flags | VER_FLG_WEAK)
                        changed.append(f"{lib}: {name} -> weak")
                    else:
                        changed.append(f"{lib}: {name} already weak")
                aux += aux_next
            if not vn_next:
                break
            vn += vn_next
    if any(c.endswith("-> weak") for c in changed):
        orig = path.with_name(path.name + ".orig")
        if not orig.exists():
            shutil.copyfile(path, orig)
        path.write_bytes(bytes(data))
    return changed


def main() -> int:
    for arg in sys.argv[1:]:
        for line in patch(Path(arg)) or ["nothing to change"]:
            print(f"{arg}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
