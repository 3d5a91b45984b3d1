//! The device API's layouts against NCCL's own headers: for every NCCL version whose headers
//! are at hand (`MSCCLPP_NCCL_HEADERS`: a folder of `<version>/nccl.h` trees, as
//! `ci/install-toolchains.sh` fetches them from PyPI's `nvidia-nccl-cu13` wheels), a C++ program
//! printing `offsetof`/`sizeof` of every field this library reads or writes is compiled against
//! them (host compiler; the CUDA headers of `MSCCLPP_CUDA_INCLUDE`, colon-separated) and each
//! number is compared with the offsets `mscclpp_nccl::devapi::layout` uses for that version.
//! Without headers or a compiler the case is skipped with the reason
//! (`MSCCLPP_REQUIRE_DEVAPI_LAYOUT=1` makes that a failure, as CI sets it).

use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::Command;

use mscclpp_nccl::CommProperties;
use mscclpp_nccl::devapi::gin;
use mscclpp_nccl::devapi::layout::{
    self, API_MAGIC, DevCommLayout, TABLE_BYTES, TABLE_ENTRIES, WIN_COLL_SYMMETRIC, record, reqs,
};

/// `(C expression, what this library uses)` for a client of `version`.
fn expected(version: u32) -> Vec<(String, u64)> {
    let mut e: Vec<(String, u64)> = Vec::new();
    // Entries whose numbers are not offsets (the descriptor's qwords), added at the end.
    let mut extra: Vec<(String, u64)> = Vec::new();
    let mut put = |expr: &str, v: usize| e.push((expr.to_string(), v as u64));
    let l = DevCommLayout::of(version).expect("a served version");
    let o = l.offsets();
    let dc = |f: &str| format!("offsetof(ncclDevComm, {f})");
    put("sizeof(ncclDevComm)", o.size);
    if let Some(h) = o.header {
        put(&dc("magic"), h);
        put(&dc("version"), h + 4);
    }
    for (i, f) in [
        "rank",
        "nRanks",
        "nRanks_rcp32",
        "lsaRank",
        "lsaSize",
        "lsaSize_rcp32",
    ]
    .iter()
    .enumerate()
    {
        put(&dc(f), o.rank + 4 * i);
    }
    put(&dc("windowTable"), o.window_table);
    put(&dc("resourceWindow"), o.resource_window);
    put(&dc("resourceWindow_inlined"), o.inlined);
    let (flat, stride, mc) = match (o.inlined_prefix, l) {
        (Some(_), _) | (None, DevCommLayout::V2300) => (8, 24, 28),
        (None, _) => (0, 8, 12),
    };
    put(&dc("resourceWindow_inlined.lsaFlatBase"), o.inlined + flat);
    put(&dc("resourceWindow_inlined.stride4G"), o.inlined + stride);
    put(&dc("resourceWindow_inlined.mcOffset4K"), o.inlined + mc);
    if let Some(n) = o.inlined_prefix {
        put("sizeof(((ncclDevComm*)0)->resourceWindow_inlined)", n);
    }
    put(&dc("lsaMultimem"), o.lsa_multimem);
    put(&dc("lsaBarrier"), o.lsa_barrier);
    if let Some(h) = o.hybrid_lsa_barrier {
        put(&dc("hybridLsaBarrier"), h);
    }
    if let Some(le) = o.le_ids {
        put(&dc("ucLeId"), le);
        put(&dc("mcLeId"), le + 4);
    }
    put("offsetof(ncclLsaBarrierHandle, bufHandle)", 0);
    put("offsetof(ncclLsaBarrierHandle, nBarriers)", 4);
    // The window record (what ncclWindow_t points to): only appended to, so this library's
    // 104-byte record holds every version's.
    let w = |f: &str| format!("offsetof(struct ncclWindow_vidmem, {f})");
    put(&w("lsaFlatBase"), record::LSA_FLAT_BASE);
    put(&w("lsaRank"), record::LSA_RANK);
    put(&w("worldRank"), record::WORLD_RANK);
    put(&w("stride4G"), record::STRIDE4G);
    put(&w("mcOffset4K"), record::MC_OFFSET4K);
    if version >= 22807 {
        put(&w("ginOffset4K"), record::GIN_OFFSET4K);
    }
    if version >= 23203 {
        put(&w("winFlags"), record::WIN_FLAGS);
        put(&w("ucLeIdBase"), record::UC_LE_ID_BASE);
    }
    if version >= 23206 {
        put(&w("lsaPeerDelta4G"), record::LSA_PEER_DELTA4G);
        put(
            "sizeof(struct ncclWindow_vidmem)",
            layout::WINDOW_RECORD_BYTES,
        );
    }
    put("sizeof(ncclDevCommWindowTable)", TABLE_BYTES);
    put("offsetof(ncclDevCommWindowTable, next)", TABLE_ENTRIES * 24);
    put(
        "sizeof(((ncclDevCommWindowTable*)0)->entries)",
        TABLE_ENTRIES * 24,
    );
    let r = |f: &str| format!("offsetof(ncclDevCommRequirements, {f})");
    if version < 22900 {
        // 2.28: no size, magic or version; what `reqs228::versioned` copies from.
        use layout::reqs228::*;
        put(&r("resourceRequirementsList"), RESOURCE_LIST);
        put(&r("teamRequirementsList"), TEAM_LIST);
        put(&r("lsaMultimem"), LSA_MULTIMEM);
        if version < 22807 {
            put(&r("lsaBarrierCount"), LSA_BARRIER_COUNT_22803);
            put("sizeof(ncclDevCommRequirements)", BYTES_22803);
        } else {
            for (f, at) in FIELDS_22807 {
                put(&r(f), at);
            }
            put("sizeof(ncclDevCommRequirements)", BYTES_22807);
        }
    } else {
        put(&r("size"), reqs::SIZE);
        put(&r("magic"), reqs::MAGIC);
        put(&r("version"), reqs::VERSION);
        put(&r("resourceRequirementsList"), reqs::RESOURCE_LIST);
        put(&r("teamRequirementsList"), reqs::TEAM_LIST);
        put(&r("lsaMultimem"), reqs::LSA_MULTIMEM);
        put(&r("barrierCount"), reqs::BARRIER_COUNT);
        put(&r("lsaBarrierCount"), reqs::LSA_BARRIER_COUNT);
        put(&r("railGinBarrierCount"), reqs::RAIL_GIN_BARRIER_COUNT);
        put(&r("lsaLLA2ABlockCount"), reqs::LSA_LLA2A_BLOCK_COUNT);
        put(&r("lsaLLA2ASlotCount"), reqs::LSA_LLA2A_SLOT_COUNT);
        put(&r("ginForceEnable"), reqs::GIN_FORCE_ENABLE);
        put(&r("ginSignalCount"), reqs::GIN_SIGNAL_COUNT);
        put(&r("ginCounterCount"), reqs::GIN_COUNTER_COUNT);
        if version >= 22905 {
            put(&r("ginConnectionType"), reqs::GIN_CONNECTION_TYPE);
        }
        if version >= 23000 {
            put(&r("worldGinBarrierCount"), reqs::WORLD_GIN_BARRIER_COUNT);
        }
        if version >= 23100 {
            put(&r("cftCaps"), reqs::CFT_CAPS);
            put(&r("cftBarrierCount"), reqs::CFT_BARRIER_COUNT);
        }
        if version >= 23206 {
            put(&r("ginCustomArrayCount"), reqs::GIN_CUSTOM_ARRAY_COUNT);
        }
    }
    let rr = |f: &str| format!("offsetof(ncclDevResourceRequirements, {f})");
    put(&rr("next"), reqs::resource::NEXT);
    put(&rr("bufferSize"), reqs::resource::BUFFER_SIZE);
    put(&rr("bufferAlign"), reqs::resource::BUFFER_ALIGN);
    put(&rr("outBufferHandle"), reqs::resource::OUT_BUFFER_HANDLE);
    if version < 22807 {
        put(
            "sizeof(ncclDevResourceRequirements)",
            layout::reqs228::RESOURCE_BYTES_22803,
        );
    } else {
        put(&rr("ginSignalCount"), reqs::resource::GIN_SIGNAL_COUNT);
        put(&rr("ginCounterCount"), reqs::resource::GIN_COUNTER_COUNT);
        put(
            &rr("outGinSignalStart"),
            reqs::resource::OUT_GIN_SIGNAL_START,
        );
        put(
            &rr("outGinCounterStart"),
            reqs::resource::OUT_GIN_COUNTER_START,
        );
        put("sizeof(ncclDevResourceRequirements)", reqs::resource::BYTES);
    }
    put("offsetof(ncclTeamRequirements, next)", reqs::team::NEXT);
    put(
        "offsetof(ncclTeamRequirements, multimem)",
        reqs::team::MULTIMEM,
    );
    // ncclCommProperties (2.29 on).
    if version >= 22900 {
        let p = |f: &str| format!("offsetof(ncclCommProperties, {f})");
        put(&p("size"), offset_of!(CommProperties, size));
        put(&p("magic"), offset_of!(CommProperties, magic));
        put(&p("version"), offset_of!(CommProperties, version));
        put(&p("rank"), offset_of!(CommProperties, rank));
        put(&p("nRanks"), offset_of!(CommProperties, n_ranks));
        put(&p("cudaDev"), offset_of!(CommProperties, cuda_dev));
        put(&p("nvmlDev"), offset_of!(CommProperties, nvml_dev));
        put(
            &p("deviceApiSupport"),
            offset_of!(CommProperties, device_api_support),
        );
        put(
            &p("multimemSupport"),
            offset_of!(CommProperties, multimem_support),
        );
        if version >= 22905 {
            put(&p("ginType"), offset_of!(CommProperties, gin_type));
            put(&p("nLsaTeams"), offset_of!(CommProperties, n_lsa_teams));
            put(
                &p("hostRmaSupport"),
                offset_of!(CommProperties, host_rma_support),
            );
            put(
                &p("railedGinType"),
                offset_of!(CommProperties, railed_gin_type),
            );
        }
        if version >= 23100 {
            use layout::props;
            put(&p("commHash"), props::COMM_HASH);
            put(&p("ginMinStride"), props::GIN_MIN_STRIDE);
            put(&p("ginConnectionType"), props::GIN_CONNECTION_TYPE);
            put(&p("ginSupport"), props::GIN_SUPPORT);
            put(
                &p("devCommRuntimeVersionSize"),
                props::DEV_COMM_RUNTIME_VERSION_SIZE,
            );
        }
        if version >= 23200 {
            put(&p("cftSupport"), layout::props::CFT_SUPPORT);
        }
    }
    // GIN (served from 2.30.3): the devcomm's GIN fields, the proxy's per-context struct, its
    // queue slot and the op bits the proxy decodes.
    if let (Some(g), Ok(stride)) = (l.gin_offsets(), gin::context_stride(version)) {
        let hybrid = if version >= 23100 {
            "hybridDenseGinBarrier"
        } else {
            "hybridWorldGinBarrier"
        };
        if version >= 23005 {
            put(&dc(hybrid), g.hybrid_dense);
            put(&dc("ginStrongLegacySignals"), g.strong_legacy);
        }
        for (f, at) in [
            ("railGinBarrier", g.rail),
            ("ginConnectionCount", g.connection_count),
            ("ginNetDeviceTypes", g.net_device_types),
            ("ginHandles", g.handles),
            ("ginSignalCount", g.signal_count),
            ("ginCounterCount", g.counter_count),
            ("ginSignalShadows", g.shadows),
            ("ginContextCount", g.context_count),
            ("abortFlag", g.abort_flag),
            ("hybridRailGinBarrier", g.hybrid_rail),
            ("worldGinBarrier", g.world),
        ] {
            put(&dc(f), at);
        }
        if let Some((connection, context, rcp)) = g.strides {
            put(&dc("ginConnectionStride"), connection);
            put(&dc("ginContextStride"), context);
            put(&dc("ginConnectionStride_rcp32"), rcp);
        }
        put("offsetof(ncclGinBarrierHandle, signal0)", 0);
        let c = |f: &str| format!("offsetof(ncclGinProxyGpuCtx_t, {f})");
        put("sizeof(ncclGinProxyGpuCtx_t)", stride);
        for (f, at) in [
            ("nranks", gin::ctx::NRANKS),
            ("queueSize", gin::ctx::QUEUE_SIZE),
            ("queues", gin::ctx::QUEUES),
            ("pis", gin::ctx::PIS),
            ("cis", gin::ctx::CIS),
            ("counters", gin::ctx::COUNTERS),
            ("signals", gin::ctx::SIGNALS),
        ] {
            put(&c(f), at);
        }
        if version >= 23005 {
            put(&c("signalOffsets"), gin::ctx::SIGNAL_OFFSETS);
            put(&c("lastIssuedGet"), gin::ctx::LAST_ISSUED_GET);
            put(&c("lastVisibleGet"), gin::ctx::LAST_VISIBLE_GET);
        }
        if version >= 23203 {
            put(&c("flushesAllPutsOnAnySignal"), gin::ctx::FLUSHES_ALL_PUTS);
        }
        put("sizeof(ncclGinProxyGfd_t)", gin::SLOT);
        // The descriptor's bits: qwords built through the headers' bitfields against this
        // library's encoding (the inverse of what its proxy decodes), a put with a counter
        // and a signal add, then an inline put.
        let g = gin::Gfd {
            version: 3,
            op: gin::op::PUT | gin::op::COUNTER | gin::op::SIGNAL_ADD,
            size: 0x0123_4567_89ab,
            src: (0x1_2345_6789, 0x77),
            dst: (0x2_0000_1000, 0x99),
            counter: 0x12345,
            signal: 0xab_cdef,
            signal_value: 0x1122_3344_5566_7788,
            inline: 0,
        };
        let q = g.encode();
        let word = |fields: &str| {
            format!("[]{{ ncclGinProxyQword_t q; q.raw = 0; {fields} return q.raw; }}()")
        };
        let v = g.signal_value;
        for (i, fields) in [
            format!("q.header.flag = 1; q.header.version = 3; q.header.size = {:#x}ull;", g.size),
            format!("q.srcOff.flag = 1; q.srcOff.srcOff = {:#x}ull;", g.src.0),
            format!("q.srcHandle.flag = 1; q.srcHandle.srcHandle = {:#x}ull;", g.src.1),
            format!("q.dstOff.flag = 1; q.dstOff.dstOff = {:#x}ull;", g.dst.0),
            format!("q.dstHandle.flag = 1; q.dstHandle.dstHandle = {:#x}ull;", g.dst.1),
            format!(
                "q.completion.flag = 1; q.completion.counterId = {:#x}; q.completion.signalId = {:#x}; q.completion.signalValLow = {:#x};",
                g.counter,
                g.signal,
                v & 0xffff
            ),
            format!(
                "q.signalVal.flag = 1; q.signalVal.signalValLow2 = {:#x}; q.signalVal.signalValHigh = {:#x};",
                (v >> 16) & 0xffff,
                v >> 32
            ),
            format!("q.headerExt.flag = 1; q.headerExt.op = {:#x};", g.op),
        ]
        .iter()
        .enumerate()
        {
            extra.push((word(fields), q[i]));
        }
        let inline = gin::Gfd {
            op: gin::op::PUT | gin::op::INLINE,
            size: 8,
            src: (0, 0),
            inline: 0xfedc_ba98_7654_3210,
            ..g
        };
        let qi = inline.encode();
        let x = inline.inline;
        extra.push((
            word(&format!(
                "q.inlineLow.flag = 1; q.inlineLow.inlineValLow = {:#x}u; q.inlineLow.inlineValLow2 = {:#x};",
                x & 0xffff_ffff,
                (x >> 32) & 0xffff
            )),
            qi[1],
        ));
        extra.push((
            word(&format!(
                "q.inlineHigh.flag = 1; q.inlineHigh.inlineValHigh = {:#x};",
                x >> 48
            )),
            qi[2],
        ));
        // And this library reads back what it wrote.
        assert_eq!(gin::Gfd::decode(&q), g);
        assert_eq!(gin::Gfd::decode(&qi), inline);
        for (e, v) in [
            ("ncclGinProxyOpPut", gin::op::PUT),
            ("ncclGinProxyOpWithInline", gin::op::INLINE),
            ("ncclGinProxyOpWithCounter", gin::op::COUNTER),
            ("ncclGinProxyOpWithSignalInc", gin::op::SIGNAL_INC),
            ("ncclGinProxyOpWithSignalAdd", gin::op::SIGNAL_ADD),
            ("ncclGinProxyOpVASignal", gin::op::VA_SIGNAL),
            ("ncclGinProxyOpGet", gin::op::GET),
            ("ncclGinProxyOpFlush", gin::op::FLUSH),
        ] {
            put(e, v as usize);
        }
    }
    put("NCCL_WIN_COLL_SYMMETRIC", WIN_COLL_SYMMETRIC as usize);
    if version >= 22900 {
        put("NCCL_API_MAGIC", API_MAGIC as usize);
    }
    e.extend(extra);
    e
}

fn version_of(dir: &Path) -> Option<u32> {
    let h = std::fs::read_to_string(dir.join("nccl.h")).ok()?;
    let line = h
        .lines()
        .find(|l| l.starts_with("#define NCCL_VERSION_CODE"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Compiles and runs the program for `dir`'s headers; the numbers it prints, in order.
fn measure(
    dir: &Path,
    cuda: &[PathBuf],
    exprs: &[String],
    work: &Path,
) -> Result<Vec<u64>, String> {
    let mut src = String::from(
        "#include <nccl.h>\n#include <nccl_device.h>\n#include <cstdio>\n#include <cstddef>\n",
    );
    // The proxy GIN's structures, which `nccl_device.h` includes only for device code.
    let proxy = "nccl_device/gin/proxy/gin_proxy_device_host_common.h";
    if dir.join(proxy).exists() {
        src += &format!("#include <{proxy}>\n");
    }
    src += "int main() {\n";
    for e in exprs {
        src += &format!("  printf(\"%llu\\n\", (unsigned long long)({e}));\n");
    }
    src += "  return 0;\n}\n";
    let cpp = work.join("layout.cpp");
    let exe = work.join("layout");
    std::fs::write(&cpp, src).map_err(|e| e.to_string())?;
    let mut cc = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()));
    cc.args(["-std=c++17", "-w", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(dir);
    for c in cuda {
        cc.arg("-I").arg(c);
    }
    let out = cc
        .arg(&cpp)
        .output()
        .map_err(|e| format!("running the C++ compiler: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling against {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    let run = Command::new(&exe).output().map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| l.trim().parse::<u64>().map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

#[test]
fn device_api_layouts_match_nccls_headers() {
    let required = std::env::var("MSCCLPP_REQUIRE_DEVAPI_LAYOUT").is_ok_and(|v| v == "1");
    let skip = |why: String| {
        assert!(!required, "MSCCLPP_REQUIRE_DEVAPI_LAYOUT=1 but {why}");
        println!("SKIPPED device_api_layouts_match_nccls_headers: {why}");
    };
    let Some(root) = std::env::var_os("MSCCLPP_NCCL_HEADERS").map(PathBuf::from) else {
        return skip("MSCCLPP_NCCL_HEADERS names no folder of NCCL header trees (ci/install-toolchains.sh fetches them)".into());
    };
    let cuda: Vec<PathBuf> = std::env::var("MSCCLPP_CUDA_INCLUDE")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    let mut dirs: Vec<PathBuf> = match std::fs::read_dir(&root) {
        Ok(d) => d
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("nccl.h").exists())
            .collect(),
        Err(e) => return skip(format!("{}: {e}", root.display())),
    };
    dirs.sort();
    if dirs.is_empty() {
        return skip(format!("no <version>/nccl.h under {}", root.display()));
    }
    let work = std::env::temp_dir().join(format!("mscclpp-devapi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("a work folder");
    let mut wrong = Vec::new();
    let mut checked = Vec::new();
    for dir in &dirs {
        let v =
            version_of(dir).unwrap_or_else(|| panic!("no NCCL_VERSION_CODE in {}", dir.display()));
        if DevCommLayout::of(v).is_err() {
            // A version this library does not serve: its refusal is checked elsewhere.
            continue;
        }
        let exp = expected(v);
        let exprs: Vec<String> = exp.iter().map(|(e, _)| e.clone()).collect();
        let got = match measure(dir, &cuda, &exprs, &work) {
            Ok(g) => g,
            Err(e) if e.starts_with("running the C++ compiler") => return skip(e),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            got.len(),
            exp.len(),
            "{}: the program printed {} numbers",
            dir.display(),
            got.len()
        );
        for ((expr, want), g) in exp.iter().zip(&got) {
            if want != g {
                wrong.push(format!(
                    "NCCL {}: {expr} is {g} in the headers, {want} here",
                    layout::version_name(v)
                ));
            }
        }
        checked.push(format!(
            "{} ({} fields)",
            layout::version_name(v),
            exp.len()
        ));
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        wrong.is_empty(),
        "layouts differ from NCCL's headers:\n{}",
        wrong.join("\n")
    );
    assert!(
        !checked.is_empty(),
        "no served version among {}",
        root.display()
    );
    println!(
        "device API layouts match NCCL's headers: {}",
        checked.join(", ")
    );
}
