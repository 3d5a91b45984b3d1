//! Every function NCCL's current headers declare must be this library's: under `LD_PRELOAD`, a
//! function left undefined resolves to the real `libnccl.so`, which would be handed our handle.
//! The declarations are read from the headers themselves (`nccl.h` and `nccl_device/host.h`
//! under `MSCCLPP_NCCL_INCLUDE`; CI installs them from PyPI's `nvidia-nccl-cu13` wheel, see
//! `ci/install-toolchains.sh`), so a newer NCCL's additions fail this test until they are
//! exported. Without the variable the test is skipped, saying so; with
//! `MSCCLPP_REQUIRE_NCCL_HEADERS=1` it fails instead.

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::path::PathBuf;

use libtest_mimic::Failed;

use crate::support::open_lib;

/// The headers read, relative to the include directory.
const HEADERS: [&str; 2] = ["nccl.h", "nccl_device/host.h"];

/// The text of a header without comments, preprocessor lines (and their `\` continuations:
/// the initializer macros) and string literals' contents. Declarations inside `#if` branches
/// are kept: a function declared for any build must be exported.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    // Comments first (a `/* */` may span lines; `//` ends at the line's end).
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    if d == '\n' {
                        out.push('\n');
                    }
                    prev = d;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    let mut code = String::with_capacity(out.len());
    let mut continued = false;
    for line in out.lines() {
        let directive = continued || line.trim_start().starts_with('#');
        continued = directive && line.trim_end().ends_with('\\');
        if !directive {
            code.push_str(line);
            code.push(' ');
        }
    }
    code
}

/// `code` without its `__attribute__((…))` (GCC attributes: `deprecated("…")` before
/// `ncclResetDebugInit`), whose parentheses would otherwise come before the function's.
fn without_attributes(code: &str) -> String {
    const ATTR: &str = "__attribute__";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let after = &rest[at + ATTR.len()..];
        // Skip the balanced parentheses that follow (the attribute list).
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth > 0 => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                c if depth == 0 && !c.is_whitespace() => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.push(' ');
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The names of the functions (`ncclX` and `pncclX`) `text` declares: each statement (split at
/// `;`, `{` and `}`, so that struct bodies and `extern "C" {` fall apart into their members) with
/// a parameter list, not a `typedef`, whose name before the first `(` is NCCL's. A declaration
/// may span lines; a function-pointer member (`(*f)(…)`) is not a declaration.
pub fn declared_functions(text: &str) -> BTreeSet<String> {
    let code = without_attributes(&code_of(text));
    let mut names = BTreeSet::new();
    for stmt in code.split([';', '{', '}']) {
        let stmt = stmt.trim();
        let Some(open) = stmt.find('(') else {
            continue;
        };
        if stmt.starts_with("typedef") || stmt[open + 1..].trim_start().starts_with('*') {
            continue;
        }
        let before = stmt[..open].trim_end();
        let name: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let bare = name.strip_prefix('p').unwrap_or(&name);
        let is_nccl = bare
            .strip_prefix("nccl")
            .and_then(|r| r.chars().next())
            .is_some_and(|c| c.is_ascii_uppercase());
        if is_nccl && name.len() < before.len() {
            names.insert(name);
        }
    }
    names
}

/// The include directory, or why there is none (`Ok(None)`: skip).
fn include_dir() -> Result<Option<PathBuf>, String> {
    let required = std::env::var("MSCCLPP_REQUIRE_NCCL_HEADERS").is_ok_and(|v| v == "1");
    let missing = |why: String| {
        if required {
            Err(format!("{why} (MSCCLPP_REQUIRE_NCCL_HEADERS=1)"))
        } else {
            println!("skipped: {why}");
            Ok(None)
        }
    };
    let Some(dir) = std::env::var_os("MSCCLPP_NCCL_INCLUDE") else {
        return missing(
            "MSCCLPP_NCCL_INCLUDE is not set (the directory of NCCL's nccl.h; ci/install-toolchains.sh installs it from the nvidia-nccl-cu13 wheel)".into(),
        );
    };
    let dir = PathBuf::from(dir);
    for h in HEADERS {
        if !dir.join(h).is_file() {
            return missing(format!("{} has no {h}", dir.display()));
        }
    }
    Ok(Some(dir))
}

/// The trial: every declared function resolves in the library, or the missing ones are listed.
pub fn every_header_function_is_exported() -> Result<(), Failed> {
    let Some(dir) = include_dir()? else {
        return Ok(());
    };
    let lib = open_lib()?;
    let mut missing = Vec::new();
    let mut counts = Vec::new();
    for h in HEADERS {
        let p = dir.join(h);
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let names = declared_functions(&text);
        if names.is_empty() {
            return Err(format!("{}: no NCCL function declarations found", p.display()).into());
        }
        counts.push(format!("{h}: {}", names.len()));
        for n in names {
            // SAFETY: only the address is looked up.
            if unsafe { lib.get::<*const c_void>(format!("{n}\0").as_bytes()) }.is_err() {
                missing.push(format!("{n} ({h})"));
            }
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "{} functions of the headers in {} are not exported: {}",
            missing.len(),
            dir.display(),
            missing.join(", ")
        )
        .into());
    }
    println!("every declared function exported ({})", counts.join(", "));
    Ok(())
}

/// The parser on what NCCL's headers contain: multi-line declarations, attributes, comments,
/// initializer macros, `#if` branches, struct members (function pointers too), C++ defaults.
pub fn parser_reads_declarations() -> Result<(), Failed> {
    let sample = r#"
#define NCCL_VERSION(X,Y,Z) ((X) * 10000 + (Y) * 100 + (Z))
#define NCCL_CONFIG_INITIALIZER {                \
  sizeof(ncclConfig_t), /* size */               \
  ncclFake(1),                                   \
}
#ifdef __cplusplus
extern "C" {
#endif
typedef struct ncclCollConfig_v23200 {
  size_t size;
  ncclResult_t (*ncclHook)(int);
  const char* algSelection;
} ncclCollConfig_t;
typedef ncclResult_t (*ncclFnPtr_t)(void);
/* ncclCommented(void); */
// ncclAlsoCommented(int x);
ncclResult_t  ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
    const ncclCollConfig_t* config);
ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff,
    size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
    cudaStream_t stream, const ncclCollConfig_t* config);
const char*  ncclGetErrorString(ncclResult_t result);
  __attribute__ ((deprecated("ncclResetDebugInit is not supported")))
  void  ncclResetDebugInit();
#if defined(NCCL_OS_WINDOWS)
NCCL_EXTERN_C ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2,
                                                          ncclGinOutboxHandle* outHandle);
#endif
#if __cplusplus
NCCL_EXTERN_C ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode = NCCL_CFT_TEAM_FLAT);
#else
NCCL_EXTERN_C ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode);
#endif
int notNccl(int);
#ifdef __cplusplus
}
#endif
"#;
    let got = declared_functions(sample);
    let want: BTreeSet<String> = [
        "ncclAllReduceConfig",
        "pncclAllReduceConfig",
        "ncclGetErrorString",
        "ncclResetDebugInit",
        "ncclGinOutboxCreateRequirement",
        "ncclTeamCft",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    if got != want {
        return Err(format!("parsed {got:?}, expected {want:?}").into());
    }
    Ok(())
}
