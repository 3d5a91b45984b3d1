//! `ncclCollConfig_t` (NCCL 2.31–2.32): how the `nccl*Config` collectives read a caller's
//! per-call configuration ([`read`]) and what of it this library applies ([`Tuning`]).
//!
//! The header is checked as NCCL checks it (`ncclInvalidArgument` naming the field): `size` at
//! least 2.31's struct, the magic, `forceAlgSelection` 0 or 1, `CTAPolicy` unset or a
//! combination of the `NCCL_CTA_POLICY_*` bits. `version` NCCL does not check beyond choosing
//! how much to copy; a version older than 2.31 (when the struct appeared) cannot come from
//! `NCCL_COLLCONFIG_INITIALIZER`, so it is refused too, naming the field. At most `size` bytes
//! are read (a longer, newer struct as far as this library knows it).
//!
//! What each field does here (said at `NCCL_DEBUG=INFO`, subsystem `TUNING`):
//! - `algSelection`: a name of one of this library's algorithms (`ll`, `ll-short`, `ll128`,
//!   `direct`, `read`, `ce`; the first one named) becomes the call's algorithm, collectives'
//!   per-call override of its policy (`CollectiveCall::algorithm`); NCCL's own names (`Ring`,
//!   `Tree`, `NVLS`, `NVLSTree`, `CollNetDirect`, `CollNetChain`, `PAT`) and exclusions (`^…`)
//!   have no counterpart here and are advisory (the policy chooses); any other name cannot be
//!   honoured: an error with `forceAlgSelection` 1 (NCCL's default and behaviour), the policy's
//!   choice with 0. With 0, an algorithm of ours that cannot serve the call on this backend or
//!   at this size also falls back to the policy's choice (as NCCL falls back to automatic).
//! - `CTAPolicy`: `NCCL_CTA_POLICY_ZERO` (no SMs) asks for the copy-engine algorithm (`ce`)
//!   where no algorithm was named, falling back to the policy's choice where the copy engines
//!   cannot serve the call (NCCL's zero-CTA path is a preference too); `EFFICIENCY` is advisory
//!   (the algorithms size their own grids). `NCCL_CTA_POLICY` in the environment wins over the
//!   per-call value, as in NCCL.
//! - `minCTAs`, `maxCTAs`, `nvlsCTAs`, `cgaClusterSize`: advisory (the algorithms size their own
//!   grids; there is no NVLS pool); `userProfilerTag`: advisory (no profiler plugins here).
//! - `launchCompletionEvent` (2.32): recorded on the call's stream right after the call is
//!   enqueued ([`Tuning::launch_event`]). NCCL records it when the call's kernel has launched,
//!   so that work waiting on it may start beside the kernel; here it completes when the call
//!   has run — later, never earlier, so whatever waits on it is ordered after the launch too.
//! - `ext`: ignored, each option logged: NCCL's header says the official library ignores every
//!   extension, and this library defines no vendor options.
//!
//! The same configuration must be given on every rank (NCCL's rule), so every rank makes the
//! same choice of algorithm.

use std::ffi::{c_char, c_int};

use mscclpp::collectives::AlgorithmId;

use crate::abi::*;
use crate::error::{Failure, Res};
use crate::route::Op;

/// What a per-call configuration changes in how a call runs: the caller side's [`Tuning`].
pub use mscclpp_caller::Tuning;

/// Log target of the decisions (NCCL's `TUNING` subsystem).
const TUNING: &str = crate::debug::TUNING;
/// `NCCL_VERSION(2, 31, 0)`: the first version with `ncclCollConfig_t`.
const COLL_CONFIG_SINCE: u32 = 23100;
/// `NCCL_VERSION(2, 32, 0)`: the version that appended `launchCompletionEvent`.
const LAUNCH_EVENT_SINCE: u32 = 23200;
/// Most `ext` options logged (the list is the caller's, promised not to be circular).
const EXT_LOGGED: usize = 64;
/// NCCL's algorithm names: no counterpart here.
const NCCL_ALGORITHMS: [&str; 7] = [
    "ring",
    "tree",
    "nvls",
    "nvlstree",
    "collnetdirect",
    "collnetchain",
    "pat",
];

/// Whether `op` runs one of collectives' algorithms (`ncclReduce` runs all-reduces); `None`
/// is a call that runs as sends and receives.
fn has_algorithms(op: Option<Op>) -> bool {
    op.is_some_and(|o| o == Op::Reduce || o.collective().is_some())
}

/// Reads at most 256 bytes of a C string.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string (or at least 256 readable bytes).
unsafe fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    let mut bytes = Vec::new();
    for i in 0..256 {
        // SAFETY: within the string or its first 256 bytes (caller's contract).
        let b = unsafe { p.add(i).read() } as u8;
        if b == 0 {
            break;
        }
        bytes.push(b);
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Copies the caller's struct as NCCL does (at most `size` bytes, at most ours) after checking
/// that `size` covers the header and 2.31's fields.
///
/// # Safety
/// `config` is non-NULL and points to `size` readable bytes that start with an
/// `ncclCollConfig_t` header.
unsafe fn copy_in(config: *const NcclCollConfig) -> Res<NcclCollConfig> {
    // SAFETY: every ncclCollConfig_t starts with its size (caller's contract).
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    if size < COLL_CONFIG_MIN_SIZE {
        return Err(Failure::argument(format!(
            "config->size {size} is smaller than NCCL 2.31's ncclCollConfig_t ({COLL_CONFIG_MIN_SIZE} bytes): initialise it with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    let mut raw = NcclCollConfig::INITIALIZER;
    let n = size.min(std::mem::size_of::<NcclCollConfig>());
    // SAFETY: `n` bytes of the caller's struct (at most its size) into ours, which has room for
    // them; both are plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            (&mut raw as *mut NcclCollConfig).cast::<u8>(),
            n,
        )
    };
    if raw.magic != NCCL_API_MAGIC {
        return Err(Failure::argument(format!(
            "config->magic {:#x}, expected {NCCL_API_MAGIC:#x}: initialise the ncclCollConfig_t with NCCL_COLLCONFIG_INITIALIZER",
            raw.magic
        )));
    }
    if raw.version < COLL_CONFIG_SINCE {
        return Err(Failure::argument(format!(
            "config->version {}: ncclCollConfig_t exists from NCCL 2.31 ({COLL_CONFIG_SINCE}); initialise it with NCCL_COLLCONFIG_INITIALIZER",
            raw.version
        )));
    }
    if raw.version < LAUNCH_EVENT_SINCE || n < std::mem::size_of::<NcclCollConfig>() {
        // A 2.31 caller's struct has no event: what was copied past its end is not its.
        raw.launch_completion_event = std::ptr::null_mut();
    }
    Ok(raw)
}

/// The algorithm of ours `token` names (`MSCCLPP_ALGO_*`'s spelling, any case).
fn ours(token: &str) -> Option<AlgorithmId> {
    AlgorithmId::ALL
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(token))
}

/// What `algSelection` asks of `op`, given `forceAlgSelection`.
fn selection(sel: &str, force: bool, op: Option<Op>, name: &str) -> Res<Tuning> {
    let tokens: Vec<&str> = sel
        .split([',', ' ', '|'])
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() {
        return Ok(Tuning::default());
    }
    if !has_algorithms(op) {
        tracing::info!(
            target: TUNING,
            "{name}: config->algSelection {sel:?} is advisory: this call runs as sends and receives, which have no algorithms to choose"
        );
        return Ok(Tuning::default());
    }
    if let Some(a) = tokens.iter().find_map(|t| ours(t)) {
        tracing::info!(
            target: TUNING,
            "{name}: config->algSelection {sel:?}: this call takes the {a} algorithm (forceAlgSelection {})",
            u8::from(force)
        );
        return Ok(Tuning {
            algorithm: Some(a),
            fallback: !force,
            launch_event: None,
        });
    }
    let known = |t: &&str| {
        let t = t.trim_start_matches('^').to_ascii_lowercase();
        NCCL_ALGORITHMS.contains(&t.as_str())
    };
    if tokens.iter().all(known) {
        tracing::info!(
            target: TUNING,
            "{name}: config->algSelection {sel:?} names NCCL's algorithms, which have no counterpart here: advisory, the policy chooses"
        );
        return Ok(Tuning::default());
    }
    if force {
        return Err(Failure::argument(format!(
            "config->algSelection {sel:?} cannot be honoured: expected one of this library's algorithms ({}) or NCCL's ({}); set forceAlgSelection = 0 to fall back to automatic selection",
            AlgorithmId::ALL.map(AlgorithmId::name).join(", "),
            "Ring, Tree, NVLS, NVLSTree, CollNetDirect, CollNetChain, PAT"
        )));
    }
    tracing::info!(
        target: TUNING,
        "{name}: config->algSelection {sel:?} cannot be honoured; falling back to automatic selection (forceAlgSelection 0)"
    );
    Ok(Tuning::default())
}

/// What `CTAPolicy` asks of `op` where no algorithm was named.
fn cta_policy(policy: c_int, op: Option<Op>, name: &str) -> Tuning {
    if policy == NCCL_CONFIG_UNDEF_INT {
        return Tuning::default();
    }
    if mscclpp::hal::env::get("NCCL_CTA_POLICY").is_some() {
        tracing::info!(
            target: TUNING,
            "{name}: config->CTAPolicy {policy} ignored: NCCL_CTA_POLICY is set, and the environment wins (as in NCCL)"
        );
        return Tuning::default();
    }
    if policy & NCCL_CTA_POLICY_ZERO != 0 && has_algorithms(op) {
        tracing::info!(
            target: TUNING,
            "{name}: config->CTAPolicy {policy} (NCCL_CTA_POLICY_ZERO): the copy-engine algorithm (ce) where it serves the call, else the policy's choice"
        );
        return Tuning {
            algorithm: Some(AlgorithmId::Ce),
            fallback: true,
            launch_event: None,
        };
    }
    tracing::info!(
        target: TUNING,
        "{name}: config->CTAPolicy {policy} is advisory: this library's algorithms size their own grids"
    );
    Tuning::default()
}

/// Logs the `ext` options (ignored).
///
/// # Safety
/// `ext` is NULL or the head of a non-circular list of valid `ncclConfigExt_t`.
unsafe fn log_ext(mut ext: *const NcclConfigExt, name: &str) {
    let mut n = 0;
    while !ext.is_null() && n < EXT_LOGGED {
        // SAFETY: a node of the caller's list (contract).
        let e = unsafe { ext.read() };
        tracing::info!(
            target: TUNING,
            "{name}: config->ext option (vendorId {}, optionId {}) ignored: this library defines no vendor options (NCCL ignores every extension too)",
            e.vendor_id,
            e.option_id
        );
        ext = e.next;
        n += 1;
    }
}

/// Reads the `ncclCollConfig_t` of a call of `op` (`None`: one that runs as sends and receives,
/// `ncclGather` / `ncclScatter`) made through the export `name`: NULL is the defaults (the
/// plain call). See the module's text for what each field does.
///
/// # Safety
/// `config` must be NULL or point to `size` readable bytes starting with an `ncclCollConfig_t`
/// header, whose `algSelection` is NULL or a C string and whose `ext` is NULL or a
/// non-circular list of valid options.
pub unsafe fn read(config: *const NcclCollConfig, op: Option<Op>, name: &str) -> Res<Tuning> {
    if config.is_null() {
        return Ok(Tuning::default());
    }
    // SAFETY: non-NULL; the caller's contract.
    let raw = unsafe { copy_in(config)? };
    if raw.force_alg_selection != 0 && raw.force_alg_selection != 1 {
        return Err(Failure::argument(format!(
            "config->forceAlgSelection {} must be 0 or 1",
            raw.force_alg_selection
        )));
    }
    let all = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
    if raw.cta_policy != NCCL_CONFIG_UNDEF_INT && !(0..=all).contains(&raw.cta_policy) {
        return Err(Failure::argument(format!(
            "config->CTAPolicy {} is not a combination of NCCL_CTA_POLICY_* bits (0 to {all})",
            raw.cta_policy
        )));
    }
    let launch_event =
        (!raw.launch_completion_event.is_null()).then_some(raw.launch_completion_event as u64);
    // SAFETY: the caller's list (contract).
    unsafe { log_ext(raw.ext, name) };
    let advisory = [
        ("minCTAs", raw.min_ctas),
        ("maxCTAs", raw.max_ctas),
        ("nvlsCTAs", raw.nvls_ctas),
        ("cgaClusterSize", raw.cga_cluster_size),
    ];
    for (field, v) in advisory {
        if v != NCCL_CONFIG_UNDEF_INT {
            tracing::info!(
                target: TUNING,
                "{name}: config->{field} {v} is advisory: this library's algorithms size their own grids"
            );
        }
    }
    if raw.user_profiler_tag != 0 {
        tracing::info!(
            target: TUNING,
            "{name}: config->userProfilerTag {:#x} is advisory: no profiler plugin runs here",
            raw.user_profiler_tag
        );
    }
    // SAFETY: NULL or the caller's C string (contract).
    let sel = unsafe { c_string(raw.alg_selection) }.unwrap_or_default();
    let picked = selection(&sel, raw.force_alg_selection == 1, op, name)?;
    if picked.algorithm.is_some() {
        if raw.cta_policy != NCCL_CONFIG_UNDEF_INT {
            tracing::info!(
                target: TUNING,
                "{name}: config->CTAPolicy {} yields to the algorithm algSelection names",
                raw.cta_policy
            );
        }
        return Ok(Tuning {
            launch_event,
            ..picked
        });
    }
    Ok(Tuning {
        launch_event,
        ..cta_policy(raw.cta_policy, op, name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_of(c: &NcclCollConfig, op: Op) -> Res<Tuning> {
        // SAFETY: a whole, initialised config; its strings are C strings.
        unsafe { read(c, Some(op), "test") }
    }

    #[test]
    fn header_checks_name_the_field() {
        let mut c = NcclCollConfig::INITIALIZER;
        assert_eq!(read_of(&c, Op::AllReduce).unwrap(), Tuning::default());
        c.size = 40;
        let e = read_of(&c, Op::AllReduce).unwrap_err();
        assert_eq!(e.code, NCCL_INVALID_ARGUMENT);
        assert!(e.message.contains("config->size 40"), "{}", e.message);
        c = NcclCollConfig::INITIALIZER;
        c.magic = 1;
        let e = read_of(&c, Op::AllReduce).unwrap_err();
        assert!(e.message.contains("config->magic"), "{}", e.message);
        c = NcclCollConfig::INITIALIZER;
        c.version = 22803;
        let e = read_of(&c, Op::AllReduce).unwrap_err();
        assert!(e.message.contains("config->version"), "{}", e.message);
        c = NcclCollConfig::INITIALIZER;
        c.force_alg_selection = 2;
        let e = read_of(&c, Op::AllReduce).unwrap_err();
        assert!(e.message.contains("forceAlgSelection"), "{}", e.message);
        c = NcclCollConfig::INITIALIZER;
        c.cta_policy = 9;
        let e = read_of(&c, Op::AllReduce).unwrap_err();
        assert!(e.message.contains("CTAPolicy"), "{}", e.message);
        c = NcclCollConfig::INITIALIZER;
        c.launch_completion_event = 8 as *mut std::ffi::c_void;
        assert_eq!(read_of(&c, Op::AllReduce).unwrap().launch_event, Some(8));
        // A 2.31 caller's 64 bytes: the event slot is not its, so it is not read.
        c.size = COLL_CONFIG_MIN_SIZE;
        c.version = 23102;
        assert_eq!(read_of(&c, Op::AllReduce).unwrap(), Tuning::default());
    }

    #[test]
    fn algorithms_and_policies_map() {
        let mut c = NcclCollConfig::INITIALIZER;
        c.alg_selection = c"direct".as_ptr();
        let p = read_of(&c, Op::AllGather).unwrap();
        assert_eq!(p.algorithm, Some(AlgorithmId::Direct));
        assert!(!p.fallback);
        c.alg_selection = c"Ring,Tree".as_ptr();
        assert_eq!(read_of(&c, Op::AllGather).unwrap(), Tuning::default());
        c.alg_selection = c"warp-drive".as_ptr();
        let e = read_of(&c, Op::AllGather).unwrap_err();
        assert!(e.message.contains("algSelection"), "{}", e.message);
        c.force_alg_selection = 0;
        assert_eq!(read_of(&c, Op::AllGather).unwrap(), Tuning::default());
        c.alg_selection = c"LL128".as_ptr();
        let p = read_of(&c, Op::AllReduce).unwrap();
        assert_eq!(p.algorithm, Some(AlgorithmId::Ll128));
        assert!(p.fallback);
        c = NcclCollConfig::INITIALIZER;
        c.cta_policy = NCCL_CTA_POLICY_ZERO;
        let p = read_of(&c, Op::AllToAll).unwrap();
        assert_eq!(p.algorithm, Some(AlgorithmId::Ce));
        assert!(p.fallback);
        c.cta_policy = NCCL_CTA_POLICY_EFFICIENCY;
        assert_eq!(read_of(&c, Op::AllToAll).unwrap(), Tuning::default());
        // Gather and scatter run as sends and receives: nothing to choose.
        c.alg_selection = c"direct".as_ptr();
        // SAFETY: as in read_of.
        let p = unsafe { read(&c, None, "test") }.unwrap();
        assert_eq!(p, Tuning::default());
    }

    #[test]
    fn ext_options_are_ignored() {
        let mut second = NcclConfigExt {
            next: std::ptr::null_mut(),
            vendor_id: 77,
            option_id: 2,
            val: std::ptr::null_mut(),
        };
        let first = NcclConfigExt {
            next: &mut second,
            vendor_id: 77,
            option_id: 1,
            val: std::ptr::null_mut(),
        };
        let mut c = NcclCollConfig::INITIALIZER;
        c.ext = (&first as *const NcclConfigExt).cast_mut();
        assert_eq!(read_of(&c, Op::AllReduce).unwrap(), Tuning::default());
    }
}
