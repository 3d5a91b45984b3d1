//! The device-visible structures of NCCL's device API at the byte offsets of the headers a
//! client compiled with: `ncclDevComm` (a different layout at each minor version since 2.28),
//! the window record an `ncclWindow_t` points to (grown only by appending, so one record of the
//! newest layout serves every version), the window table, and the requirements a client passes
//! in (versioned from 2.29; 2.28's unversioned ones read through [`reqs228`]). The offsets are
//! facts read from NCCL's public headers (2.28.3 to 2.32.6) and checked against them by
//! `nccl/tests/devapi_layout.rs`.

/// `NCCL_API_MAGIC`.
pub const API_MAGIC: u32 = 0xcafe_beef;
/// Bytes of a resource handle's unit (`ncclGetResourceBufferOffset(h) = h * 128`).
pub const RESOURCE_UNIT: usize = 128;
/// `NCCL_LSA_PEER_DELTA4G_INVALID`: a peer outside the LSA team.
pub const PEER_DELTA_INVALID: i32 = i32::MIN;
/// `NCCL_LE_ID_INVALID`.
pub const LE_ID_INVALID: u32 = u32::MAX;
/// `NCCL_WIN_COLL_SYMMETRIC`.
pub const WIN_COLL_SYMMETRIC: i32 = 0x01;
/// `NCCL_WIN_REQUIRED_ALIGNMENT`: a symmetric window's offset inside its allocation.
pub const WIN_ALIGNMENT: usize = 4096;

/// A layout of `ncclDevComm`, by the version a client compiled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevCommLayout {
    /// 2.28.3: no GIN, the window record's 32 bytes inlined, 88 bytes.
    V22803,
    /// 2.28.7 to 2.28.9: 2.29.2's LSA fields, GIN fields of its own (not served), 200 bytes.
    V22807,
    /// 2.29.2, 2.29.3: no magic, 200 bytes.
    V22902,
    /// 2.29.5 to 2.29.7: an abort flag appended, 224 bytes.
    V22907,
    /// 2.30: magic and version first, 240 bytes.
    V2300,
    /// 2.31 and 2.32: the inlined resource window cut to its three fields, 248 bytes.
    V2310,
}

/// Where the fields of one layout sit (bytes from the start).
#[derive(Debug, Clone, Copy)]
pub struct DevCommOffsets {
    /// `magic` and `version` (none before 2.30).
    pub header: Option<usize>,
    /// `rank`; `nRanks`, `nRanks_rcp32`, `lsaRank`, `lsaSize`, `lsaSize_rcp32` follow, 4 bytes each.
    pub rank: usize,
    /// `windowTable`.
    pub window_table: usize,
    /// `resourceWindow`.
    pub resource_window: usize,
    /// `resourceWindow_inlined`, and how many bytes of the window record it copies (the whole
    /// record's prefix before 2.31; only `lsaFlatBase`, `stride4G`, `mcOffset4K` after).
    pub inlined: usize,
    /// Whether the inlined copy is the record's prefix (`Some(bytes)`) or the 16-byte form.
    pub inlined_prefix: Option<usize>,
    /// `lsaMultimem`.
    pub lsa_multimem: usize,
    /// `lsaBarrier`.
    pub lsa_barrier: usize,
    /// `hybridLsaBarrier` (2.30 on).
    pub hybrid_lsa_barrier: Option<usize>,
    /// `ucLeId` and `mcLeId` (2.31 on).
    pub le_ids: Option<usize>,
    /// `sizeof(ncclDevComm)`.
    pub size: usize,
}

impl DevCommLayout {
    /// The layout of a client of NCCL version `version` (`NCCL_VERSION_CODE`), or why none.
    pub fn of(version: u32) -> Result<Self, String> {
        match version {
            22803 => Ok(Self::V22803),
            22807..=22809 => Ok(Self::V22807),
            22902..=22903 => Ok(Self::V22902),
            22905..=22907 => Ok(Self::V22907),
            23000..=23099 => Ok(Self::V2300),
            23100..=23206 => Ok(Self::V2310),
            v => Err(format!(
                "a client of NCCL {}: this library serves the device API to clients built against NCCL 2.28.3, 2.28.7 to 2.28.9 and 2.29.2 to 2.32.6",
                version_name(v)
            )),
        }
    }

    /// Its offsets.
    pub fn offsets(self) -> DevCommOffsets {
        match self {
            Self::V22803 => DevCommOffsets {
                header: None,
                rank: 0,
                window_table: 24,
                resource_window: 32,
                inlined: 40,
                inlined_prefix: Some(32),
                lsa_multimem: 72,
                lsa_barrier: 80,
                hybrid_lsa_barrier: None,
                le_ids: None,
                size: 88,
            },
            Self::V22807 | Self::V22902 | Self::V22907 => DevCommOffsets {
                header: None,
                rank: 0,
                window_table: 24,
                resource_window: 32,
                inlined: 40,
                inlined_prefix: Some(72),
                lsa_multimem: 112,
                lsa_barrier: 120,
                hybrid_lsa_barrier: None,
                le_ids: None,
                size: if self == Self::V22907 { 224 } else { 200 },
            },
            Self::V2300 => DevCommOffsets {
                header: Some(0),
                rank: 8,
                window_table: 32,
                resource_window: 40,
                inlined: 48,
                // 2.30.3/2.30.4 reserve 72 bytes, 2.30.7 64: the three fields sit at the
                // record's offsets (8, 24, 28) in both; only they are written.
                inlined_prefix: None,
                lsa_multimem: 120,
                lsa_barrier: 128,
                hybrid_lsa_barrier: Some(216),
                le_ids: None,
                size: 240,
            },
            Self::V2310 => DevCommOffsets {
                header: Some(0),
                rank: 8,
                window_table: 32,
                resource_window: 40,
                inlined: 48,
                inlined_prefix: None,
                lsa_multimem: 72,
                lsa_barrier: 80,
                hybrid_lsa_barrier: Some(176),
                le_ids: Some(224),
                size: 248,
            },
        }
    }
}

/// `22907` as `2.29.7`.
pub fn version_name(v: u32) -> String {
    format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
}

/// NCCL's `idivRcp32(x)`: `0xFFFFFFFF / x`, plus one when `x` is a power of two (wrapping).
pub fn rcp32(x: u32) -> u32 {
    if x == 0 {
        return 0;
    }
    (u32::MAX / x).wrapping_add(u32::from(x.is_power_of_two()))
}

/// What a window record holds ([`WindowRecord::bytes`] lays it out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowRecord {
    /// `winHost`: this library's id of the window (the device never reads it).
    pub host_id: u64,
    /// `lsaFlatBase`: the address of LSA rank 0's copy of the window.
    pub lsa_flat_base: u64,
    /// `lsaRank`.
    pub lsa_rank: u32,
    /// `worldRank`.
    pub world_rank: u32,
    /// `stride4G`: between consecutive LSA ranks' copies, in 4 GiB.
    pub stride4g: u32,
    /// `mcOffset4K`: the window's offset in the team's range, in 4 KiB.
    pub mc_offset4k: u32,
    /// `ginOffset4K`: the window's offset in its allocation, in 4 KiB.
    pub gin_offset4k: u32,
    /// `winFlags`.
    pub flags: u32,
    /// `lsaPeerDelta4G`: the device table of each world rank's distance, in 4 GiB.
    pub peer_delta: u64,
    /// `ginWins[0..4]`: the GIN handle of the window's allocation (what the proxy resolves;
    /// non-zero and below 2^63, or a put without a signal is never posted), 0 for none.
    pub gin_handle: u64,
}

/// Bytes of the window record (2.32.6's, the superset).
pub const WINDOW_RECORD_BYTES: usize = 104;

/// Offsets of the window record's fields (`struct ncclWindow_vidmem`).
pub mod record {
    /// `winHost`.
    pub const WIN_HOST: usize = 0;
    /// `lsaFlatBase`.
    pub const LSA_FLAT_BASE: usize = 8;
    /// `lsaRank`.
    pub const LSA_RANK: usize = 16;
    /// `worldRank`.
    pub const WORLD_RANK: usize = 20;
    /// `stride4G`.
    pub const STRIDE4G: usize = 24;
    /// `mcOffset4K`.
    pub const MC_OFFSET4K: usize = 28;
    /// `ginOffset4K` (2.28.7 on).
    pub const GIN_OFFSET4K: usize = 32;
    /// `winFlags` (2.32.3 on).
    pub const WIN_FLAGS: usize = 36;
    /// `ginWins[4]` (`ginWinsDefaultBackend` from 2.31).
    pub const GIN_WINS: usize = 40;
    /// `numSegments` (2.30.7 on).
    pub const NUM_SEGMENTS: usize = 80;
    /// `ucLeIdBase` (2.32.3 on).
    pub const UC_LE_ID_BASE: usize = 88;
    /// `lsaPeerDelta4G` (2.32.6 on).
    pub const LSA_PEER_DELTA4G: usize = 96;
}

impl WindowRecord {
    /// The record as the device reads it.
    pub fn bytes(&self) -> [u8; WINDOW_RECORD_BYTES] {
        use record::*;
        let mut b = [0u8; WINDOW_RECORD_BYTES];
        put64(&mut b, WIN_HOST, self.host_id);
        put64(&mut b, LSA_FLAT_BASE, self.lsa_flat_base);
        put32(&mut b, LSA_RANK, self.lsa_rank);
        put32(&mut b, WORLD_RANK, self.world_rank);
        put32(&mut b, STRIDE4G, self.stride4g);
        put32(&mut b, MC_OFFSET4K, self.mc_offset4k);
        put32(&mut b, GIN_OFFSET4K, self.gin_offset4k);
        put32(&mut b, WIN_FLAGS, self.flags);
        // One GIN connection's handle in every slot; one segment (ginMultiSegmentWins stays
        // NULL: read only with a backend index, which is 0). No CFT, no load/store entries.
        if self.gin_handle != 0 {
            for i in 0..4 {
                put64(&mut b, GIN_WINS + 8 * i, self.gin_handle);
            }
            put32(&mut b, NUM_SEGMENTS, 1);
        }
        put32(&mut b, UC_LE_ID_BASE, LE_ID_INVALID);
        put64(&mut b, LSA_PEER_DELTA4G, self.peer_delta);
        b
    }
}

/// Offsets of `ncclCommProperties` fields that 2.31 and 2.32 appended (the earlier ones are
/// `exports_229::CommProperties`'s).
pub mod props {
    /// `uint64_t commHash`.
    pub const COMM_HASH: usize = 56;
    /// `int ginMinStride`.
    pub const GIN_MIN_STRIDE: usize = 64;
    /// `ncclGinConnectionType_t ginConnectionType`.
    pub const GIN_CONNECTION_TYPE: usize = 68;
    /// `bool ginSupport[64]`.
    pub const GIN_SUPPORT: usize = 72;
    /// `size_t devCommRuntimeVersionSize`.
    pub const DEV_COMM_RUNTIME_VERSION_SIZE: usize = 136;
    /// `bool cftSupport, cftMulticastSupport, cftCountedSupport` (2.32).
    pub const CFT_SUPPORT: usize = 144;
}

/// Entries of one window table (`ncclDevCommWindowTable`), then its `next` pointer.
pub const TABLE_ENTRIES: usize = 32;
/// Bytes of one window table.
pub const TABLE_BYTES: usize = TABLE_ENTRIES * 24 + 8;

/// One window table: `(base, size, window record)` per entry, `next`.
pub fn table_bytes(entries: &[(u64, u64, u64)], next: u64) -> [u8; TABLE_BYTES] {
    let mut b = [0u8; TABLE_BYTES];
    for (i, &(base, size, win)) in entries.iter().take(TABLE_ENTRIES).enumerate() {
        put64(&mut b, i * 24, base);
        put64(&mut b, i * 24 + 8, size);
        put64(&mut b, i * 24 + 16, win);
    }
    put64(&mut b, TABLE_ENTRIES * 24, next);
    b
}

/// What `ncclDevCommCreate` writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct DevCommValues {
    /// The client's version (written into 2.30+ layouts).
    pub version: u32,
    /// `rank`, `nRanks`.
    pub rank: u32,
    /// `nRanks`.
    pub nranks: u32,
    /// `lsaRank`.
    pub lsa_rank: u32,
    /// `lsaSize`.
    pub lsa_size: u32,
    /// `windowTable`.
    pub window_table: u64,
    /// `resourceWindow` (0 without resources).
    pub resource_window: u64,
    /// The resource window's record (its prefix is inlined).
    pub resource: WindowRecord,
    /// `lsaBarrier`: (buffer handle, barriers).
    pub lsa_barrier: (u32, u32),
    /// `hybridLsaBarrier` (2.30 on): the LSA part of `barrierCount`'s hybrid barriers.
    pub hybrid_lsa_barrier: (u32, u32),
    /// The GIN fields, where GIN was asked for.
    pub gin: Option<GinValues>,
}

/// The GIN fields of an `ncclDevComm` (one connection, of the proxy type).
#[derive(Debug, Clone, Copy, Default)]
pub struct GinValues {
    /// `ginHandles[0]`: the device array of per-context proxy structs.
    pub contexts_array: u64,
    /// `ginContextCount`.
    pub contexts: u32,
    /// `ginSignalCount`, `ginCounterCount` (every requirement's, the user's first).
    pub signals: u32,
    /// `ginCounterCount`.
    pub counters: u32,
    /// `ginSignalShadows`.
    pub shadows: u64,
    /// `ginStrongLegacySignals`.
    pub strong_legacy: bool,
    /// `abortFlag`.
    pub abort_flag: u64,
    /// `signal0` of `hybridDenseGinBarrier` (2.31+) / `hybridWorldGinBarrier` (2.30.5+).
    pub hybrid_dense: u32,
    /// `signal0` of `hybridRailGinBarrier`.
    pub hybrid_rail: u32,
    /// `signal0` of `railGinBarrier`.
    pub rail: u32,
    /// `signal0` of `worldGinBarrier`.
    pub world: u32,
}

/// `NCCL_GIN_TYPE_PROXY` (`NCCL_NET_DEVICE_GIN_PROXY`).
pub const GIN_TYPE_PROXY: u8 = 2;

impl DevCommValues {
    /// The `ncclDevComm` of `layout`.
    pub fn bytes(&self, layout: DevCommLayout) -> Vec<u8> {
        let o = layout.offsets();
        let mut b = vec![0u8; o.size];
        if let Some(h) = o.header {
            put32(&mut b, h, API_MAGIC);
            put32(&mut b, h + 4, self.version);
        }
        put32(&mut b, o.rank, self.rank);
        put32(&mut b, o.rank + 4, self.nranks);
        put32(&mut b, o.rank + 8, rcp32(self.nranks));
        put32(&mut b, o.rank + 12, self.lsa_rank);
        put32(&mut b, o.rank + 16, self.lsa_size);
        put32(&mut b, o.rank + 20, rcp32(self.lsa_size));
        put64(&mut b, o.window_table, self.window_table);
        put64(&mut b, o.resource_window, self.resource_window);
        if self.resource_window != 0 {
            match o.inlined_prefix {
                Some(n) => b[o.inlined..o.inlined + n].copy_from_slice(&self.resource.bytes()[..n]),
                None if layout == DevCommLayout::V2300 => {
                    put64(&mut b, o.inlined + 8, self.resource.lsa_flat_base);
                    put32(&mut b, o.inlined + 24, self.resource.stride4g);
                    put32(&mut b, o.inlined + 28, self.resource.mc_offset4k);
                }
                None => {
                    put64(&mut b, o.inlined, self.resource.lsa_flat_base);
                    put32(&mut b, o.inlined + 8, self.resource.stride4g);
                    put32(&mut b, o.inlined + 12, self.resource.mc_offset4k);
                }
            }
        }
        put32(&mut b, o.lsa_barrier, self.lsa_barrier.0);
        put32(&mut b, o.lsa_barrier + 4, self.lsa_barrier.1);
        if let Some(at) = o.hybrid_lsa_barrier {
            put32(&mut b, at, self.hybrid_lsa_barrier.0);
            put32(&mut b, at + 4, self.hybrid_lsa_barrier.1);
        }
        if let Some(l) = o.le_ids {
            put32(&mut b, l, LE_ID_INVALID);
            put32(&mut b, l + 4, LE_ID_INVALID);
        }
        if let Some(g) = &self.gin {
            self.put_gin(&mut b, layout, g);
        }
        b
    }

    /// The GIN fields at `layout`'s offsets (2.30 and 2.31+; GIN is not served to 2.29).
    fn put_gin(&self, b: &mut [u8], layout: DevCommLayout, g: &GinValues) {
        let Some(o) = layout.gin_offsets() else {
            return;
        };
        // 2.30.3/2.30.4 have no hybrid world barrier nor strong legacy signals (their bytes
        // there are padding).
        let old = layout == DevCommLayout::V2300 && self.version < 23005;
        if !old {
            put32(b, o.hybrid_dense, g.hybrid_dense);
            b[o.strong_legacy] = u8::from(g.strong_legacy);
        }
        put32(b, o.rail, g.rail);
        b[o.connection_count] = 1;
        b[o.net_device_types] = GIN_TYPE_PROXY;
        put64(b, o.handles, g.contexts_array);
        put32(b, o.signal_count, g.signals);
        put32(b, o.counter_count, g.counters);
        put64(b, o.shadows, g.shadows);
        put32(b, o.context_count, g.contexts);
        put64(b, o.abort_flag, g.abort_flag);
        put32(b, o.hybrid_rail, g.hybrid_rail);
        put32(b, o.world, g.world);
        if let Some((connection, context, rcp)) = o.strides {
            // backendIndex 0; connection and context strides 1 (every rank a GIN peer), the
            // connection stride's reciprocal NCCL's idivRcp32(1).
            put32(b, connection, 1);
            put32(b, context, 1);
            put32(b, rcp, rcp32(1));
        }
    }
}

/// Where `ncclDevComm`'s GIN fields sit (checked against NCCL's headers by
/// `nccl/tests/devapi_layout.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GinOffsets {
    /// `hybridDenseGinBarrier` (2.31 on) / `hybridWorldGinBarrier` (2.30.5 on).
    pub hybrid_dense: usize,
    /// `railGinBarrier`.
    pub rail: usize,
    /// `uint8_t ginConnectionCount`.
    pub connection_count: usize,
    /// `uint8_t ginNetDeviceTypes[4]`.
    pub net_device_types: usize,
    /// `void* ginHandles[4]`.
    pub handles: usize,
    /// `int ginSignalCount`.
    pub signal_count: usize,
    /// `int ginCounterCount`.
    pub counter_count: usize,
    /// `uint64_t* ginSignalShadows`.
    pub shadows: usize,
    /// `uint32_t ginContextCount`.
    pub context_count: usize,
    /// `bool ginStrongLegacySignals` (2.30.5 on).
    pub strong_legacy: usize,
    /// `uint32_t* abortFlag`.
    pub abort_flag: usize,
    /// `hybridRailGinBarrier`.
    pub hybrid_rail: usize,
    /// `worldGinBarrier`.
    pub world: usize,
    /// `ginConnectionStride`, `ginContextStride`, `ginConnectionStride_rcp32` (2.31 on).
    pub strides: Option<(usize, usize, usize)>,
}

impl DevCommLayout {
    /// The GIN fields of this layout (`None` for 2.29's, to which GIN is not served).
    pub fn gin_offsets(self) -> Option<GinOffsets> {
        match self {
            DevCommLayout::V2310 => Some(GinOffsets {
                hybrid_dense: 64,
                rail: 88,
                connection_count: 96,
                net_device_types: 98,
                handles: 104,
                signal_count: 136,
                counter_count: 140,
                shadows: 144,
                context_count: 152,
                strong_legacy: 164,
                abort_flag: 168,
                hybrid_rail: 184,
                world: 192,
                strides: Some((156, 160, 200)),
            }),
            DevCommLayout::V2300 => Some(GinOffsets {
                hybrid_dense: 112,
                rail: 136,
                connection_count: 144,
                net_device_types: 145,
                handles: 152,
                signal_count: 184,
                counter_count: 188,
                shadows: 192,
                context_count: 200,
                strong_legacy: 205,
                abort_flag: 208,
                hybrid_rail: 224,
                world: 232,
                strides: None,
            }),
            _ => None,
        }
    }
}

/// Offsets of `ncclDevCommRequirements` from 2.29.2 on (`size`, `magic`, `version` first).
pub mod reqs {
    /// `size_t size`.
    pub const SIZE: usize = 0;
    /// `unsigned magic`.
    pub const MAGIC: usize = 8;
    /// `unsigned version`.
    pub const VERSION: usize = 12;
    /// `ncclDevResourceRequirements_t* resourceRequirementsList`.
    pub const RESOURCE_LIST: usize = 16;
    /// `ncclTeamRequirements_t* teamRequirementsList`.
    pub const TEAM_LIST: usize = 24;
    /// `bool lsaMultimem`.
    pub const LSA_MULTIMEM: usize = 32;
    /// `int barrierCount`.
    pub const BARRIER_COUNT: usize = 36;
    /// `int lsaBarrierCount`.
    pub const LSA_BARRIER_COUNT: usize = 40;
    /// `int railGinBarrierCount`.
    pub const RAIL_GIN_BARRIER_COUNT: usize = 44;
    /// `int lsaLLA2ABlockCount` (read by no one here: NCCL's devcomm has no field for it).
    pub const LSA_LLA2A_BLOCK_COUNT: usize = 48;
    /// `int lsaLLA2ASlotCount`.
    pub const LSA_LLA2A_SLOT_COUNT: usize = 52;
    /// `bool ginForceEnable`.
    pub const GIN_FORCE_ENABLE: usize = 56;
    /// `int ginContextCount` (a hint; NCCL's initializer says 4).
    pub const GIN_CONTEXT_COUNT: usize = 60;
    /// `int ginSignalCount`.
    pub const GIN_SIGNAL_COUNT: usize = 64;
    /// `int ginCounterCount`.
    pub const GIN_COUNTER_COUNT: usize = 68;
    /// `ncclGinConnectionType_t ginConnectionType` (2.29.7 on).
    pub const GIN_CONNECTION_TYPE: usize = 72;
    /// `int ginQueueDepth` (2.29.7 on).
    pub const GIN_QUEUE_DEPTH: usize = 80;
    /// `bool ginStrongSignalsRequired` (2.30.7 on).
    pub const GIN_STRONG_SIGNALS_REQUIRED: usize = 92;
    /// `int ginCustomStride` (2.31 on).
    pub const GIN_CUSTOM_STRIDE: usize = 96;
    /// `ncclGinType_t ginType` (2.31 on; NONE: any).
    pub const GIN_TYPE: usize = 100;
    /// `int worldGinBarrierCount` (2.30 on).
    pub const WORLD_GIN_BARRIER_COUNT: usize = 88;
    /// `int cftCaps` (2.31 on).
    pub const CFT_CAPS: usize = 108;
    /// `int cftBarrierCount` (2.31 on).
    pub const CFT_BARRIER_COUNT: usize = 112;
    /// `int* ginCustomArray`, `int ginCustomArrayCount` (2.32.6 on).
    pub const GIN_CUSTOM_ARRAY_COUNT: usize = 128;

    /// `ncclDevResourceRequirements`: `next`, `bufferSize`, `bufferAlign`, `outBufferHandle`,
    /// `ginSignalCount`, `ginCounterCount`, `outGinSignalStart`, `outGinCounterStart`.
    pub mod resource {
        /// `next`.
        pub const NEXT: usize = 0;
        /// `size_t bufferSize`.
        pub const BUFFER_SIZE: usize = 8;
        /// `size_t bufferAlign`.
        pub const BUFFER_ALIGN: usize = 16;
        /// `ncclDevResourceHandle_t* outBufferHandle`.
        pub const OUT_BUFFER_HANDLE: usize = 24;
        /// `int ginSignalCount`.
        pub const GIN_SIGNAL_COUNT: usize = 32;
        /// `int ginCounterCount`.
        pub const GIN_COUNTER_COUNT: usize = 36;
        /// `uint32_t* outGinSignalStart`.
        pub const OUT_GIN_SIGNAL_START: usize = 40;
        /// `uint32_t* outGinCounterStart`.
        pub const OUT_GIN_COUNTER_START: usize = 48;
        /// `sizeof`.
        pub const BYTES: usize = 56;
    }

    /// `ncclTeamRequirements`: `next`, `team`, `multimem`, `outMultimemHandle`.
    pub mod team {
        /// `next`.
        pub const NEXT: usize = 0;
        /// `bool multimem`.
        pub const MULTIMEM: usize = 20;
    }
}

/// NCCL 2.28's `ncclDevCommRequirements`, which carries no size, magic or version: its fields
/// at 2.28.3's and 2.28.7's offsets, and [`reqs228::versioned`] to read it as 2.29.2's.
pub mod reqs228 {
    /// `resourceRequirementsList`, `teamRequirementsList`, `lsaMultimem`: the same in both.
    pub const RESOURCE_LIST: usize = 0;
    /// `teamRequirementsList`.
    pub const TEAM_LIST: usize = 8;
    /// `bool lsaMultimem`.
    pub const LSA_MULTIMEM: usize = 16;
    /// 2.28.3's `lsaBarrierCount`, its last field (24 bytes in all).
    pub const LSA_BARRIER_COUNT_22803: usize = 20;
    /// `sizeof` at 2.28.3.
    pub const BYTES_22803: usize = 24;
    /// 2.28.3's `ncclDevResourceRequirements`: `next`, `bufferSize`, `bufferAlign`,
    /// `outBufferHandle` (no GIN fields).
    pub const RESOURCE_BYTES_22803: usize = 32;
    /// 2.28.7 to 2.28.9: `(field, offset)` of every `int`/`bool` field after `lsaMultimem`,
    /// 56 bytes in all.
    pub const FIELDS_22807: [(&str, usize); 9] = [
        ("barrierCount", 20),
        ("lsaBarrierCount", 24),
        ("railGinBarrierCount", 28),
        ("lsaLLA2ABlockCount", 32),
        ("lsaLLA2ASlotCount", 36),
        ("ginForceEnable", 40),
        ("ginContextCount", 44),
        ("ginSignalCount", 48),
        ("ginCounterCount", 52),
    ];
    /// `sizeof` at 2.28.7 to 2.28.9.
    pub const BYTES_22807: usize = 56;
    /// Where 2.29.2's layout keeps each 2.28.7 field.
    const AT_22902: [usize; 9] = {
        use super::reqs::*;
        [
            BARRIER_COUNT,
            LSA_BARRIER_COUNT,
            RAIL_GIN_BARRIER_COUNT,
            LSA_LLA2A_BLOCK_COUNT,
            LSA_LLA2A_SLOT_COUNT,
            GIN_FORCE_ENABLE,
            GIN_CONTEXT_COUNT,
            GIN_SIGNAL_COUNT,
            GIN_COUNTER_COUNT,
        ]
    };
    /// `sizeof` at 2.29.2 (what [`versioned`] returns).
    pub const BYTES_22902: usize = 72;

    /// The requirements of a client of 2.28 release `version`, at `r`, as 2.29.2 lays them
    /// out (size, magic and `version` filled in): one reading of the requirements serves both.
    ///
    /// # Safety
    /// `r` points to the client's requirements of that release (24 or 56 bytes).
    pub unsafe fn versioned(r: *const u8, version: u32) -> [u8; BYTES_22902] {
        use super::reqs;
        let mut v = [0u8; BYTES_22902];
        v[reqs::SIZE..reqs::SIZE + 8].copy_from_slice(&(BYTES_22902 as u64).to_le_bytes());
        v[reqs::MAGIC..reqs::MAGIC + 4].copy_from_slice(&super::API_MAGIC.to_le_bytes());
        v[reqs::VERSION..reqs::VERSION + 4].copy_from_slice(&version.to_le_bytes());
        // SAFETY: the client's struct of `version`: the three first fields in both layouts.
        let copy = |from: usize, to: usize, n: usize, v: &mut [u8]| unsafe {
            std::ptr::copy_nonoverlapping(r.add(from), v.as_mut_ptr().add(to), n)
        };
        copy(RESOURCE_LIST, reqs::RESOURCE_LIST, 8, &mut v);
        copy(TEAM_LIST, reqs::TEAM_LIST, 8, &mut v);
        copy(LSA_MULTIMEM, reqs::LSA_MULTIMEM, 1, &mut v);
        if version < 22807 {
            copy(LSA_BARRIER_COUNT_22803, reqs::LSA_BARRIER_COUNT, 4, &mut v);
        } else {
            for (&(name, from), to) in FIELDS_22807.iter().zip(AT_22902) {
                // The bool alone: the padding after it is the client's garbage.
                let n = if name == "ginForceEnable" { 1 } else { 4 };
                copy(from, to, n, &mut v);
            }
        }
        v
    }
}

/// What one `ncclDevResourceRequirements` asks for: a buffer (bytes, alignment, where its
/// handle goes) and GIN signals (how many, where their first id goes).
#[derive(Debug, Clone, Copy)]
pub struct Requirement {
    /// `bufferSize`.
    pub bytes: usize,
    /// `bufferAlign`.
    pub align: usize,
    /// `outBufferHandle`.
    pub out_buffer: *mut std::ffi::c_void,
    /// `ginSignalCount`.
    pub signals: u32,
    /// `outGinSignalStart`.
    pub out_signal: *mut std::ffi::c_void,
}

impl Requirement {
    /// Writes the requirement at `req` as `bytes` bytes (56, or 2.28.3's 32, which end before
    /// the GIN fields), zeroed first as NCCL's `*CreateRequirement` calls do.
    ///
    /// # Safety
    /// `req` is valid for writes of `bytes` bytes.
    pub unsafe fn write(&self, req: *mut std::ffi::c_void, bytes: usize) -> Result<(), String> {
        use reqs::resource as f;
        if bytes < f::BYTES && self.signals > 0 {
            return Err(format!(
                "GIN signals in a requirement of {bytes} bytes (a client of NCCL 2.28.3, which has no GIN)"
            ));
        }
        let r = req.cast::<u8>();
        // SAFETY: the caller's `bytes` bytes; unaligned writes of plain values, the GIN ones
        // only where the struct has them.
        unsafe {
            std::ptr::write_bytes(r, 0, bytes.min(f::BYTES));
            r.add(f::BUFFER_SIZE)
                .cast::<u64>()
                .write_unaligned(self.bytes as u64);
            r.add(f::BUFFER_ALIGN)
                .cast::<u64>()
                .write_unaligned(self.align as u64);
            r.add(f::OUT_BUFFER_HANDLE)
                .cast::<*mut std::ffi::c_void>()
                .write_unaligned(self.out_buffer);
            if bytes >= f::BYTES {
                r.add(f::GIN_SIGNAL_COUNT)
                    .cast::<i32>()
                    .write_unaligned(self.signals as i32);
                r.add(f::OUT_GIN_SIGNAL_START)
                    .cast::<*mut std::ffi::c_void>()
                    .write_unaligned(self.out_signal);
            }
        }
        Ok(())
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reciprocals_follow_nccls_rule() {
        assert_eq!(rcp32(1), 0);
        assert_eq!(rcp32(2), 0x8000_0000);
        assert_eq!(rcp32(3), 0x5555_5555);
        assert_eq!(rcp32(8), 0x2000_0000);
    }

    #[test]
    fn versions_pick_their_layouts() {
        assert_eq!(DevCommLayout::of(22902), Ok(DevCommLayout::V22902));
        assert_eq!(DevCommLayout::of(22907), Ok(DevCommLayout::V22907));
        assert_eq!(DevCommLayout::of(23007), Ok(DevCommLayout::V2300));
        assert_eq!(DevCommLayout::of(23206), Ok(DevCommLayout::V2310));
        assert_eq!(DevCommLayout::of(22803), Ok(DevCommLayout::V22803));
        assert_eq!(DevCommLayout::of(22809), Ok(DevCommLayout::V22807));
        let e = DevCommLayout::of(22805).unwrap_err();
        assert!(e.contains("NCCL 2.28.5"), "{e}");
        assert!(DevCommLayout::of(23300).is_err());
    }

    /// Each layout's fields at their offsets, and nothing past its size.
    #[test]
    fn devcomm_fields_land_where_each_layout_has_them() {
        let v = DevCommValues {
            version: 23206,
            rank: 3,
            nranks: 4,
            lsa_rank: 1,
            lsa_size: 2,
            window_table: 0x1111,
            resource_window: 0x2222,
            resource: WindowRecord {
                lsa_flat_base: 0x7000_0000_0000,
                stride4g: 20,
                mc_offset4k: 5,
                ..Default::default()
            },
            lsa_barrier: (3, 16),
            hybrid_lsa_barrier: (0, 0),
            gin: None,
        };
        let get32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let get64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let e = v.bytes(DevCommLayout::V2310);
        assert_eq!(e.len(), 248);
        assert_eq!((get32(&e, 0), get32(&e, 4)), (API_MAGIC, 23206));
        assert_eq!(
            (get32(&e, 8), get32(&e, 12), get32(&e, 20), get32(&e, 24)),
            (3, 4, 1, 2)
        );
        assert_eq!((get64(&e, 32), get64(&e, 40)), (0x1111, 0x2222));
        assert_eq!(
            (get64(&e, 48), get32(&e, 56), get32(&e, 60)),
            (0x7000_0000_0000, 20, 5)
        );
        assert_eq!((get32(&e, 80), get32(&e, 84)), (3, 16));
        assert_eq!(
            (get32(&e, 224), get32(&e, 228)),
            (LE_ID_INVALID, LE_ID_INVALID)
        );
        let d = v.bytes(DevCommLayout::V2300);
        assert_eq!(d.len(), 240);
        assert_eq!(
            (get64(&d, 56), get32(&d, 72), get32(&d, 76)),
            (0x7000_0000_0000, 20, 5)
        );
        assert_eq!((get32(&d, 128), get32(&d, 132)), (3, 16));
        let c = v.bytes(DevCommLayout::V22907);
        assert_eq!(c.len(), 224);
        assert_eq!((get32(&c, 0), get32(&c, 4)), (3, 4));
        assert_eq!(
            (get64(&c, 48), get32(&c, 64), get32(&c, 68)),
            (0x7000_0000_0000, 20, 5)
        );
        assert_eq!((get32(&c, 120), get32(&c, 124)), (3, 16));
        assert_eq!(get64(&c, 216), 0, "abortFlag stays NULL");
    }
}
