//! IPC handles: an allocation (or multicast group) exported to bytes that another process of
//! the same host can import.
//!
//! The outer encoding is versioned and bounded here; the payload is the backend's own
//! (a `cuIpcMemHandle`, a memfd reference, ...), decoded and validated by that backend.

use crate::caps::BackendKind;
use crate::error::{Error, Result};
use crate::wire::{Reader, Writer};

const MAGIC: [u8; 4] = *b"MSIH";
const VERSION: u16 = 1;
/// Largest backend payload accepted; every known handle kind is far smaller.
pub const MAX_PAYLOAD: usize = 512;

/// What an IPC handle refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcHandleKind {
    /// A memory allocation.
    Memory,
    /// A multicast group.
    Multicast,
}

/// An exported allocation or multicast group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcHandle {
    /// The backend that made it; only that backend can import it.
    pub backend: BackendKind,
    /// What it refers to.
    pub kind: IpcHandleKind,
    /// Bytes of the allocation (or multicast object) it refers to.
    pub len: u64,
    /// The backend's own description.
    pub payload: Vec<u8>,
}

impl IpcHandle {
    /// Encodes the handle for another process.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new(MAGIC, VERSION);
        w.u8(self.backend.code())
            .u8(match self.kind {
                IpcHandleKind::Memory => 1,
                IpcHandleKind::Multicast => 2,
            })
            .u64(self.len)
            .bytes(&self.payload);
        w.finish()
    }

    /// Decodes a handle received from another process.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::open("IPC handle", bytes, MAGIC, VERSION, VERSION)?;
        let code = r.u8()?;
        let backend = BackendKind::from_code(code).ok_or_else(|| {
            Error::malformed("IPC handle", format!("unknown backend code {code}"))
        })?;
        let kind = match r.u8()? {
            1 => IpcHandleKind::Memory,
            2 => IpcHandleKind::Multicast,
            k => return Err(Error::malformed("IPC handle", format!("unknown kind {k}"))),
        };
        let len = r.u64()?;
        let payload = r.bytes("payload", MAX_PAYLOAD)?.to_vec();
        r.finish()?;
        Ok(IpcHandle {
            backend,
            kind,
            len,
            payload,
        })
    }

    /// Checks that the handle is for `backend` and of `kind`, naming what was found otherwise.
    pub fn expect(&self, backend: BackendKind, kind: IpcHandleKind) -> Result<()> {
        if self.backend != backend || self.kind != kind {
            return Err(Error::invalid(format!(
                "IPC handle is a {:?} handle of the {} backend; expected a {kind:?} handle of the {backend} backend",
                self.kind, self.backend
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_kind_check() {
        let h = IpcHandle {
            backend: BackendKind::Host,
            kind: IpcHandleKind::Memory,
            len: 4096,
            payload: vec![1, 2, 3],
        };
        let back = IpcHandle::from_bytes(&h.to_bytes()).unwrap();
        assert_eq!(back, h);
        assert!(
            back.expect(BackendKind::Host, IpcHandleKind::Memory)
                .is_ok()
        );
        let e = back
            .expect(BackendKind::Cuda, IpcHandleKind::Memory)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host backend") && e.contains("cuda backend"),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = IpcHandle::from_bytes(&buf);
        }
    }
}
