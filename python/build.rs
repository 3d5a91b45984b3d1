//! Puts the NCCL-compatible C library in the wheel: under maturin, builds `libmscclpp_nccl.so`
//! (`cargo rustc --release -p mscclpp-nccl --lib --crate-type cdylib` of the main workspace,
//! linked with the SONAME `libmscclpp_nccl.so`, into `python/target/nccl`, so a repeated
//! `pip install ./python` is incremental) and copies it to `mscclpp_rs/lib/libmscclpp_nccl.so`,
//! which maturin packs as package data (`python -m mscclpp_rs.nccl` prints its path).
//!
//! Beside it goes `mscclpp_rs/lib/nccl/libnccl.so.2`: the same bytes with the DT_SONAME string
//! rewritten to `libnccl.so.2`, for JAX. XLA `dlopen`s `libnccl.so.2` by that bare name, which
//! glibc answers with an already-loaded object of that SONAME, so preloading this copy is what
//! makes XLA use us (docs/install.md, "JAX"). The new name is shorter than the old one, so it is
//! written over the old string in `.dynstr` and nothing else in the file moves: no patchelf.
//! The wheel's own copy keeps its SONAME: under PyTorch `libnccl.so.2` would satisfy
//! `libtorch_cuda.so`'s `DT_NEEDED` and hide the real NCCL the library falls back to.
//!
//! `MSCCLPP_NCCL_SO=/path/to/libmscclpp_nccl.so` packs that file instead of building one (a
//! release pipeline that built it already, or a source tree without the main workspace); it must
//! have been linked with `-Wl,-soname,libmscclpp_nccl.so` (the JAX copy is made from it).
//! `MSCCLPP_NCCL_TARGET_DIR` moves the nested build's target directory (default
//! `python/target/nccl`; an outer `CARGO_TARGET_DIR` is not passed on).
//! Outside maturin (`cargo clippy`, `cargo build` of this crate) nothing is built unless
//! `MSCCLPP_PY_BUILD_NCCL=1`.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

const LIB: &str = "libmscclpp_nccl.so";
/// The JAX copy: its folder under `mscclpp_rs/lib` (holding nothing else, so that it can go on a
/// search path alone) and its file name, which is also its SONAME.
const JAX_DIR: &str = "nccl";
const JAX_LIB: &str = "libnccl.so.2";

fn main() {
    // Taken before anything is written: see `install`.
    let started = SystemTime::now();
    println!("cargo:rerun-if-env-changed=MSCCLPP_NCCL_SO");
    println!("cargo:rerun-if-env-changed=MSCCLPP_PY_BUILD_NCCL");
    println!("cargo:rerun-if-env-changed=MSCCLPP_NCCL_TARGET_DIR");
    // maturin sets it for every build of a pyo3 extension (`pip install`, `maturin build`/`develop`).
    println!("cargo:rerun-if-env-changed=PYO3_ENVIRONMENT_SIGNATURE");
    let under_maturin = env::var_os("PYO3_ENVIRONMENT_SIGNATURE").is_some();
    let forced = env::var_os("MSCCLPP_PY_BUILD_NCCL").is_some_and(|v| v == "1");
    if !under_maturin && !forced {
        return;
    }
    let here = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dest = here.join("mscclpp_rs").join("lib").join(LIB);
    let built = match env::var_os("MSCCLPP_NCCL_SO").filter(|v| !v.is_empty()) {
        Some(given) => {
            let given = PathBuf::from(given);
            println!("cargo:rerun-if-changed={}", given.display());
            if !given.is_file() {
                fail(&format!(
                    "MSCCLPP_NCCL_SO={} is not a file",
                    given.display()
                ));
            }
            given
        }
        None => build_nccl(&here),
    };
    let bytes = match fs::read(&built) {
        Ok(b) => b,
        Err(e) => fail(&format!("cannot read {}: {e}", built.display())),
    };
    let mut jax = bytes.clone();
    if let Err(e) = soname::rewrite(&mut jax, LIB, JAX_LIB) {
        fail(&format!(
            "making the JAX copy ({JAX_LIB}) of {}: {e}",
            built.display()
        ));
    }
    install(&bytes, &dest, started);
    install(
        &jax,
        &here
            .join("mscclpp_rs")
            .join("lib")
            .join(JAX_DIR)
            .join(JAX_LIB),
        started,
    );
}

/// `cargo rustc --release -p mscclpp-nccl --lib --crate-type cdylib` of the main workspace
/// (`../Cargo.toml`), linked with the SONAME `libmscclpp_nccl.so`; returns the built library.
///
/// `cargo rustc`, not `cargo build`: its extra arguments reach only this crate's link, so the
/// SONAME (which the JAX copy's rewrite needs: rustc gives a cdylib none) costs no rebuild of the
/// dependencies, and every build here passes the same ones (nothing flips back and forth).
fn build_nccl(here: &Path) -> PathBuf {
    let root = here.parent().expect("python/ has a parent").to_path_buf();
    let manifest = root.join("Cargo.toml");
    if !root.join("nccl").join("Cargo.toml").is_file() {
        fail(&format!(
            "the main workspace (with nccl/Cargo.toml) is not at {}: build from the repository \
             checkout, or set MSCCLPP_NCCL_SO to a built {LIB}",
            root.display()
        ));
    }
    watch_workspace(&root);
    let target_dir = env::var_os("MSCCLPP_NCCL_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| here.join("target").join("nccl"), PathBuf::from);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "rustc",
        "--release",
        "-p",
        "mscclpp-nccl",
        "--lib",
        "--crate-type",
        "cdylib",
        "--manifest-path",
    ])
    .arg(&manifest)
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(&root);
    // Cross builds (maturin --target) build the library for the same target.
    let target = env::var("TARGET").unwrap_or_default();
    let cross = !target.is_empty() && env::var("HOST").ok().as_deref() != Some(target.as_str());
    if cross {
        cmd.args(["--target", &target]);
    }
    let soname_arg = format!("-Wl,-soname,{LIB}");
    cmd.args(["--", "-C"]).arg(format!("link-arg={soname_arg}"));
    // What cargo tells this build script must not reach the nested build as its configuration:
    // the outer target dir and rustflags, this package's metadata and features, clippy's
    // wrapper. The jobserver (CARGO_MAKEFLAGS) stays, so the two builds share the cores, and
    // so do the linker settings maturin gives (`--zig`: CARGO_TARGET_<TRIPLE>_LINKER).
    for (key, _) in env::vars_os() {
        let Some(k) = key.to_str() else { continue };
        let drop = matches!(
            k,
            "CARGO_TARGET_DIR"
                | "CARGO_BUILD_TARGET_DIR"
                | "CARGO_BUILD_TARGET"
                | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "OUT_DIR"
                | "TARGET"
                | "HOST"
                | "NUM_JOBS"
                | "OPT_LEVEL"
                | "PROFILE"
                | "DEBUG"
                | "RUSTC_LINKER"
        ) || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("DEP_");
        if drop {
            cmd.env_remove(&key);
        }
    }
    // Its progress goes to this script's stderr (cargo shows it if the build fails); stdout
    // would be read as `cargo:` directives.
    cmd.stdout(Stdio::from(std::io::stderr()));
    let shown = format!(
        "{} rustc --release -p mscclpp-nccl --lib --crate-type cdylib --manifest-path {} \
         --target-dir {}{} -- -C link-arg={soname_arg}",
        Path::new(&cargo).display(),
        manifest.display(),
        target_dir.display(),
        if cross {
            format!(" --target {target}")
        } else {
            String::new()
        }
    );
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "building {LIB} for the wheel failed ({s}): `{shown}` (its output is above; \
             MSCCLPP_NCCL_SO=<a built {LIB}> skips this build)"
        )),
        Err(e) => fail(&format!(
            "building {LIB} for the wheel: cannot run `{shown}`: {e}"
        )),
    }
    let out = if cross {
        target_dir.join(&target).join("release").join(LIB)
    } else {
        target_dir.join("release").join(LIB)
    };
    if !out.is_file() {
        fail(&format!(
            "`{shown}` succeeded but left no {}",
            out.display()
        ));
    }
    out
}

/// Reruns this script when the main workspace's sources change (the nested cargo then decides
/// what to rebuild): its manifest and lock file and every crate folder beside python/.
fn watch_workspace(root: &Path) {
    for f in ["Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let skip = ["target", "python", "docs", "ci"];
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            let name = e.file_name();
            !name.to_string_lossy().starts_with('.') && !skip.iter().any(|s| OsStr::new(s) == name)
        })
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for d in dirs {
        println!("cargo:rerun-if-changed={}", d.display());
    }
}

/// Writes a library where maturin packs it. The file is dated before this run started: cargo
/// reruns a script when a watched file is newer than the run, and the file is watched (so that
/// a deleted one is made again).
fn install(bytes: &[u8], dest: &Path, started: SystemTime) {
    let dir = dest.parent().expect("dest has a folder");
    if let Err(e) = fs::create_dir_all(dir) {
        fail(&format!("cannot create {}: {e}", dir.display()));
    }
    // Through a temporary name: a process that has the old file mapped keeps it intact.
    let name = dest
        .file_name()
        .map_or_else(|| LIB.into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(".{name}.tmp"));
    if let Err(e) = fs::write(&tmp, bytes) {
        fail(&format!("cannot write {}: {e}", tmp.display()));
    }
    // Mode 0755, as the linker made the library (fs::write gives 0644 under the usual umask).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)) {
            fail(&format!("cannot chmod {}: {e}", tmp.display()));
        }
    }
    let stamp = started
        .checked_sub(Duration::from_secs(2))
        .unwrap_or(started);
    if let Err(e) = fs::File::options()
        .write(true)
        .open(&tmp)
        .and_then(|f| f.set_modified(stamp))
    {
        fail(&format!("cannot date {}: {e}", tmp.display()));
    }
    if let Err(e) = fs::rename(&tmp, dest) {
        fail(&format!(
            "cannot move {} to {}: {e}",
            tmp.display(),
            dest.display()
        ));
    }
    println!("cargo:rerun-if-changed={}", dest.display());
}

/// DT_SONAME rewriting of an ELF shared library, in place (see the top of this file for why).
mod soname {
    const SHT_DYNAMIC: u32 = 6;
    const SHT_DYNSYM: u32 = 11;
    const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
    const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
    const DT_NULL: u64 = 0;
    const DT_SONAME: u64 = 14;
    /// The dynamic tags whose value is an offset into the dynamic string table: DT_NEEDED,
    /// DT_SONAME, DT_RPATH, DT_RUNPATH, DT_CONFIG, DT_DEPAUDIT, DT_AUDIT, DT_AUXILIARY, DT_FILTER.
    const STRING_TAGS: [u64; 9] = [
        1,
        14,
        15,
        29,
        0x6fff_fefa,
        0x6fff_fefb,
        0x6fff_fefc,
        0x7fff_fffd,
        0x7fff_ffff,
    ];

    /// Reads fields of one ELF file in its class (32/64-bit) and byte order; every read is
    /// bounds-checked (the file is input, not trusted).
    struct Elf<'a> {
        b: &'a [u8],
        wide: bool,
        le: bool,
    }

    impl Elf<'_> {
        fn bytes<const N: usize>(&self, base: u64, delta: u64) -> Result<[u8; N], String> {
            let off = base
                .checked_add(delta)
                .ok_or_else(|| format!("offset {base:#x} + {delta:#x} overflows"))?;
            let start = usize::try_from(off).map_err(|_| format!("offset {off:#x} too large"))?;
            self.b
                .get(start..start.saturating_add(N))
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| format!("truncated: {N} bytes at {off:#x} past the end"))
        }
        fn u16(&self, base: u64, delta: u64) -> Result<u64, String> {
            let a = self.bytes::<2>(base, delta)?;
            Ok(u64::from(if self.le {
                u16::from_le_bytes(a)
            } else {
                u16::from_be_bytes(a)
            }))
        }
        fn u32(&self, base: u64, delta: u64) -> Result<u64, String> {
            let a = self.bytes::<4>(base, delta)?;
            Ok(u64::from(if self.le {
                u32::from_le_bytes(a)
            } else {
                u32::from_be_bytes(a)
            }))
        }
        /// An address, offset, size or dynamic-entry field: 4 or 8 bytes by class.
        fn word(&self, base: u64, delta: u64) -> Result<u64, String> {
            if !self.wide {
                return self.u32(base, delta);
            }
            let a = self.bytes::<8>(base, delta)?;
            Ok(if self.le {
                u64::from_le_bytes(a)
            } else {
                u64::from_be_bytes(a)
            })
        }
    }

    struct Section {
        kind: u32,
        offset: u64,
        size: u64,
        link: u64,
        info: u64,
        entsize: u64,
    }

    /// Rewrites the DT_SONAME string `old` to `new` (no longer than `old`), over the old string.
    /// Refuses, saying why, anything it cannot do safely: no section headers or no DT_SONAME,
    /// another SONAME, or another name of the string table that shares the bytes written (a
    /// linker may store a name as the tail of a longer one).
    pub fn rewrite(file: &mut [u8], old: &str, new: &str) -> Result<(), String> {
        if new.len() > old.len() || new.contains('\0') {
            return Err(format!("{new:?} does not fit in the space of {old:?}"));
        }
        let (at, references) = locate(file, old)?;
        // The bytes written: the new name and its terminator. A name starting in them would
        // change; one starting after them still reads the old tail up to the old terminator.
        let end = at + new.len() as u64;
        if let Some(r) = references.iter().find(|&&r| (at..=end).contains(&r)) {
            return Err(format!(
                "another name of the dynamic string table (at {r:#x}) shares the bytes of \
                 the SONAME {old:?} (at {at:#x}); rewriting it would change that name"
            ));
        }
        let start = usize::try_from(at).map_err(|_| "SONAME offset too large".to_string())?;
        let slot = file
            .get_mut(start..start + new.len() + 1)
            .ok_or("SONAME past the end of the file")?;
        slot[..new.len()].copy_from_slice(new.as_bytes());
        slot[new.len()] = 0;
        Ok(())
    }

    /// The file offset of the DT_SONAME string (checked to be `old`), and the string-table
    /// offsets of every other name the dynamic linker reads from the same table.
    fn locate(b: &[u8], old: &str) -> Result<(u64, Vec<u64>), String> {
        if b.get(..4) != Some(b"\x7fELF") {
            return Err("not an ELF file".into());
        }
        let wide = match b.get(4) {
            Some(1) => false,
            Some(2) => true,
            c => return Err(format!("unknown ELF class {c:?}")),
        };
        let le = match b.get(5) {
            Some(1) => true,
            Some(2) => false,
            d => return Err(format!("unknown ELF byte order {d:?}")),
        };
        let e = Elf { b, wide, le };
        let (shoff, shentsize, shnum) = if wide {
            (e.word(0, 0x28)?, e.u16(0, 0x3a)?, e.u16(0, 0x3c)?)
        } else {
            (e.word(0, 0x20)?, e.u16(0, 0x2e)?, e.u16(0, 0x30)?)
        };
        if shoff == 0 || shnum == 0 {
            return Err("no section headers (cannot find the dynamic string table)".into());
        }
        let mut sections = Vec::new();
        for i in 0..shnum {
            let h = shoff.saturating_add(i * shentsize);
            sections.push(if wide {
                Section {
                    kind: e.u32(h, 4)? as u32,
                    offset: e.word(h, 0x18)?,
                    size: e.word(h, 0x20)?,
                    link: e.u32(h, 0x28)?,
                    info: e.u32(h, 0x2c)?,
                    entsize: e.word(h, 0x38)?,
                }
            } else {
                Section {
                    kind: e.u32(h, 4)? as u32,
                    offset: e.word(h, 0x10)?,
                    size: e.word(h, 0x14)?,
                    link: e.u32(h, 0x18)?,
                    info: e.u32(h, 0x1c)?,
                    entsize: e.word(h, 0x24)?,
                }
            });
        }
        let dynamic = sections
            .iter()
            .find(|s| s.kind == SHT_DYNAMIC)
            .ok_or("no dynamic section: not a shared library")?;
        let strtab_index = dynamic.link;
        let strtab = usize::try_from(strtab_index)
            .ok()
            .and_then(|i| sections.get(i))
            .ok_or("the dynamic section links to no string table")?;
        let mut soname = None;
        let mut refs = Vec::new();
        let entry = if wide { 16 } else { 8 };
        let word = if wide { 8 } else { 4 };
        for k in 0..dynamic.size / entry {
            let at = dynamic.offset.saturating_add(k * entry);
            let tag = e.word(at, 0)?;
            let val = e.word(at, word)?;
            if tag == DT_NULL {
                break;
            }
            if tag == DT_SONAME && soname.is_none() {
                soname = Some(val);
            } else if STRING_TAGS.contains(&tag) {
                refs.push(val);
            }
        }
        let Some(soname) = soname else {
            return Err(format!(
                "it has no DT_SONAME (link it with -Wl,-soname,{old}, as build.rs does)"
            ));
        };
        // Every other table that names things through the same string table.
        for s in sections.iter().filter(|s| s.link == strtab_index) {
            match s.kind {
                SHT_DYNSYM => {
                    let size = if s.entsize != 0 {
                        s.entsize
                    } else if wide {
                        24
                    } else {
                        16
                    };
                    for k in 0..s.size / size {
                        refs.push(e.u32(s.offset, k.saturating_mul(size))?); // st_name
                    }
                }
                SHT_GNU_VERNEED => {
                    // Verneed: vn_cnt @2, vn_file @4, vn_aux @8, vn_next @12;
                    // Vernaux: vna_name @8, vna_next @12 (the same in both classes).
                    let mut at = s.offset;
                    for _ in 0..s.info {
                        refs.push(e.u32(at, 4)?);
                        let mut aux = at.saturating_add(e.u32(at, 8)?);
                        for _ in 0..e.u16(at, 2)? {
                            refs.push(e.u32(aux, 8)?);
                            aux = aux.saturating_add(e.u32(aux, 12)?);
                        }
                        at = at.saturating_add(e.u32(at, 12)?);
                    }
                }
                SHT_GNU_VERDEF => {
                    // Verdef: vd_cnt @6, vd_aux @12, vd_next @16; Verdaux: vda_name @0,
                    // vda_next @4.
                    let mut at = s.offset;
                    for _ in 0..s.info {
                        let mut aux = at.saturating_add(e.u32(at, 12)?);
                        for _ in 0..e.u16(at, 6)? {
                            refs.push(e.u32(aux, 0)?);
                            aux = aux.saturating_add(e.u32(aux, 4)?);
                        }
                        at = at.saturating_add(e.u32(at, 16)?);
                    }
                }
                _ => {}
            }
        }
        if soname >= strtab.size {
            return Err(format!(
                "DT_SONAME {soname:#x} lies outside its string table"
            ));
        }
        let at = strtab.offset.saturating_add(soname);
        let start = usize::try_from(at).map_err(|_| "SONAME offset too large".to_string())?;
        let name = b
            .get(start..)
            .and_then(|t| t.split(|&c| c == 0).next())
            .unwrap_or_default();
        if name != old.as_bytes() {
            return Err(format!(
                "its SONAME is {:?}, not {old:?}",
                String::from_utf8_lossy(name)
            ));
        }
        let refs = refs
            .into_iter()
            .filter(|&r| r < strtab.size)
            .map(|r| strtab.offset.saturating_add(r))
            .collect();
        Ok((at, refs))
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: mscclpp-python build script: {msg}");
    panic!("mscclpp-python build script: {msg}");
}
