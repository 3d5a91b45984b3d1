//! The host calls NCCL 2.31–2.32 added (`nccl.h` and `nccl_device/host.h` of PyPI's
//! `nvidia-nccl-cu13==2.32.6`). As in `exports_229`, every one must be this library's: under
//! `LD_PRELOAD` a symbol left undefined resolves to the real `libnccl.so`, which would be handed
//! our handle. Each is served over what this library has, or refused naming the call.
//!
//! | function | since | here |
//! | --- | --- | --- |
//! | `ncclAllReduceConfig`, `ncclAllGatherConfig`, `ncclAlltoAllConfig`, `ncclBroadcastConfig`, `ncclGatherConfig`, `ncclReduceConfig`, `ncclReduceScatterConfig`, `ncclScatterConfig` | 2.31 | native: the plain call's code with what the `ncclCollConfig_t` asks for ([`crate::collconfig`]) |
//! | `ncclSetEncryption` | 2.32 | `NCCL_ENCRYPTION_MODE_NONE` served (plaintext, what the bootstrap does); a PSK is `ncclInvalidUsage`: the bootstrap has no TLS |
//! | `ncclTeamWorld`, `ncclTeamRankToWorld` (`nccl_device/host.h`) | 2.28 | native: the world team is every rank, stride 1 |
//! | `ncclTeamLsa`, `ncclTeamCft`, `ncclTeamCftMultimem`, `ncclTeamRail`, `ncclTeamRankToLsa`, `ncclLLA2ACalcSlots`, the `Lsa`/`Cft`-barrier, `LLA2A`, `GinOutbox`, `GinInboxA2A` `CreateRequirement` calls, `ncclGet{Peer,Multimem,Cft}DeviceLeInfo` | 2.28–2.32 | refused (`ncclInvalidUsage`, or an empty team / -1 where the call returns no result code): NCCL's device API is served by a later issue |

mod collectives;
mod device_host;
mod encryption;

pub use collectives::*;
pub use encryption::*;
