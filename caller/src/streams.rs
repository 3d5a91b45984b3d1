//! Callers' native streams, wrapped once per communicator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_hal::{Device, Result, Stream};

/// Wrappers of borrowed native stream handles, by handle. A handle is wrapped at its first
/// call and reused after: the wrapper neither owns nor queries the stream, so a handle that
/// names a different stream later (the caller destroyed one and created another at the same
/// value) is still the stream the caller means.
#[derive(Debug, Default)]
pub(crate) struct StreamCache {
    by_handle: Mutex<HashMap<u64, Arc<dyn Stream>>>,
}

impl StreamCache {
    /// The wrapper of `handle` on `device`.
    ///
    /// # Safety
    /// `handle` is a live stream of `device` (0: its legacy default stream) for as long as
    /// calls use it.
    pub(crate) unsafe fn get_or_wrap(
        &self,
        device: &dyn Device,
        handle: u64,
    ) -> Result<Arc<dyn Stream>> {
        let mut cache = self.by_handle.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.get(&handle) {
            return Ok(s.clone());
        }
        // SAFETY: forwarded contract.
        let s = unsafe { device.wrap_stream(handle)? };
        cache.insert(handle, s.clone());
        Ok(s)
    }
}
