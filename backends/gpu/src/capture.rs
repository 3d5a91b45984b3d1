//! This thread's stream-capture mode, relaxed while the library does host work of its own.
//!
//! CUDA and HIP refuse a host wait, an allocation or a free made by any thread while another
//! thread captures a graph in global mode (`torch.cuda.graph`'s default), and the refusal also
//! invalidates that capture. The library's own host work never touches the capturing stream: a
//! stream of its own dropped with work pending (it waits for that work first), a host copy
//! through its own stream, a proxy or relay thread waiting on its copies, memory allocated or
//! freed for its own buffers. Relaxed mode lets such calls through and leaves the other thread's
//! capture intact; the previous mode comes back when the guard drops.

use crate::runtime::Runtime;

/// `CU_STREAM_CAPTURE_MODE_RELAXED` / `hipStreamCaptureModeRelaxed`.
const RELAXED: i32 = 2;

/// Relaxed mode on this thread until dropped (see the module documentation).
pub(crate) struct Relaxed<'a, R: Runtime> {
    rt: &'a R,
    prev: Option<i32>,
}

impl<'a, R: Runtime> Relaxed<'a, R> {
    pub(crate) fn new(rt: &'a R) -> Self {
        // SAFETY: the call concerns this thread's mode only and needs no current context.
        let prev = unsafe { rt.relax_thread_capture() };
        Relaxed { rt, prev }
    }
}

impl<R: Runtime> Drop for Relaxed<'_, R> {
    fn drop(&mut self) {
        // Nested guards: only the outermost one (which found another mode) restores it.
        if let Some(m) = self.prev.filter(|&m| m != RELAXED) {
            // SAFETY: as in `new`; `m` is what the runtime returned.
            unsafe { self.rt.restore_thread_capture(m) };
        }
    }
}
