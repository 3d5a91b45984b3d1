"""The NCCL-compatible C library in the installed wheel: `python -m mscclpp_rs.nccl` names it, and
its C ABI works when loaded with ctypes (one rank on the host backend, no torchrun); its JAX copy
(SONAME libnccl.so.2) is the same library and wins the bare name XLA dlopen()s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import mscclpp_rs

# ncclGetVersion's answer: NCCL_VERSION_CODE in nccl/src/abi.rs where the checkout is here.
_ABI_RS = Path(__file__).resolve().parents[2] / "nccl" / "src" / "abi.rs"


# The children run outside python/, whose source package (no extension, no library) would
# otherwise shadow the installed one for `python -m`.
_ELSEWHERE = tempfile.gettempdir()


def _expected_version() -> int:
    if _ABI_RS.is_file():
        m = re.search(r"NCCL_VERSION_CODE:\s*c_int\s*=\s*(\d+)", _ABI_RS.read_text())
        assert m, f"no NCCL_VERSION_CODE in {_ABI_RS}"
        return int(m.group(1))
    return 22803


def _cli(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "mscclpp_rs.nccl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"python -m mscclpp_rs.nccl {args}: rc {r.returncode}\n{r.stderr}"
    return r.stdout


def test_nccl_cli_path_is_the_wheels_library():
    path = _cli("--path").strip()
    assert os.path.isabs(path), path
    assert os.path.isfile(path), path
    assert os.path.basename(path) == "libmscclpp_nccl.so"
    # The installed package's copy, not one in the source tree.
    pkg = os.path.dirname(os.path.abspath(mscclpp_rs.__file__))
    assert os.path.dirname(path) == os.path.join(pkg, "lib"), (path, pkg)
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    from mscclpp_rs.nccl import library_path

    assert library_path() == path


def test_nccl_cli_prints_the_ld_preload_line_and_the_jax_line():
    path = _cli("--path").strip()
    jax = _cli("--jax-path").strip()
    out = _cli()
    lines = out.splitlines()
    assert lines[0] == path
    preload = [ln for ln in lines if ln.startswith("LD_PRELOAD=") and "torchrun" in ln]
    assert preload == [f"LD_PRELOAD={path} torchrun --nproc-per-node 8 train.py"], out
    # The JAX line preloads the copy named libnccl.so.2, keeping a preload already set; the
    # same line alone under --jax (for eval), and the torch one under --preload.
    jax_line = f"export LD_PRELOAD={jax}${{LD_PRELOAD:+:$LD_PRELOAD}}"
    assert jax_line in lines, out
    assert _cli("--jax").strip() == jax_line
    assert _cli("--preload").strip() == f"export LD_PRELOAD={path}${{LD_PRELOAD:+:$LD_PRELOAD}}"
    # A line names the copy's folder (what LD_LIBRARY_PATH would take), and no step needs
    # patchelf any more.
    assert any(os.path.dirname(jax) in ln and "LD_LIBRARY_PATH" in ln for ln in lines), out
    assert "patchelf" not in out, out


def _dt_soname(path: str) -> str | None:
    """DT_SONAME as the dynamic linker reads it: PT_DYNAMIC's entries, DT_STRTAB's address
    mapped to the file through the PT_LOAD segments (no section headers, no external tool)."""
    import struct

    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF", path
    wide = data[4] == 2
    e = "<" if data[5] == 1 else ">"
    if wide:
        (phoff,) = struct.unpack_from(e + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(e + "HH", data, 0x36)
    else:
        (phoff,) = struct.unpack_from(e + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(e + "HH", data, 0x2A)
    segments = []  # (p_type, p_offset, p_vaddr, p_filesz)
    for i in range(phnum):
        h = phoff + i * phentsize
        if wide:
            t, _flags, off, vaddr, _paddr, filesz = struct.unpack_from(e + "IIQQQQ", data, h)
        else:
            t, off, vaddr, _paddr, filesz = struct.unpack_from(e + "IIIII", data, h)
        segments.append((t, off, vaddr, filesz))

    def file_offset(addr: int) -> int:
        for t, off, vaddr, filesz in segments:
            if t == 1 and vaddr <= addr < vaddr + filesz:  # PT_LOAD
                return off + addr - vaddr
        raise AssertionError(f"{path}: address {addr:#x} is in no PT_LOAD segment")

    dynamic = [s for s in segments if s[0] == 2]  # PT_DYNAMIC
    assert len(dynamic) == 1, f"{path}: {len(dynamic)} PT_DYNAMIC segments"
    _, off, _, filesz = dynamic[0]
    fmt = e + ("qQ" if wide else "iI")
    tags = {}
    for at in range(off, off + filesz, struct.calcsize(fmt)):
        tag, val = struct.unpack_from(fmt, data, at)
        if tag == 0:  # DT_NULL
            break
        tags.setdefault(tag, val)
    if 14 not in tags:  # DT_SONAME
        return None
    start = file_offset(tags[5]) + tags[14]  # DT_STRTAB + the name's offset in it
    return data[start : data.index(b"\0", start)].decode()


def test_jax_copy_is_the_library_with_soname_libnccl_so_2():
    path = _cli("--path").strip()
    jax = _cli("--jax-path").strip()
    pkg = os.path.dirname(os.path.abspath(mscclpp_rs.__file__))
    assert jax == os.path.join(pkg, "lib", "nccl", "libnccl.so.2"), jax
    # Alone in its folder: putting the folder on a search path adds nothing else.
    assert os.listdir(os.path.dirname(jax)) == ["libnccl.so.2"]
    from mscclpp_rs.nccl import jax_library_path

    assert jax_library_path() == jax
    assert _dt_soname(jax) == "libnccl.so.2"
    assert _dt_soname(path) == "libmscclpp_nccl.so"
    # The same library: only the name's bytes differ (the new name and its terminator).
    a, b = Path(path).read_bytes(), Path(jax).read_bytes()
    assert len(a) == len(b)
    diff = [i for i in range(len(a)) if a[i] != b[i]] if a != b else []
    assert diff and diff[-1] - diff[0] < len("libnccl.so.2") + 1, diff[:20]


# The copy loaded privately from its path, as XLA's handle would be: ncclGetVersion answers, and
# the bare name libnccl.so.2 (what XLA dlopen()s) now resolves to this very object.
_JAX_LOAD = r"""
import ctypes, os, sys
path, want = sys.argv[1], int(sys.argv[2])
lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
v = ctypes.c_int(0)
rc = lib.ncclGetVersion(ctypes.byref(v))
assert rc == 0 and v.value == want, (rc, v.value, want)
bare = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
assert bare._handle == lib._handle, "libnccl.so.2 resolves to another object"
assert lib.mscclppNcclShim() == 1
print("ok", v.value)
"""


def test_jax_copy_loads_and_answers_ncclGetVersion():
    jax = _cli("--jax-path").strip()
    want = _expected_version()
    r = subprocess.run(
        [sys.executable, "-c", _JAX_LOAD, jax, str(want)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, MSCCLPP_BACKEND="host"),
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert r.stdout.split() == ["ok", str(want)], r.stdout


# What JAX's CUDA plugin does, then XLA: load a libnccl.so.2 by its path (the nvidia-nccl wheel's;
# here another file of the same SONAME), then dlopen("libnccl.so.2"). Prints which one the bare
# name gave: "ours" (the copy the environment preloaded) or "other".
_JAX_ORDER = r"""
import ctypes, os, sys
ours, other = sys.argv[1], sys.argv[2]
o = ctypes.CDLL(other, mode=os.RTLD_LOCAL)
bare = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_LOCAL)
loaded = ctypes.CDLL(ours, mode=os.RTLD_NOLOAD) if "LD_PRELOAD" in os.environ else None
print("ours" if loaded is not None and bare._handle == loaded._handle
      else "other" if bare._handle == o._handle else "neither")
"""


def test_jax_line_wins_over_a_later_libnccl_by_path(tmp_path):
    import shutil

    jax = _cli("--jax-path").strip()
    other = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    other.parent.mkdir(parents=True)
    shutil.copyfile(jax, other)  # another inode of the same SONAME
    env = dict(os.environ, MSCCLPP_BACKEND="host", PY=sys.executable)
    env.pop("LD_PRELOAD", None)
    # The printed line itself, eval'd by a shell, as the docs say to use it.
    script = 'eval "$("$PY" -m mscclpp_rs.nccl --jax)" && exec "$PY" -c "$0" "$1" "$2"'
    r = subprocess.run(
        ["bash", "-c", script, _JAX_ORDER, jax, str(other)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert r.stdout.strip() == "ours", r.stdout
    # LD_LIBRARY_PATH alone loses to the load by path (why the line preloads instead).
    env["LD_LIBRARY_PATH"] = os.path.dirname(jax)
    r = subprocess.run(
        [sys.executable, "-c", _JAX_ORDER, jax, str(other)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert r.stdout.strip() == "other", r.stdout


# Run in a child process: MSCCLPP_BACKEND must be set before the library first looks at it, and
# the library's threads and globals stay out of the pytest process.
_SMOKE = r"""
import ctypes, math, sys
from ctypes import POINTER, Structure, byref, c_char, c_char_p, c_float, c_int, c_size_t, c_void_p

path, want_version = sys.argv[1], int(sys.argv[2])
lib = ctypes.CDLL(path)

class UniqueId(Structure):
    _fields_ = [("internal", c_char * 128)]

lib.ncclGetErrorString.restype = c_char_p
lib.ncclGetErrorString.argtypes = [c_int]
lib.ncclGetLastError.restype = c_char_p
lib.ncclGetLastError.argtypes = [c_void_p]
lib.ncclGetVersion.argtypes = [POINTER(c_int)]
lib.ncclGetUniqueId.argtypes = [POINTER(UniqueId)]
lib.ncclCommInitRank.argtypes = [POINTER(c_void_p), c_int, UniqueId, c_int]
lib.ncclCommCount.argtypes = [c_void_p, POINTER(c_int)]
lib.ncclMemAlloc.argtypes = [POINTER(c_void_p), c_size_t]
lib.ncclMemFree.argtypes = [c_void_p]
lib.ncclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]
lib.ncclCommDestroy.argtypes = [c_void_p]

def check(name, rc, comm=None):
    if rc != 0:
        sys.exit(f"{name} returned {rc} ({lib.ncclGetErrorString(rc)!r}): "
                 f"{lib.ncclGetLastError(comm)!r}")

v = c_int(0)
check("ncclGetVersion", lib.ncclGetVersion(byref(v)))
assert v.value == want_version, f"ncclGetVersion gave {v.value}, want {want_version}"

uid = UniqueId()
check("ncclGetUniqueId", lib.ncclGetUniqueId(byref(uid)))
assert any(uid.internal), "ncclGetUniqueId left the id zero"
comm = c_void_p()
check("ncclCommInitRank", lib.ncclCommInitRank(byref(comm), 1, uid, 0))
assert comm.value, "ncclCommInitRank gave a NULL comm"
n = c_int(0)
check("ncclCommCount", lib.ncclCommCount(comm, byref(n)), comm)
assert n.value == 1, n.value

N = 4099  # not a multiple of any vector width
send, recv = c_void_p(), c_void_p()
check("ncclMemAlloc", lib.ncclMemAlloc(byref(send), 4 * N))
check("ncclMemAlloc", lib.ncclMemAlloc(byref(recv), 4 * (N + 1)))
# Host-backend device memory is this process's memory.
s = (c_float * N).from_address(send.value)
r = (c_float * (N + 1)).from_address(recv.value)
for i in range(N):
    s[i] = float(i % 97) - 48.5
for i in range(N + 1):
    r[i] = math.nan
# ncclFloat32 = 7, ncclSum = 0; NULL stream: the communicator's own (host backend)
check("ncclAllReduce", lib.ncclAllReduce(send, recv, N, 7, 0, comm, None), comm)
got = list(r[:N])
want = [float(i % 97) - 48.5 for i in range(N)]
assert got == want, f"first difference at {next(i for i in range(N) if got[i] != want[i])}"
assert math.isnan(r[N]), "ncclAllReduce wrote past the end of recvbuff"
# in place, ncclMax = 2: one rank's max is its own value
check("ncclAllReduce in place", lib.ncclAllReduce(send, send, N, 7, 2, comm, None), comm)
assert list(s) == want
check("ncclMemFree", lib.ncclMemFree(send))
check("ncclMemFree", lib.ncclMemFree(recv))
check("ncclCommDestroy", lib.ncclCommDestroy(comm))
print("ok", v.value)
"""


def test_nccl_c_abi_one_rank_all_reduce_on_host_backend():
    path = _cli("--path").strip()
    env = dict(os.environ, MSCCLPP_BACKEND="host")
    want = _expected_version()
    r = subprocess.run(
        [sys.executable, "-c", _SMOKE, path, str(want)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert r.stdout.split() == ["ok", str(want)], r.stdout
