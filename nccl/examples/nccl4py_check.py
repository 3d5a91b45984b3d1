#!/usr/bin/env python3
"""nccl4py (NVIDIA's Python binding, PyPI ``nccl4py``, built for NCCL 2.32) over our library:
every host call nccl4py makes, one PASS/FAIL/XFAIL line per case and rank, and a SUMMARY line.

How nccl4py finds libnccl: ``nccl.bindings._internal.nccl`` resolves every function at its
first call with ``dlsym`` on the handle that ``cuda.pathfinder.load_nvidia_dynamic_lib("nccl")``
returns. pathfinder (1.8) first looks for the ``nvidia-nccl`` wheel's file in site-packages, then
asks ``dlopen("libnccl.so.2", RTLD_NOLOAD)`` whether an object of that name is already loaded,
and *that wins* over the wheel's file; only when neither is there does it ``dlopen`` the bare
name (``LD_LIBRARY_PATH``). glibc answers a bare name with an already-loaded object whose
``DT_SONAME`` is that name. So nccl4py reaches our library when a copy of it whose SONAME is
``libnccl.so.2`` is loaded before nccl4py's first call; ``LD_LIBRARY_PATH`` alone does not do
(PyTorch's venv carries ``nvidia-nccl``, found first), nor does ``LD_PRELOAD`` of
``libmscclpp_nccl.so`` (another SONAME: ``dlsym`` on the real NCCL's handle never sees it).

This script makes that copy itself: the library named by ``--lib`` or ``MSCCLPP_NCCL_SO``
(default: the repository's ``target/release/libmscclpp_nccl.so``, else ``target/debug``, else
the installed wheel's ``mscclpp_rs/lib/nccl/libnccl.so.2``) is copied into a temporary directory
as ``libnccl.so.2`` with its SONAME set in Python (:func:`soname_copy`, no patchelf): an existing
DT_SONAME string is overwritten; cargo's cdylib has none, so a dynamic entry the loader can spare
(a second DT_NULL, else DT_DEBUG, else DT_FLAGS_1 = NOW where DT_FLAGS = BIND_NOW says the same,
else the DT_RELACOUNT hint) becomes DT_SONAME, its string the name of a weak undefined symbol no
object defines (``__gmon_start__``, ``_ITM_*``) overwritten with ``libnccl.so.2`` (the symbol
stays weak, undefined, 0). A library whose SONAME is already ``libnccl.so.2`` (the wheel's
copy) is used as it is. Each rank then loads it before nccl4py:

- ``--mechanism dlopen`` (default): ``ctypes.CDLL(copy, RTLD_GLOBAL)`` first thing in the rank;
- ``--mechanism preload``: the ranks start with ``LD_PRELOAD=copy``.

Each rank checks that the library nccl4py loaded is ours (``get_library_path()`` is the copy,
``ncclGetVersion`` is ``--expect-version``, default 23206 = 2.32.6, ``mscclppNcclZeroCopyCalls``
is exported) and that every one of nccl4py's ``dlsym`` look-ups found its function.

    pip install --no-deps --target DIR nccl4py-0.6.0-cp312-*.whl   # or unzip the wheel into DIR
    PYTHONPATH=DIR MSCCLPP_NCCL_SO=target/release/libmscclpp_nccl.so \\
        /opt/torch/.venv/bin/python3 nccl/examples/nccl4py_check.py --nproc 2
    python3 nccl/examples/nccl4py_check.py --make-copy DIR   # only the copy (no GPU, no nccl4py)

Needs cuda.core, cuda.bindings, cuda.pathfinder, NumPy and CuPy (the buffers); PyTorch is used
when importable (bfloat16 and float8 buffers; nccl4py imports it anyway to resolve a buffer).
Ranks are started here (multiprocessing 'spawn'); rank 0 makes the unique ids and hands them on.
Ranks use device ``rank % device_count``, so ranks may share one GPU. Every result is checked
against a NumPy reference on random data, outputs poisoned first.

Result lines: ``[rank R] PASS nccl4py_<case>``, ``FAIL`` (wrong result, unexpected error, hang),
``XFAIL`` (a call NCCL serves that this library refuses by design and says so with
``ncclInvalidUsage``/``ncclInvalidArgument``: the device API, one-sided RMA, grow, suspend,
simulation, PSK encryption; the line gives the library's message). Exits non-zero if any case
FAILed or any rank died.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import multiprocessing as mp
import os
import queue
import shutil
import struct
import sys
import tempfile
import time
import traceback

SONAME = "libnccl.so.2"
EXPECT_VERSION = 23206

# ---------------------------------------------------------------------------------------------
# ELF: a copy of the library whose DT_SONAME is libnccl.so.2

DT_NULL, DT_STRTAB, DT_SONAME, DT_DEBUG, DT_FLAGS = 0, 5, 14, 21, 30
DT_RELACOUNT, DT_RELCOUNT, DT_FLAGS_1 = 0x6FFFFFF9, 0x6FFFFFFA, 0x6FFFFFFB
DF_BIND_NOW, DF_1_NOW = 0x8, 0x1
DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_VERNEED, DT_VERNEEDNUM = 1, 15, 29, 0x6FFFFFFE, 0x6FFFFFFF
DT_SYMTAB, DT_SYMENT, DT_GNU_HASH, DT_HASH = 6, 11, 0x6FFFFEF5, 4
# weak undefined symbols no object defines: their names may become the SONAME
SPARE_NAMES = (b"__gmon_start__", b"_ITM_deregisterTMCloneTable", b"_ITM_registerTMCloneTable")


class Elf:
    """Just enough of an ELF64 little-endian shared object: its dynamic entries and strings."""

    def __init__(self, data: bytearray, path: str):
        self.data, self.path = data, path
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{path}: not a little-endian ELF64 file")
        phoff = struct.unpack_from("<Q", data, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        self.loads, self.dyn = [], None
        for i in range(phnum):
            p_type, _f, off, vaddr, _p, filesz, _m, _a = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                self.loads.append((vaddr, off, filesz))
            elif p_type == 2:  # PT_DYNAMIC
                self.dyn = (off, filesz)
        if self.dyn is None:
            raise ValueError(f"{path}: no PT_DYNAMIC (not a shared object?)")
        self.entries = []  # (file offset of the entry, tag, value), up to and including DT_NULLs
        for off in range(self.dyn[0], self.dyn[0] + self.dyn[1] - 15, 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            self.entries.append((off, tag, val))
        self.tags = {}
        for _o, tag, val in self.entries:
            if tag == DT_NULL:
                break
            self.tags.setdefault(tag, val)
        if DT_STRTAB not in self.tags:
            raise ValueError(f"{path}: no DT_STRTAB")
        self.strtab = self.file_off(self.tags[DT_STRTAB])

    def file_off(self, vaddr: int) -> int:
        for va, off, size in self.loads:
            if va <= vaddr < va + size:
                return off + vaddr - va
        raise ValueError(f"{self.path}: address {vaddr:#x} is in no PT_LOAD")

    def string(self, off: int) -> bytes:
        at = self.strtab + off
        return bytes(self.data[at:self.data.index(b"\0", at)])

    def soname(self) -> str | None:
        v = self.tags.get(DT_SONAME)
        return None if v is None else self.string(v).decode()

    def string_refs(self) -> set[int]:
        """Every .dynstr offset the dynamic linker reads: dynamic entries, symbols, version needs."""
        refs = {v for _o, t, v in self.entries if t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)}
        symtab, syment = self.tags.get(DT_SYMTAB), self.tags.get(DT_SYMENT, 24)
        if symtab is not None:
            # the symbol count is not in the dynamic section: read up to the string table, which
            # follows .dynsym in every layout ld/lld/gold write
            start, end = self.file_off(symtab), self.strtab
            if end <= start:
                raise ValueError(f"{self.path}: .dynstr does not follow .dynsym; cannot count symbols")
            for off in range(start, end - syment + 1, syment):
                refs.add(struct.unpack_from("<I", self.data, off)[0])
        if DT_VERNEED in self.tags:
            off = self.file_off(self.tags[DT_VERNEED])
            for _ in range(self.tags.get(DT_VERNEEDNUM, 0)):
                _ver, cnt, file, aux, nxt = struct.unpack_from("<HHIII", self.data, off)
                refs.add(file)
                a = off + aux
                for _ in range(cnt):
                    _h, _fl, _o, name, anext = struct.unpack_from("<IHHII", self.data, a)
                    refs.add(name)
                    if not anext:
                        break
                    a += anext
                if not nxt:
                    break
                off += nxt
        return refs


def soname_copy(src: str, dst: str, soname: str = SONAME) -> str:
    """Writes ``dst``, a copy of ``src`` whose DT_SONAME is ``soname``; returns what was done."""
    data = bytearray(open(src, "rb").read())
    elf = Elf(data, src)
    new = soname.encode()
    old = elf.soname()
    if old == soname:
        how = f"SONAME already {soname}"
    elif old is not None:
        at = elf.strtab + elf.tags[DT_SONAME]
        if len(old) < len(new):
            raise ValueError(f"{src}: its SONAME {old!r} is shorter than {soname!r}")
        shared = [r for r in elf.string_refs() if elf.tags[DT_SONAME] < r <= elf.tags[DT_SONAME] + len(old)]
        if shared:
            raise ValueError(f"{src}: the SONAME string {old!r} is shared with other names")
        data[at:at + len(old) + 1] = new + b"\0" * (len(old) + 1 - len(new))
        how = f"SONAME {old} overwritten"
    else:
        # a dynamic entry to turn into DT_SONAME
        slot = None
        nulls = [o for o, t, _v in elf.entries if t == DT_NULL]
        if len(nulls) >= 2:
            slot, what = nulls[0], "a spare DT_NULL"
        for o, t, v in elf.entries:
            if slot is not None:
                break
            if t == DT_DEBUG:
                slot, what = o, "DT_DEBUG"
        if slot is None and elf.tags.get(DT_FLAGS_1) == DF_1_NOW and elf.tags.get(DT_FLAGS, 0) & DF_BIND_NOW:
            slot = next(o for o, t, _v in elf.entries if t == DT_FLAGS_1)
            what = "DT_FLAGS_1 = NOW (DT_FLAGS = BIND_NOW says the same)"
        for o, t, v in elf.entries:
            if slot is not None:
                break
            if t in (DT_RELACOUNT, DT_RELCOUNT):
                slot, what = o, "DT_RELACOUNT (a hint)"
        if slot is None:
            raise ValueError(f"{src}: no dynamic entry to spare for DT_SONAME (use patchelf --set-soname)")
        # a string to hold the name: one already there, else a weak undefined symbol's name
        strsz = elf.tags.get(10, 0)  # DT_STRSZ
        table = bytes(data[elf.strtab:elf.strtab + strsz])
        pos = table.find(b"\0" + new + b"\0")
        if pos >= 0:
            str_off, swhat = pos + 1, f"the existing string {soname}"
        else:
            refs = elf.string_refs()
            str_off = None
            for name in SPARE_NAMES:
                p = table.find(b"\0" + name + b"\0")
                if p < 0 or len(name) < len(new):
                    continue
                p += 1
                if any(p < r <= p + len(name) for r in refs):
                    continue  # another name ends inside it
                if not weak_undefined(elf, p):
                    continue
                str_off, swhat = p, f"the weak undefined symbol name {name.decode()}"
                data[elf.strtab + p:elf.strtab + p + len(name) + 1] = new + b"\0" * (len(name) + 1 - len(new))
                break
            if str_off is None:
                raise ValueError(f"{src}: no string to spare for the SONAME (use patchelf --set-soname)")
        struct.pack_into("<qQ", data, slot, DT_SONAME, str_off)
        how = f"DT_SONAME added in place of {what}, its string over {swhat}"
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)
    got = Elf(bytearray(open(dst, "rb").read()), dst).soname()
    if got != soname:
        raise ValueError(f"{dst}: SONAME reads {got!r} after the rewrite")
    return how


def weak_undefined(elf: Elf, name_off: int) -> bool:
    """Whether every symbol named by string offset ``name_off`` is weak and undefined."""
    symtab, syment = elf.tags.get(DT_SYMTAB), elf.tags.get(DT_SYMENT, 24)
    if symtab is None:
        return False
    seen = False
    for off in range(elf.file_off(symtab), elf.strtab - syment + 1, syment):
        st_name, st_info, _o, st_shndx = struct.unpack_from("<IBBH", elf.data, off)
        if st_name == name_off:
            seen = True
            if st_info >> 4 != 2 or st_shndx != 0:  # STB_WEAK, SHN_UNDEF
                return False
    return seen


def find_library(arg: str | None) -> str:
    for cand in (arg, os.environ.get("MSCCLPP_NCCL_SO")):
        if cand:
            if not os.path.isfile(cand):
                sys.exit(f"nccl4py_check: {cand} is not a file")
            return os.path.abspath(cand)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for sub in ("target/release", "target/debug"):
        p = os.path.join(repo, sub, "libmscclpp_nccl.so")
        if os.path.isfile(p):
            return p
    import importlib.util
    spec = importlib.util.find_spec("mscclpp_rs")  # the wheel: its libnccl.so.2 copy, else its library
    if spec and spec.submodule_search_locations:
        pkg = list(spec.submodule_search_locations)[0]
        for rel in ("lib/nccl/libnccl.so.2", "lib/libmscclpp_nccl.so"):
            if os.path.isfile(os.path.join(pkg, rel)):
                return os.path.join(pkg, rel)
    sys.exit("nccl4py_check: give --lib PATH or MSCCLPP_NCCL_SO (no target/*/libmscclpp_nccl.so)")


def prepare(lib: str, where: str) -> tuple[str, str]:
    """The path to load (a libnccl.so.2 copy in ``where``, or ``lib`` itself) and what was done."""
    if Elf(bytearray(open(lib, "rb").read()), lib).soname() == SONAME:
        return lib, f"{lib} (SONAME already {SONAME})"
    os.makedirs(where, exist_ok=True)
    dst = os.path.join(where, SONAME)
    how = soname_copy(lib, dst)
    return dst, f"{dst}, a copy of {lib}: {how}"


def check_loadable(path: str) -> int:
    """Loads ``path`` (RTLD_GLOBAL), checks that libnccl.so.2 now names it; ncclGetVersion."""
    h = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    byname = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD)
    if byname._handle != h._handle:
        raise RuntimeError(f"dlopen({SONAME}, RTLD_NOLOAD) is not {path}")
    v = ctypes.c_int(0)
    rc = h.ncclGetVersion(ctypes.byref(v))
    if rc != 0:
        raise RuntimeError(f"ncclGetVersion returned {rc}")
    if not hasattr(byname, "mscclppNcclZeroCopyCalls"):
        raise RuntimeError(f"{SONAME} lacks mscclppNcclZeroCopyCalls: not our library")
    return v.value


# ---------------------------------------------------------------------------------------------
# the ranks


class Refused(Exception):
    """A call NCCL serves that this library refuses by design (reported XFAIL)."""


def worker(rank, world, path, mechanism, expect, qs, res_q, case_timeout):
    faulthandler.dump_traceback_later(120, exit=True)
    if mechanism == "dlopen":
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # before nccl4py: pathfinder then finds it loaded
    import numpy as np
    import cupy as cp
    from cuda.core import Device
    import nccl.core as nc
    from nccl.bindings import nccl as nb

    try:
        import torch  # noqa: F401  (nccl4py imports it too when resolving a buffer)
        have_torch = True
    except ImportError:
        torch, have_torch = None, False

    NCCLError = nb.NCCLError
    ndev = cp.cuda.runtime.getDeviceCount()
    dev = rank % ndev
    cp.cuda.Device(dev).use()
    Device(dev).set_current()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    sp = stream.ptr

    def share(make):
        """Rank 0 makes a value (``make()``); every rank gets it."""
        if rank == 0:
            v = make()
            for r in range(1, world):
                qs[r].put(v)
            return v
        return qs[rank].get(timeout=90)

    def share_from(src, value):
        """Rank ``src``'s ``value`` to every rank (a value per call; others pass None)."""
        if rank == src:
            for r in range(world):
                if r != src:
                    qs[r].put(value)
            return value
        return qs[rank].get(timeout=90)

    # ----- data -----------------------------------------------------------------------------
    def vals(r, n, salt, dtype, lo=-30, hi=30):
        rng = np.random.default_rng([salt, r, n])
        return rng.integers(lo, hi + 1, n).astype(dtype)

    def host_all(n, salt, dtype, lo=-30, hi=30):
        return np.stack([vals(r, n, salt, dtype, lo, hi) for r in range(world)])

    def put(a):
        d = cp.asarray(a)
        stream.synchronize()
        return d

    def poison(n, dtype):
        out = cp.empty(n, dtype=dtype)
        k = np.dtype(dtype).kind
        out.fill(np.nan if k == "f" else (np.iinfo(dtype).max if k in "iu" else 0))
        stream.synchronize()
        return out

    def check(got, want, what, rtol=0.0):
        stream.synchronize()
        g = cp.asnumpy(got) if isinstance(got, cp.ndarray) else np.asarray(got)
        want = np.asarray(want)
        if rtol:
            ok = np.isclose(g.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol)
        else:
            ok = g == want
        if g.shape != want.shape or not np.all(ok):
            if g.shape != want.shape:
                raise AssertionError(f"{what}: shape {g.shape}, want {want.shape}")
            bad = np.flatnonzero(~ok)
            raise AssertionError(f"{what}: {bad.size} of {want.size} wrong (first at {bad[0]}: "
                                 f"got {g.flat[bad[0]]}, want {want.flat[bad[0]]})")

    def refused(e):
        """An NCCLError whose code is a deliberate refusal."""
        s = str(e)
        return isinstance(e, NCCLError) and any(k in s for k in ("INVALID_USAGE", "InvalidUsage", "invalid usage",
                                                                  "INVALID_ARGUMENT", "InvalidArgument", "invalid argument"))

    def served_or_refused(what, fn, comm=None):
        """Runs ``fn``; an ncclInvalidUsage/Argument refusal becomes Refused with the library's words."""
        try:
            return fn()
        except NCCLError as e:
            if not refused(e):
                raise
            msg = ""
            if comm is not None:
                try:
                    msg = comm.get_last_error()
                except Exception:  # noqa: BLE001
                    pass
            raise Refused(f"{what}: {e}{'; ' + msg[:200] if msg else ''}") from e

    results = {"PASS": 0, "FAIL": 0, "XFAIL": 0}
    failed = []

    def run(name, fn):
        faulthandler.dump_traceback_later(case_timeout, exit=True)
        try:
            detail = fn() or ""
            verdict = "PASS"
        except Refused as e:
            verdict, detail = "XFAIL", str(e)
        except Exception as e:  # noqa: BLE001
            verdict, detail = "FAIL", f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
            failed.append(name)
        results[verdict] += 1
        line = f"[rank {rank}] {verdict} nccl4py_{name} {detail}".rstrip()
        print(line.replace("\n", " ")[:600], flush=True)

    # ----- the library ----------------------------------------------------------------------
    def c_library():
        lp = nb.get_library_path()
        if os.path.realpath(lp) != os.path.realpath(path):
            raise AssertionError(f"nccl4py loaded {lp}, not {path}")
        v = nb.get_version()
        if expect and v != expect:
            raise AssertionError(f"ncclGetVersion {v}, expected {expect}")
        h = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD)
        if not hasattr(h, "mscclppNcclZeroCopyCalls"):
            raise AssertionError(f"{SONAME} lacks mscclppNcclZeroCopyCalls: not our library")
        info = nc.get_version()
        if info.libnccl is None or int(info.libnccl.version.major) != v // 10000:
            raise AssertionError(f"nccl.core.get_version(): {info}")
        return f"ncclGetVersion {v}; {info.libnccl}; bindings {info.nccl_bindings}, nccl4py {info.nccl4py}"

    def c_symbols():
        from nccl.bindings._internal import nccl as internal
        fp = internal._inspect_function_pointers()
        missing = sorted(k.lstrip("_") for k, v in fp.items() if not v)
        if missing:
            raise AssertionError(f"{len(missing)} of nccl4py's {len(fp)} look-ups found nothing: {missing}")
        return f"all {len(fp)} functions nccl4py looks up resolve"

    def c_error_string():
        seen = []
        for r in nb.Result:
            if r.name == "NumResults":
                continue
            s = nc.get_error_string(r)
            if not isinstance(s, str) or not s:
                raise AssertionError(f"ncclGetErrorString({r.name}) = {s!r}")
            seen.append(r.name)
        return f"{len(seen)} codes"

    def c_encryption():
        cfg = nb.EncryptionConfig()
        cfg.mode = int(nb.EncryptionMode.NONE)
        nb.set_encryption(cfg.ptr)
        psk = nb.EncryptionConfig()
        psk.mode = int(nb.EncryptionMode.PSK)
        psk.psk = "0123456789abcdef0123456789abcdef"  # the binding keeps the encoded bytes
        try:
            nb.set_encryption(psk.ptr)
        except NCCLError as e:
            if refused(e):
                raise Refused(f"mode NONE served; PSK refused: {e} (the bootstrap has no TLS)") from e
            raise
        nb.set_encryption(cfg.ptr)  # back to plaintext for what follows
        return "NONE and PSK served"

    def c_params():
        keys = list(nc.params)  # ncclParamGetAllParameterKeys
        nc.dump_params()  # ncclParamDumpAll
        if keys:
            got = {k: nc.params[k] for k in keys[:8]}  # ncclParamGetParameter
            return f"{len(keys)} keys; e.g. {next(iter(got.items()))}"
        try:
            v = nc.params["NCCL_PROTO"]
        except KeyError as e:  # nccl4py's answer to ncclInvalidArgument (an unknown key)
            raise Refused(f"the parameter registry is empty (0 keys; NCCL_PROTO unknown: {e}); "
                          "this library is configured by MSCCLPP_* variables") from e
        return f"0 keys listed, yet NCCL_PROTO = {v!r}"

    run("library_is_ours", c_library)
    if rank == 0:
        mapped = set()
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "nccl" in os.path.basename(parts[-1]) and parts[-1].endswith((".so", ".so.2")):
                    mapped.add(parts[-1])
        print(f"# nccl libraries mapped: {' '.join(sorted(mapped)) or 'none'}", flush=True)
    run("all_symbols_resolve", c_symbols)
    run("get_error_string", c_error_string)
    run("set_encryption", c_encryption)
    run("params", c_params)

    # ----- communicator ---------------------------------------------------------------------
    comm = None

    def c_init():
        nonlocal comm
        uid = share(nc.get_unique_id)
        if len(bytes(uid)) != 128:
            raise AssertionError(f"unique id of {len(bytes(uid))} bytes")
        comm = nc.Communicator.init(world, rank, uid, nc.NCCLConfig(blocking=True, comm_name="nccl4py_check"))
        return f"{comm!r}"

    run("init_rank_scalable_config", c_init)
    if comm is None:
        print(f"[rank {rank}] SUMMARY no communicator; FAILED: {failed}", flush=True)
        res_q.put((rank, failed))
        return

    def c_properties():
        if (comm.rank, comm.nranks, comm.device.device_id) != (rank, world, dev):
            raise AssertionError(f"rank/nranks/device {(comm.rank, comm.nranks, comm.device.device_id)}, "
                                 f"want {(rank, world, dev)}")
        p = comm.properties
        if (p.rank, p.n_ranks, p.cuda_dev) != (rank, world, dev):
            raise AssertionError(f"ncclCommQueryProperties: {p}")
        st = comm.get_async_error()
        if st != nb.Result.Success:
            raise AssertionError(f"ncclCommGetAsyncError: {st}")
        return f"device_api_support={p.device_api_support} multimem={p.multimem_support} gin={p.gin_type.name}"

    def c_mem_stats():
        got, why = {}, []
        for s in nc.NcclCommMemStat:
            try:
                got[s.name] = comm.get_mem_stat(s)
            except NCCLError as e:
                if not refused(e):
                    raise
                why.append(f"{s.name}: {e}")
        if got.get("GPU_MEM_SUSPENDED", 0) != 0:
            raise AssertionError(f"GPU_MEM_SUSPENDED {got['GPU_MEM_SUSPENDED']} on a communicator never suspended")
        if why:
            raise Refused(f"served {got}; refused {'; '.join(why)}")
        return f"{got}"

    run("properties", c_properties)
    run("mem_stats", c_mem_stats)

    # ----- collectives ----------------------------------------------------------------------
    NUMPY_TYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
                   np.float16, np.float32, np.float64]
    SUM, PROD, MAX, MIN, AVG = nc.SUM, nc.PROD, nc.MAX, nc.MIN, nc.AVG

    def rng_for(dt, op):
        k = np.dtype(dt).kind
        if op == PROD:
            return (1, 2) if k == "u" else (-2, 2)
        if np.dtype(dt).itemsize == 1:
            return (0, 15) if k == "u" else (-8, 8)
        return (0, 30) if k == "u" else (-30, 30)

    def reference(op, stack):
        if op == SUM:
            return stack.sum(axis=0)
        if op == PROD:
            return stack.prod(axis=0)
        if op == MAX:
            return stack.max(axis=0)
        if op == MIN:
            return stack.min(axis=0)
        return stack.astype(np.float64).mean(axis=0)

    def c_allreduce_types():
        n, done = 5003, 0
        for salt, dt in enumerate(NUMPY_TYPES):
            for op in (SUM, PROD, MAX, MIN):
                lo, hi = rng_for(dt, op)
                x, y = put(vals(rank, n, 100 + salt, dt, lo, hi)), poison(n, dt)
                comm.allreduce(x, y, op, stream=sp)
                want = reference(op, host_all(n, 100 + salt, dt, lo, hi)).astype(dt)
                check(y, want, f"{np.dtype(dt).name} {op.name}")
                done += 1
        for dt in (np.float32, np.float64):
            x, y = put(vals(rank, n, 120, dt)), poison(n, dt)
            comm.allreduce(x, y, AVG, stream=sp)
            check(y, reference(AVG, host_all(n, 120, dt)).astype(dt), f"{np.dtype(dt).name} AVG", rtol=1e-5)
            done += 1
        return f"{done} type/op pairs"

    def c_allreduce_torch_types():
        if not have_torch:
            raise Refused("torch not importable: bfloat16/float8 buffers not tried")
        tdev = torch.device("cuda", dev)
        done = []
        for tname, tdt, op, lo, hi in (("bfloat16", torch.bfloat16, SUM, -30, 30),
                                       ("bfloat16", torch.bfloat16, MAX, -30, 30),
                                       ("float8_e4m3fn", torch.float8_e4m3fn, SUM, -1, 1),
                                       ("float8_e4m3fn", torch.float8_e4m3fn, MAX, -8, 8),
                                       ("float8_e5m2", torch.float8_e5m2, SUM, -1, 1),
                                       ("float8_e5m2", torch.float8_e5m2, MIN, -8, 8)):
            n = 4099
            x = torch.from_numpy(vals(rank, n, 130, np.float32, lo, hi)).to(tdev).to(tdt)
            y = torch.full((n,), float("nan"), dtype=torch.float32, device=tdev).to(tdt)
            torch.cuda.synchronize(tdev)
            comm.allreduce(x, y, op, stream=torch.cuda.current_stream(tdev).cuda_stream)
            torch.cuda.synchronize(tdev)
            want = reference(op, host_all(n, 130, np.float32, lo, hi)).astype(np.float32)
            check(y.float().cpu().numpy(), want, f"torch {tname} {op.name}")
            done.append(f"{tname} {op.name}")
        return ", ".join(done)

    def c_allreduce_inplace():
        n = 70001
        x = put(vals(rank, n, 140, np.float32))
        comm.allreduce(x, x, SUM, stream=sp)
        check(x, host_all(n, 140, np.float32).sum(axis=0), "in place")

    # per-call configurations (ncclCollConfig_t): every field nccl4py sets
    def configs():
        ev = Device(dev).create_event()
        return [
            ("default", nc.NCCLCollConfig(), None),
            ("alg ring (NCCL's name)", nc.NCCLCollConfig(alg_selection="ring"), None),
            ("alg ring,tree no force", nc.NCCLCollConfig(alg_selection="ring,tree", force_alg_selection=False), None),
            ("cta policy ZERO", nc.NCCLCollConfig(cta_policy=nc.CTAPolicy.ZERO), None),
            ("ctas 1..4, cga 0, tag", nc.NCCLCollConfig(min_ctas=1, max_ctas=4, cga_cluster_size=0,
                                                       user_profiler_tag=42), None),
            ("vendor options", nc.NCCLCollConfig(vendor_options=(
                nc.VendorOption(vendor_id=0x6D7363, option_id=1, int_value=7),
                nc.VendorOption(vendor_id=0x6D7363, option_id=2, str_value="hello"))), None),
            ("launch completion event", nc.NCCLCollConfig(launch_completion_event=ev), ev),
        ]

    def c_allreduce_config():
        n, done = 9001, []
        for label, cfg, _ev in configs():
            x, y = put(vals(rank, n, 150, np.float32)), poison(n, np.float32)
            comm.allreduce(x, y, SUM, stream=sp, config=cfg)
            check(y, host_all(n, 150, np.float32).sum(axis=0), f"config {label}")
            done.append(label)
        # an unsatisfiable algorithm with forceAlgSelection (default 1): refused, as NCCL refuses it
        x, y = put(vals(rank, n, 151, np.float32)), poison(n, np.float32)
        try:
            comm.allreduce(x, y, SUM, stream=sp, config=nc.NCCLCollConfig(alg_selection="nosuchalgorithm"))
            stream.synchronize()
            raise AssertionError("alg_selection 'nosuchalgorithm' with force_alg_selection was accepted")
        except NCCLError:
            pass
        # and the communicator still works
        comm.allreduce(x, y, SUM, stream=sp)
        check(y, host_all(n, 151, np.float32).sum(axis=0), "after a refused config")
        return f"{len(done)} configs; bad algorithm refused"

    def one_config():
        return nc.NCCLCollConfig(alg_selection="ring", force_alg_selection=False, cta_policy=nc.CTAPolicy.DEFAULT)

    def c_broadcast(cfg):
        def f():
            for root in range(world):
                n = 6007
                x, y = put(vals(rank, n, 160 + root, np.float64)), poison(n, np.float64)
                comm.broadcast(x, y, root, stream=sp, config=cfg)
                check(y, vals(root, n, 160 + root, np.float64), f"root {root}")
        return f

    def c_bcast():
        n, root = 70000, world - 1
        x = put(vals(rank, n, 170, np.float32))
        nb.bcast(x.data.ptr, n, int(nc.FLOAT32), root, comm._comm, sp)  # ncclBcast: in place
        check(x, vals(root, n, 170, np.float32), "ncclBcast")

    def c_reduce(cfg):
        def f():
            for root in range(world):
                n = 5000
                x, y = put(vals(rank, n, 180 + root, np.int32)), poison(n, np.int32)
                comm.reduce(x, y, MAX, root=root, stream=sp, config=cfg)
                if rank == root:
                    check(y, host_all(n, 180 + root, np.int32).max(axis=0), f"root {root}")
                else:
                    check(y, np.full(n, np.iinfo(np.int32).max, np.int32), "non-root output untouched")
        return f

    def c_allgather(cfg):
        def f():
            n = 3001
            x, y = put(vals(rank, n, 190, np.float16)), poison(world * n, np.float16)
            comm.allgather(x, y, stream=sp, config=cfg)
            check(y, host_all(n, 190, np.float16).reshape(-1), "allgather")
            # in place: the send buffer is this rank's slice of the output
            z = put(np.concatenate([vals(rank, n, 191, np.float16) if r == rank else np.full(n, np.nan, np.float16)
                                    for r in range(world)]))
            comm.allgather(z[rank * n:(rank + 1) * n], z, stream=sp, config=cfg)
            check(z, host_all(n, 191, np.float16).reshape(-1), "allgather in place")
        return f

    def c_reduce_scatter(cfg):
        def f():
            n = 2048
            x, y = put(vals(rank, world * n, 200, np.int64)), poison(n, np.int64)
            comm.reduce_scatter(x, y, SUM, stream=sp, config=cfg)
            check(y, host_all(world * n, 200, np.int64).sum(axis=0)[rank * n:(rank + 1) * n], "reduce_scatter")
        return f

    def c_alltoall(cfg):
        def f():
            n = 1500
            x, y = put(vals(rank, world * n, 210, np.int32)), poison(world * n, np.int32)
            comm.alltoall(x, y, stream=sp, config=cfg)
            want = np.concatenate([vals(p, world * n, 210, np.int32)[rank * n:(rank + 1) * n] for p in range(world)])
            check(y, want, "alltoall")
        return f

    def c_gather(cfg):
        def f():
            for root in range(world):
                n = 2500
                x, y = put(vals(rank, n, 220 + root, np.float32)), poison(world * n, np.float32)
                comm.gather(x, y, root=root, stream=sp, config=cfg)
                if rank == root:
                    check(y, host_all(n, 220 + root, np.float32).reshape(-1), f"root {root}")
                else:
                    stream.synchronize()
        return f

    def c_scatter(cfg):
        def f():
            for root in range(world):
                n = 2500
                x, y = put(vals(rank, world * n, 230 + root, np.uint8, 0, 200)), poison(n, np.uint8)
                comm.scatter(x, y, root, stream=sp, config=cfg)
                check(y, vals(root, world * n, 230 + root, np.uint8, 0, 200)[rank * n:(rank + 1) * n], f"root {root}")
        return f

    def c_sendrecv_ring():
        n = 65536
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        x, y = put(vals(rank, n, 240, np.float32)), poison(n, np.float32)
        with nc.group():
            comm.send(x, nxt, stream=sp)
            comm.recv(y, prv, stream=sp)
        check(y, vals(prv, n, 240, np.float32), f"from rank {prv}")

    def c_sendrecv_pairwise():
        n = 1000
        xs = {p: put(vals(rank * world + p, n, 250, np.int32)) for p in range(world)}
        ys = {p: poison(n, np.int32) for p in range(world)}
        nc.group_start()
        for p in range(world):
            comm.send(xs[p], p, stream=sp)
            comm.recv(ys[p], p, stream=sp)
        nc.group_end()
        for p in range(world):
            check(ys[p], vals(p * world + rank, n, 250, np.int32), f"from rank {p}")

    def c_group_collectives():
        n = 4096
        a, ay = put(vals(rank, n, 260, np.float32)), poison(n, np.float32)
        b, by = put(vals(rank, n, 261, np.int32)), poison(world * n, np.int32)
        c_, cy = put(vals(rank, world * n, 262, np.float64)), poison(n, np.float64)
        with nc.group():
            comm.allreduce(a, ay, SUM, stream=sp)
            comm.allgather(b, by, stream=sp)
            comm.reduce_scatter(c_, cy, MAX, stream=sp, config=one_config())
        check(ay, host_all(n, 260, np.float32).sum(axis=0), "allreduce in group")
        check(by, host_all(n, 261, np.int32).reshape(-1), "allgather in group")
        check(cy, host_all(world * n, 262, np.float64).max(axis=0)[rank * n:(rank + 1) * n], "reduce_scatter in group")

    def c_group_simulate():
        n = 4096
        x, y = put(vals(rank, n, 270, np.float32)), poison(n, np.float32)
        nc.group_start()
        comm.allreduce(x, y, SUM, stream=sp)
        try:
            info = nc.group_end(simulate=True)
        except NCCLError as e:
            if not refused(e):
                raise
            # this library ran the operation (it enqueues as called) and ended the group
            check(y, host_all(n, 270, np.float32).sum(axis=0), "the group's operation, run")
            raise Refused(f"ncclGroupSimulateEnd: {e}; the group was ended and its all-reduce ran correctly") from e
        if not info.estimated_time >= 0:
            raise AssertionError(f"estimated time {info.estimated_time}")
        return f"estimated {info.estimated_time}"

    def c_premulsum():
        n, done = 4096, []
        x, y = put(vals(rank, n, 280, np.float32)), poison(n, np.float32)
        op = comm.create_pre_mul_sum(0.5, nc.FLOAT32)  # host scalar
        comm.allreduce(x, y, op, stream=sp)
        check(y, host_all(n, 280, np.float32).sum(axis=0) * np.float32(0.5), "host scalar 0.5")
        op.close()
        done.append("host scalar")
        s = put(np.array([0.25 * (rank + 1)], np.float64))  # device scalar: per rank
        x, y = put(vals(rank, n, 281, np.float64)), poison(n, np.float64)
        op = comm.create_pre_mul_sum(s)
        comm.allreduce(x, y, op, stream=sp)
        want = sum(vals(r, n, 281, np.float64) * (0.25 * (r + 1)) for r in range(world))
        check(y, want, "device scalar", rtol=1e-12)
        op.close()
        done.append("device scalar")
        return ", ".join(done)

    def c_mem_alloc():
        n = 8192
        buf = nc.mem_alloc(n * 4)  # ncclMemAlloc -> cuda.core Buffer
        arr = cp.from_dlpack(buf, copy=False).view(cp.float32)[:n]
        arr[...] = put(vals(rank, n, 290, np.float32))
        stream.synchronize()
        out = nc.cupy.empty(n, dtype=np.float32)  # ncclMemAlloc through nccl4py's CuPy interop
        out.fill(np.nan)
        stream.synchronize()
        comm.allreduce(arr, out, SUM, stream=sp)
        check(out, host_all(n, 290, np.float32).sum(axis=0), "ncclMemAlloc buffers")
        del arr
        nc.mem_free(buf)  # ncclMemFree

    def c_register_buffer():
        n = 1 << 16
        done = []
        for kind in ("ncclMemAlloc", "cudaMalloc"):
            x = nc.cupy.empty(n, dtype=np.float32) if kind == "ncclMemAlloc" else cp.empty(n, np.float32)
            y = nc.cupy.empty(n, dtype=np.float32) if kind == "ncclMemAlloc" else cp.empty(n, np.float32)
            x[...] = put(vals(rank, n, 300, np.float32))
            y.fill(np.nan)
            stream.synchronize()
            hx, hy = comm.register_buffer(x), comm.register_buffer(y)
            if not (hx.is_valid and hy.is_valid and hx.size == n * 4):
                raise AssertionError(f"{kind}: registration handles {hx!r} {hy!r}")
            comm.allreduce(x, y, SUM, stream=sp)
            check(y, host_all(n, 300, np.float32).sum(axis=0), f"{kind} registered")
            hx.close()
            hy.close()  # ncclCommDeregister
            done.append(kind)
        return ", ".join(done)

    def c_window():
        n = 1 << 16
        x = nc.cupy.empty(n, dtype=np.float32)
        y = nc.cupy.empty(n, dtype=np.float32)
        x[...] = put(vals(rank, n, 310, np.float32))
        y.fill(np.nan)
        stream.synchronize()
        wx = comm.register_window(x, nc.WindowFlag.COLL_SYMMETRIC)
        wy = comm.register_window(y, nc.WindowFlag.COLL_SYMMETRIC)
        if not wx.handle or not wy.handle:
            raise AssertionError(f"window handles {wx!r} {wy!r}")
        if wx.user_ptr != x.data.ptr:  # ncclWinGetUserPtr
            raise AssertionError(f"ncclWinGetUserPtr {wx.user_ptr:#x}, registered {x.data.ptr:#x}")
        comm.allreduce(x, y, SUM, stream=sp)
        check(y, host_all(n, 310, np.float32).sum(axis=0), "all-reduce between windows")
        wx.close()
        wy.close()  # ncclCommWindowDeregister
        return "registered, user pointer, all-reduce, deregistered"

    def c_window_device_pointers():
        n = 4096
        x = nc.cupy.empty(n, dtype=np.float32)
        x[...] = put(vals(rank, n, 320, np.float32))
        stream.synchronize()
        w = comm.register_window(x, nc.WindowFlag.COLL_SYMMETRIC)
        try:
            peer = (rank + 1) % world
            p = served_or_refused("ncclGetPeerDevicePointer", lambda: w.get_peer_device_pointer(peer), comm)
            comm.allreduce(put(np.zeros(1, np.float32)), poison(1, np.float32), SUM, stream=sp)  # every rank wrote
            if p:
                mem = cp.cuda.UnownedMemory(p, n * 4, w)
                check(cp.ndarray((n,), np.float32, cp.cuda.MemoryPointer(mem, 0)), vals(peer, n, 320, np.float32),
                      "peer's window read through ncclGetPeerDevicePointer")
            q = served_or_refused("ncclGetLsaDevicePointer", lambda: w.get_lsa_device_pointer(rank), comm)
            if q != x.data.ptr and q:
                pass  # an LSA pointer may be another mapping of the same memory
            return f"peer pointer {p:#x}"
        finally:
            w.close()

    def c_one_sided():
        n = 1024
        x = nc.cupy.empty(n, dtype=np.float32)  # the target: a window on every rank
        x.fill(np.nan)
        src = nc.cupy.empty(n, dtype=np.float32)  # the local buffer is a window too
        src[...] = put(vals(rank, n, 331, np.float32))
        stream.synchronize()
        w = comm.register_window(x, nc.WindowFlag.COLL_SYMMETRIC)
        ws = comm.register_window(src, nc.WindowFlag.COLL_SYMMETRIC)
        try:
            peer, prev = (rank + 1) % world, (rank - 1) % world
            served_or_refused("ncclPutSignal", lambda: comm.put_signal(src, peer, w, stream=sp), comm)
            served_or_refused("ncclWaitSignal", lambda: comm.wait_signal(
                nc.WaitSignalDesc(op_count=1, peer=prev), stream=sp), comm)
            check(x, vals(prev, n, 331, np.float32), "ncclPutSignal's data")
            served_or_refused("ncclSignal", lambda: comm.signal(peer, stream=sp), comm)
            served_or_refused("ncclWaitSignal", lambda: comm.wait_signal(
                nc.WaitSignalDesc(op_count=1, peer=prev), stream=sp), comm)
            stream.synchronize()
            return "put with signal, signal, wait"
        finally:
            stream.synchronize()
            ws.close()
            w.close()

    def c_device_api():
        t = comm.team_world  # ncclTeamWorld
        if (t.n_ranks, t.rank, t.stride) != (world, rank, 1):
            raise AssertionError(f"ncclTeamWorld {t}")
        w0 = comm.team_rank_to_world(t, 0)  # ncclTeamRankToWorld
        if w0 != 0:
            raise AssertionError(f"ncclTeamRankToWorld(world team, 0) = {w0}")
        # One host: one LSA team of every rank; the device API served, LSA and GIN of the proxy
        # type; multicast not (the properties say so).
        p = comm.properties
        if not p.device_api_support or p.n_lsa_teams != 1 or p.multimem_support or p.gin_type.name != "PROXY":
            raise AssertionError(f"ncclCommQueryProperties: {p}")
        lsa = comm.team_lsa  # ncclTeamLsa
        if (lsa.n_ranks, lsa.rank, lsa.stride) != (world, rank, 1):
            raise AssertionError(f"ncclTeamLsa {lsa}")
        rail = comm.team_rail  # ncclTeamRail
        if (rail.n_ranks, rail.rank, rail.stride) != (1, 0, world):
            raise AssertionError(f"ncclTeamRail {rail}")
        r = comm.create_dev_comm(nc.NCCLDevCommRequirements(lsa_barrier_count=4))  # ncclDevCommCreate
        try:
            # nccl4py 0.6.0 was built against NCCL 2.32.3: the 248-byte ncclDevComm of 2.31+.
            raw = ctypes.string_at(r.ptr, 248)
            magic, _version, rk, nr = struct.unpack_from("<IIii", raw, 0)
            lsa_rank, lsa_size = struct.unpack_from("<ii", raw, 20)
            table, res = struct.unpack_from("<QQ", raw, 32)
            _handle, nbar = struct.unpack_from("<Ii", raw, 80)
            got = (hex(magic), rk, nr, lsa_rank, lsa_size, nbar, table != 0, res != 0)
            if got != (hex(0xCAFEBEEF), rank, world, rank, world, 4, True, True):
                raise AssertionError(f"ncclDevComm fields {got}")
        finally:
            r.close()  # ncclDevCommDestroy
        # GIN with FULL connections: the devcomm's GIN fields (one connection of the proxy
        # type, the user's signals and counters at least).
        g = comm.create_dev_comm(nc.NCCLDevCommRequirements(
            gin_signal_count=3, gin_counter_count=2,
            gin_connection_type=nc.NcclGinConnectionType.FULL))
        try:
            raw = ctypes.string_at(g.ptr, 248)
            conns, kind = raw[96], raw[98]
            handles, = struct.unpack_from("<Q", raw, 104)
            nsig, nctr = struct.unpack_from("<ii", raw, 136)
            got = (conns, kind, handles != 0, nsig >= 3, nctr)
            if got != (1, 2, True, True, 2):
                raise AssertionError(f"GIN ncclDevComm fields {got}")
        finally:
            g.close()
        # GIN signals without a connection type: refused naming it, as NCCL refuses them.
        try:
            comm.create_dev_comm(nc.NCCLDevCommRequirements(gin_signal_count=1))
            raise AssertionError("GIN signals with connection type NONE were accepted")
        except NCCLError:
            if "NCCL_GIN_CONNECTION_NONE" not in comm.get_last_error():
                raise AssertionError(f"GIN without a connection refused without naming it: {comm.get_last_error()}")
        return "world, LSA and rail teams; a device communicator of 4 LSA barriers; one of GIN (proxy); GIN without a connection refused naming it"

    def c_bad_argument():
        n = 16
        x, y = put(vals(rank, n, 340, np.float32)), poison(n, np.float32)
        try:
            comm.reduce(x, y, SUM, root=world + 3, stream=sp)
            raise AssertionError(f"ncclReduce with root {world + 3} of {world} was accepted")
        except NCCLError as e:
            msg = comm.get_last_error()  # ncclGetLastError
            if not msg:
                raise AssertionError(f"{e}: ncclGetLastError is empty")
            st = comm.get_async_error()
            if st != nb.Result.Success:
                raise AssertionError(f"a refused argument left the communicator in {st}")
            return f"{e}; last error: {msg[:160]}"

    for name, fn in (("allreduce_types_ops", c_allreduce_types),
                     ("allreduce_bf16_fp8_torch", c_allreduce_torch_types),
                     ("allreduce_inplace", c_allreduce_inplace),
                     ("allreduce_config", c_allreduce_config),
                     ("broadcast", c_broadcast(None)), ("broadcast_config", c_broadcast(one_config())),
                     ("bcast", c_bcast),
                     ("reduce", c_reduce(None)), ("reduce_config", c_reduce(one_config())),
                     ("allgather", c_allgather(None)), ("allgather_config", c_allgather(one_config())),
                     ("reduce_scatter", c_reduce_scatter(None)),
                     ("reduce_scatter_config", c_reduce_scatter(one_config())),
                     ("alltoall", c_alltoall(None)), ("alltoall_config", c_alltoall(one_config())),
                     ("gather", c_gather(None)), ("gather_config", c_gather(one_config())),
                     ("scatter", c_scatter(None)), ("scatter_config", c_scatter(one_config())),
                     ("send_recv_ring_group", c_sendrecv_ring), ("send_recv_pairwise_group", c_sendrecv_pairwise),
                     ("group_collectives", c_group_collectives), ("group_simulate_end", c_group_simulate),
                     ("pre_mul_sum", c_premulsum), ("mem_alloc", c_mem_alloc),
                     ("register_buffer", c_register_buffer), ("window_register", c_window),
                     ("window_device_pointers", c_window_device_pointers), ("one_sided_signal", c_one_sided),
                     ("device_api_host", c_device_api), ("bad_argument_last_error", c_bad_argument)):
        run(name, fn)

    # ----- communicators from communicators -------------------------------------------------
    def c_split():
        sub = comm.split(color=0, key=world - rank)  # reversed order
        try:
            if (sub.rank, sub.nranks) != (world - 1 - rank, world):
                raise AssertionError(f"split: rank {sub.rank} of {sub.nranks}, want {world - 1 - rank} of {world}")
            n = 3000
            x, y = put(vals(rank, n, 350, np.float32)), poison(n, np.float32)
            sub.allreduce(x, y, MAX, stream=sp)
            check(y, host_all(n, 350, np.float32).max(axis=0), "all-reduce on the split")
        finally:
            sub.finalize()
            sub.destroy()
        # the last rank passes no color: it gets a null communicator
        half = comm.split(color=None if rank == world - 1 else 1)
        try:
            if rank == world - 1:
                if half.is_valid:
                    raise AssertionError("split with NCCL_SPLIT_NOCOLOR returned a communicator")
            elif half.nranks != world - 1:
                raise AssertionError(f"split of {world - 1} ranks has {half.nranks}")
        finally:
            half.destroy()
        return "reversed keys; NOCOLOR"

    def c_shrink():
        if world < 2:
            raise Refused("needs 2 ranks")
        if rank == world - 1:
            return "excluded"
        small = comm.shrink(exclude_ranks=[world - 1])
        try:
            if (small.rank, small.nranks) != (rank, world - 1):
                raise AssertionError(f"shrink: rank {small.rank} of {small.nranks}")
            n = 2000
            x, y = put(vals(rank, n, 360, np.float32)), poison(n, np.float32)
            small.allreduce(x, y, SUM, stream=sp)
            check(y, host_all(n, 360, np.float32)[:world - 1].sum(axis=0), "all-reduce on the shrunk")
        finally:
            small.destroy()
        return f"{world - 1} ranks"

    def c_grow():
        # the last rank leaves through a split; rank 0 asks the split communicator for a grow
        # id (ncclCommGetUniqueId on the communicator that grows) and the last rank comes back
        # through ncclCommGrow
        sub = comm.split(color=None if rank == world - 1 else 0)
        try:
            out = None
            if rank == 0:
                try:
                    out = ("ok", bytes(sub.get_unique_id()))
                except NCCLError as e:
                    out = ("refused" if refused(e) else "error", f"{e}; {comm.get_last_error()[:200]}")
            out = share_from(0, out)
            if out[0] == "refused":
                raise Refused(f"ncclCommGetUniqueId: {out[1]}")
            if out[0] == "error":
                raise AssertionError(out[1])
            uid = nc.UniqueId.from_bytes(out[1])
            if rank == world - 1:
                grown = nc.Communicator().grow(world, uid, rank=world - 1)
            else:
                grown = sub.grow(world, uid if rank == 0 else None)
            n = 1000
            x, y = put(vals(rank, n, 370, np.float32)), poison(n, np.float32)
            grown.allreduce(x, y, SUM, stream=sp)
            check(y, host_all(n, 370, np.float32).sum(axis=0), "all-reduce on the grown")
            grown.destroy()
        finally:
            if sub is not None:
                sub.destroy()
        return "grown back to every rank"

    def c_suspend_resume():
        why = []
        for what, fn in (("ncclCommSuspend(MEM)", lambda: comm.suspend(nc.CommSuspendFlag.MEM)),
                         ("ncclCommResume", comm.resume)):
            try:
                fn()
            except NCCLError as e:
                if not refused(e):
                    raise
                why.append(f"{what}: {e}")
        n = 1000
        x, y = put(vals(rank, n, 380, np.float32)), poison(n, np.float32)
        comm.allreduce(x, y, SUM, stream=sp)
        check(y, host_all(n, 380, np.float32).sum(axis=0), "all-reduce after suspend/resume")
        if why:
            raise Refused("; ".join(why) + "; the communicator works after")
        return "suspended and resumed"

    def wait_ready(c, what):
        t0 = time.monotonic()
        while True:
            st = c.get_async_error()
            if st == nb.Result.Success:
                return
            if st != nb.Result.InProgress:
                raise AssertionError(f"{what}: {st}")
            if time.monotonic() - t0 > 60:
                raise AssertionError(f"{what}: still in progress after 60 s")
            time.sleep(0.01)

    def c_revoke():
        sub = comm.split(color=0, key=rank)
        sub.revoke()  # ncclCommRevoke
        wait_ready(sub, "after ncclCommRevoke")
        sub.destroy()
        return "revoked, quiescent, destroyed"

    def c_abort():
        sub = comm.split(color=0, key=rank)
        n = 500
        x, y = put(vals(rank, n, 390, np.float32)), poison(n, np.float32)
        sub.allreduce(x, y, SUM, stream=sp)
        check(y, host_all(n, 390, np.float32).sum(axis=0), "before abort")
        sub.abort()  # ncclCommAbort
        if sub.is_valid:
            raise AssertionError("communicator still valid after abort")

    def c_nonblocking():
        uid = share(nc.get_unique_id)
        c = nc.Communicator.init(world, rank, uid, nc.NCCLConfig(blocking=False))
        wait_ready(c, "non-blocking init")
        n = 3000
        x, y = put(vals(rank, n, 400, np.float32)), poison(n, np.float32)
        c.allreduce(x, y, SUM, stream=sp)
        wait_ready(c, "non-blocking all-reduce")
        check(y, host_all(n, 400, np.float32).sum(axis=0), "non-blocking communicator")
        c.finalize()
        wait_ready(c, "non-blocking finalize")
        c.destroy()

    def c_init_rank_lowlevel():
        done = []
        for how in ("ncclCommInitRank", "ncclCommInitRankConfig"):
            uid = share(nc.get_unique_id)
            if how == "ncclCommInitRank":
                raw = nb.comm_init_rank(world, uid._internal, rank)
            else:
                cfg = nc.NCCLConfig(comm_name="lowlevel", cta_policy=nc.CTAPolicy.DEFAULT)._to_lowpp()
                raw = nb.comm_init_rank_config(world, uid._internal, rank, cfg.ptr)
            c = nc.Communicator._from_comm(raw)
            n = 777
            x, y = put(vals(rank, n, 410, np.int32)), poison(n, np.int32)
            c.allreduce(x, y, MIN, stream=sp)
            check(y, host_all(n, 410, np.int32).min(axis=0), how)
            c.destroy()
            done.append(how)
        return ", ".join(done)

    def c_init_all():
        comms = nc.Communicator.init_all([dev])  # ncclCommInitAll, one device
        try:
            if len(comms) != 1 or comms[0].nranks != 1:
                raise AssertionError(f"init_all([{dev}]): {comms}")
            n = 100
            x, y = put(vals(rank, n, 420, np.float32)), poison(n, np.float32)
            comms[0].allreduce(x, y, SUM, stream=sp)
            check(y, vals(rank, n, 420, np.float32), "one-rank all-reduce")
        finally:
            for c in comms:
                c.destroy()

    for name, fn in (("split", c_split), ("shrink", c_shrink), ("grow", c_grow),
                     ("suspend_resume", c_suspend_resume), ("revoke", c_revoke), ("abort", c_abort),
                     ("nonblocking_init_finalize", c_nonblocking), ("init_rank_lowlevel", c_init_rank_lowlevel),
                     ("init_all", c_init_all)):
        run(name, fn)

    def c_finalize_destroy():
        n = 256
        x, y = put(vals(rank, n, 430, np.float32)), poison(n, np.float32)
        comm.allreduce(x, y, SUM, stream=sp)
        check(y, host_all(n, 430, np.float32).sum(axis=0), "last all-reduce")
        comm.finalize()
        wait_ready(comm, "finalize")
        comm.destroy()
        if comm.is_valid:
            raise AssertionError("communicator valid after destroy")

    run("finalize_destroy", c_finalize_destroy)
    faulthandler.cancel_dump_traceback_later()
    # (no bare PASS/FAIL words here: ci/gpu-clients.sh counts those as result lines)
    print(f"[rank {rank}] SUMMARY pass={results['PASS']} xfail={results['XFAIL']} fail={results['FAIL']}"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    res_q.put((rank, failed))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--lib", help="our library (default $MSCCLPP_NCCL_SO, else target/{release,debug})")
    ap.add_argument("--mechanism", choices=("dlopen", "preload"), default="dlopen",
                    help="how a rank loads the libnccl.so.2 copy before nccl4py (default dlopen)")
    ap.add_argument("--expect-version", type=int, default=EXPECT_VERSION,
                    help="ncclGetVersion expected (0: any); default %(default)s")
    ap.add_argument("--timeout", type=float, default=420, help="seconds to wait for the ranks")
    ap.add_argument("--case-timeout", type=float, default=90, help="seconds one case may take")
    ap.add_argument("--make-copy", metavar="DIR",
                    help="only write DIR/libnccl.so.2, load it and print ncclGetVersion (no GPU needed)")
    args = ap.parse_args()
    lib = find_library(args.lib)

    if args.make_copy:
        path, how = prepare(lib, args.make_copy)
        v = check_loadable(path)
        print(f"# {how}\n# ncclGetVersion {v}\n{path}", flush=True)
        sys.exit(0 if not args.expect_version or v == args.expect_version else 1)

    tmp = tempfile.mkdtemp(prefix="nccl4py-check-")
    try:
        path, how = prepare(lib, tmp)
        print(f"# library: {how}; loaded by --mechanism {args.mechanism}", flush=True)
        if args.mechanism == "preload":
            os.environ["LD_PRELOAD"] = path + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
        ctx = mp.get_context("spawn")
        qs = [ctx.Queue() for _ in range(args.nproc)]
        res_q = ctx.Queue()
        procs = [ctx.Process(target=worker, name=f"rank{r}",
                             args=(r, args.nproc, path, args.mechanism, args.expect_version, qs, res_q,
                                   args.case_timeout))
                 for r in range(args.nproc)]
        for p in procs:
            p.start()
        results = {}
        deadline = time.monotonic() + args.timeout
        while len(results) < len(procs) and time.monotonic() < deadline:
            try:
                rank, failed = res_q.get(timeout=1)
                results[rank] = failed
            except queue.Empty:
                if all(not p.is_alive() for r, p in enumerate(procs) if r not in results):
                    break
        bad = False
        for r, p in enumerate(procs):
            p.join(timeout=30)
            if p.is_alive():
                print(f"FAIL rank {r} still running; terminating", flush=True)
                p.terminate()
                p.join(timeout=10)
                bad = True
            elif p.exitcode != 0:
                print(f"FAIL rank {r} exited with {p.exitcode}", flush=True)
                bad = True
            if r not in results or results[r]:
                bad = True
        print(f"# nccl4py_check: {args.nproc} ranks, {'FAILED' if bad else 'no case failed'}", flush=True)
        sys.exit(1 if bad else 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
