//! Scaling an array in place by a factor of its own type: what NCCL's `PreMulSum` operator adds
//! to a sum. The library serves `sum(factor * x_i)` as `factor * sum(x_i)`: the sum by any
//! algorithm, then this kernel on the output, enqueued on the same stream (capturable, no host
//! synchronisation). For integers both are equal modulo 2^n; for floats only the rounding
//! differs. Its kernel is `kernels/collectives/scale.cu` ([`SCALE_MODULE`]); its host kernel is
//! [`host_scale`].

use std::sync::{Arc, OnceLock};

use mscclpp_hal::dtype::{f32_to_fp8, fp8_to_f32};
use mscclpp_hal::{
    BufferSlice, DataType, Device, DynKernel, DynStream, Error, KernelArgs, KernelDef, KernelId,
    KernelModule, LaunchConfig, Result,
};

use crate::algorithms::base::HEADERS;

/// The scale kernel.
pub(crate) const SCALE: KernelId = KernelId("mscclpp_collective_scale");

/// The module of the scale kernel (loaded at its first use).
pub static SCALE_MODULE: KernelModule = KernelModule {
    name: "collectives/scale.cu",
    source: include_str!("../../kernels/collectives/scale.cu"),
    headers: HEADERS,
    kernels: &[KernelDef::new::<ScaleArgs>(SCALE.0, host_scale)],
};

/// Arguments of `mscclpp_collective_scale`. Mirrored in `kernels/collectives/args.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleArgs {
    /// Device address of the elements, scaled in place.
    pub data: u64,
    /// Element count.
    pub count: u64,
    /// Device address of the factor (one element), read when the kernel runs; 0: `imm`.
    pub scalar: u64,
    /// The factor's bits (little-endian element, zero-extended) when `scalar` is 0.
    pub imm: u64,
    /// [`DataType`] code.
    pub dtype: u32,
    /// Zero.
    pub _pad: u32,
    /// Device address of `count` source elements (not overlapping `data` unless equal); 0: in
    /// place.
    pub src: u64,
}

// SAFETY: repr(C), integers only, no implicit padding (four u64, two u32, one u64); every bit
// pattern is valid.
unsafe impl KernelArgs for ScaleArgs {}

/// The factor of a [`Scaler::scale`] call.
#[derive(Debug, Clone)]
pub enum Factor {
    /// A value known now: one element's little-endian bytes, zero-extended to 64 bits (copied
    /// into the launch, so a captured graph replays this value).
    Value(u64),
    /// One element in device memory, read when the kernel runs (a graph replay sees the value
    /// current then). The memory must stay allocated until the stream has passed the call.
    Device(BufferSlice),
}

impl Factor {
    /// A value of `dtype` from its little-endian bytes (at least the type's size; the rest is
    /// ignored).
    pub fn from_le_bytes(dtype: DataType, bytes: &[u8]) -> Result<Factor> {
        let n = dtype.size();
        let b = bytes.get(..n).ok_or_else(|| {
            Error::invalid(format!(
                "a {dtype} factor needs {n} bytes; {} were given",
                bytes.len()
            ))
        })?;
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(b);
        Ok(Factor::Value(u64::from_le_bytes(w)))
    }
}

/// Threads per block of the scale kernel on GPUs.
const THREADS: u32 = 256;
/// Blocks per multiprocessor at most: the loop strides over the rest.
const BLOCKS_PER_SM: u32 = 4;

/// The scale kernel of one device, loaded (compiled, on GPUs) at its first use, so that
/// communicators that never scale never compile it.
pub struct Scaler {
    device: Arc<dyn Device>,
    kernel: OnceLock<DynKernel<ScaleArgs>>,
}

impl std::fmt::Debug for Scaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scaler")
            .field("device", &self.device.info().ordinal)
            .field("loaded", &self.kernel.get().is_some())
            .finish()
    }
}

impl Scaler {
    /// The scaler of `device` (nothing is loaded yet).
    pub fn new(device: Arc<dyn Device>) -> Scaler {
        Scaler {
            device,
            kernel: OnceLock::new(),
        }
    }

    fn kernel(&self) -> Result<&DynKernel<ScaleArgs>> {
        if let Some(k) = self.kernel.get() {
            return Ok(k);
        }
        tracing::debug!(module = SCALE_MODULE.name, "loading at first use");
        let k = DynKernel::load(&*self.device, &SCALE_MODULE, SCALE)?;
        // Two threads may have loaded it at once: either serves.
        Ok(self.kernel.get_or_init(|| k))
    }

    /// Enqueues `data[i] *= factor` for the first `count` elements of `dtype` in `data` on
    /// `stream`: 64-bit and 32-bit floats in their own precision, 16- and 8-bit floats in `f32`
    /// rounded back once (nearest even; FP8 saturating), integers wrapping. No host
    /// synchronisation; `data` (and a device factor) must stay allocated until the stream has
    /// passed the call.
    pub fn scale(
        &self,
        data: &BufferSlice,
        count: usize,
        dtype: DataType,
        factor: &Factor,
        stream: &DynStream,
    ) -> Result<()> {
        self.scale_from(data, None, count, dtype, factor, stream)
    }

    /// As [`Scaler::scale`], reading the elements from `src` (when given) instead of `data`:
    /// `data[i] = src[i] * factor`. `src` holds at least `count` elements and does not overlap
    /// `data` unless it starts at the same address.
    pub fn scale_from(
        &self,
        data: &BufferSlice,
        src: Option<&BufferSlice>,
        count: usize,
        dtype: DataType,
        factor: &Factor,
        stream: &DynStream,
    ) -> Result<()> {
        let backend = self.device.info().backend;
        let size = dtype.size();
        let bytes = count
            .checked_mul(size)
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid(format!("scale: {count} {dtype} elements overflow")))?;
        if data.len() < bytes {
            return Err(Error::invalid(format!(
                "scale: {} bytes hold fewer than {count} {dtype} elements ({bytes} bytes)",
                data.len()
            )));
        }
        if data.buffer().backend() != backend {
            return Err(Error::invalid(format!(
                "scale: the data belongs to the {} backend, the device to {backend}",
                data.buffer().backend()
            )));
        }
        if let Some(s) = src {
            if s.len() < bytes {
                return Err(Error::invalid(format!(
                    "scale: the source's {} bytes hold fewer than {count} {dtype} elements",
                    s.len()
                )));
            }
            if s.buffer().backend() != backend {
                return Err(Error::invalid(format!(
                    "scale: the source belongs to the {} backend, the device to {backend}",
                    s.buffer().backend()
                )));
            }
            let (a, b) = (s.ptr().0, data.ptr().0);
            if a != b && a < b + bytes as u64 && b < a + bytes as u64 {
                return Err(Error::invalid(format!(
                    "scale: source {a:#x} and destination {b:#x} overlap ({bytes} bytes)"
                )));
            }
            if a % size as u64 != 0 {
                return Err(Error::invalid(format!(
                    "scale: the source at {a:#x} is not aligned to its {size}-byte type"
                )));
            }
        }
        let (scalar, imm) = match factor {
            Factor::Value(v) => (0, *v),
            Factor::Device(s) => {
                if s.len() < size {
                    return Err(Error::invalid(format!(
                        "scale: the device factor has {} bytes; a {dtype} needs {size}",
                        s.len()
                    )));
                }
                if s.buffer().backend() != backend {
                    return Err(Error::invalid(format!(
                        "scale: the factor belongs to the {} backend, the device to {backend}",
                        s.buffer().backend()
                    )));
                }
                if s.ptr().0 % size as u64 != 0 {
                    return Err(Error::invalid(format!(
                        "scale: the device factor at {:#x} is not aligned to its {size}-byte type",
                        s.ptr().0
                    )));
                }
                (s.ptr().0, 0)
            }
        };
        if count == 0 {
            return Ok(());
        }
        if data.ptr().0 % size as u64 != 0 {
            return Err(Error::invalid(format!(
                "scale: the data at {:#x} is not aligned to its {size}-byte type",
                data.ptr().0
            )));
        }
        let args = ScaleArgs {
            data: data.ptr().0,
            count: count as u64,
            scalar,
            imm,
            dtype: dtype as u32,
            _pad: 0,
            src: src.map_or(0, |s| s.ptr().0),
        };
        let info = self.device.info();
        let cfg = if info.warp_size == 1 {
            LaunchConfig::linear(1, 1)
        } else {
            let threads = THREADS.min(info.max_threads_per_block.max(32));
            let most = info.multiprocessors.max(1) * BLOCKS_PER_SM;
            let blocks = (count as u64)
                .div_ceil(u64::from(threads))
                .min(u64::from(most));
            LaunchConfig::linear(blocks as u32, threads)
        };
        tracing::trace!(count, %dtype, device_factor = scalar != 0, ?cfg, "launch scale");
        // SAFETY: `data` holds `count` elements (checked above) and the device factor one, both
        // of this device's backend; the caller keeps them allocated until the stream has passed
        // the call (documented above).
        unsafe { self.kernel()?.launch(stream, cfg, &args) }
    }
}

/// One element times the factor, both little-endian bytes of `dtype` (see [`Scaler::scale`]).
fn scale_elem(dtype: DataType, x: &mut [u8], f: u64) {
    macro_rules! int {
        ($t:ty) => {{
            const N: usize = size_of::<$t>();
            let v = <$t>::from_le_bytes(x[..N].try_into().unwrap_or([0; N]));
            x[..N].copy_from_slice(&v.wrapping_mul(f as $t).to_le_bytes());
        }};
    }
    match dtype {
        DataType::F32 => {
            let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * f32::from_bits(f as u32);
            x[..4].copy_from_slice(&v.to_le_bytes());
        }
        DataType::F64 => {
            let v = f64::from_le_bytes(x[..8].try_into().unwrap_or([0; 8])) * f64::from_bits(f);
            x[..8].copy_from_slice(&v.to_le_bytes());
        }
        DataType::F16 => {
            let v = half::f16::from_le_bytes([x[0], x[1]]).to_f32()
                * half::f16::from_bits(f as u16).to_f32();
            x[..2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        DataType::BF16 => {
            let v = half::bf16::from_le_bytes([x[0], x[1]]).to_f32()
                * half::bf16::from_bits(f as u16).to_f32();
            x[..2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        DataType::F8E4M3 | DataType::F8E5M2 => {
            let e4 = dtype == DataType::F8E4M3;
            x[0] = f32_to_fp8(fp8_to_f32(x[0], e4) * fp8_to_f32(f as u8, e4), e4);
        }
        DataType::I32 | DataType::U32 => int!(u32),
        DataType::I64 | DataType::U64 => int!(u64),
        DataType::I8 | DataType::U8 => int!(u8),
    }
}

/// The host kernel of `mscclpp_collective_scale`: one worker scales every element.
pub fn host_scale(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = ScaleArgs::from_bytes(args)?;
    let dtype = DataType::from_code(a.dtype)?;
    let size = dtype.size();
    let bytes = usize::try_from(a.count)
        .ok()
        .and_then(|c| c.checked_mul(size))
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| Error::invalid(format!("scale of {} {dtype} elements", a.count)))?;
    if bytes == 0 {
        return Ok(());
    }
    if a.data == 0 {
        return Err(Error::invalid("scale: the data address is 0"));
    }
    let f = if a.scalar == 0 {
        a.imm
    } else {
        let mut w = [0u8; 8];
        // SAFETY: the launcher passed the address of one element of `dtype` in this process's
        // memory (host-backend device memory), allocated until the kernel has run.
        unsafe { std::ptr::copy_nonoverlapping(a.scalar as *const u8, w.as_mut_ptr(), size) };
        u64::from_le_bytes(w)
    };
    if a.src != 0 && a.src != a.data {
        // SAFETY: the launcher passed `count` source elements at `src` and `count` at `data` in
        // this process's memory, not overlapping (checked by the launcher), which no other work
        // of the stream touches while this kernel runs (stream order).
        let (src, data) = unsafe {
            (
                std::slice::from_raw_parts(a.src as *const u8, bytes),
                std::slice::from_raw_parts_mut(a.data as *mut u8, bytes),
            )
        };
        data.copy_from_slice(src);
    }
    // SAFETY: the launcher passed `count` elements at `data` in this process's memory, which no
    // other work of the stream touches while this kernel runs (stream order).
    let data = unsafe { std::slice::from_raw_parts_mut(a.data as *mut u8, bytes) };
    for x in data.chunks_exact_mut(size) {
        scale_elem(dtype, x, f);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::{Backend, MemoryKind};

    #[test]
    fn the_entry_point_is_defined_in_the_source() {
        let def = format!("extern \"C\" __global__ void {}(", SCALE.0);
        assert!(SCALE_MODULE.source.contains(&def));
    }

    /// Every type, a host and a device factor, against the element function, on the host
    /// backend; the elements past `count` stay as they were.
    #[test]
    fn host_backend_scales_every_type_with_host_and_device_factors() {
        let backend = mscclpp_host::HostBackend::new();
        let device: Arc<dyn Device> = backend.open_device(0).expect("host device");
        let stream = device.create_stream().expect("stream");
        let scaler = Scaler::new(device.clone());
        let count = 37usize;
        for dtype in DataType::ALL {
            let size = dtype.size();
            let mut input = Vec::new();
            for i in 0..count + 3 {
                dtype.encode_f64(i as f64 - 11.0, &mut input);
            }
            let mut fbytes = Vec::new();
            dtype.encode_f64(3.0, &mut fbytes);
            let factor_bits = Factor::from_le_bytes(dtype, &fbytes).expect("factor");
            let Factor::Value(bits) = factor_bits else {
                panic!("a value factor")
            };
            let mut expected = input.clone();
            for x in expected[..count * size].chunks_exact_mut(size) {
                scale_elem(dtype, x, bits);
            }
            // An independent reference: small integers times 3 are exact in f64, and every
            // type holds their products (the narrow floats after rounding the input).
            for (i, x) in expected[..count * size].chunks_exact(size).enumerate() {
                let mut r = Vec::new();
                dtype.encode_f64(dtype.decode_f64(&input[i * size..]) * 3.0, &mut r);
                assert_eq!(x, &r[..], "{dtype} element {i}");
            }
            let fbuf = device.alloc(8, MemoryKind::Device).expect("alloc");
            stream
                .write_from_host(&fbuf.slice(..size).expect("slice"), &fbytes)
                .expect("write");
            for factor in [
                factor_bits.clone(),
                Factor::Device(fbuf.slice(..size).unwrap()),
            ] {
                let buf = device
                    .alloc(input.len(), MemoryKind::Device)
                    .expect("alloc");
                stream.write_from_host(&buf.full(), &input).expect("write");
                scaler
                    .scale(&buf.full(), count, dtype, &factor, &*stream)
                    .expect("scale");
                let mut got = vec![0u8; input.len()];
                stream.read_to_host(&mut got, &buf.full()).expect("read");
                stream.synchronize().expect("sync");
                assert_eq!(got, expected, "{dtype} with {factor:?}");
                // Not the identity: the factor was applied.
                assert_ne!(got, input, "{dtype}");
            }
        }
    }

    #[test]
    fn bad_calls_are_refused_with_a_message() {
        let backend = mscclpp_host::HostBackend::new();
        let device: Arc<dyn Device> = backend.open_device(0).expect("host device");
        let stream = device.create_stream().expect("stream");
        let scaler = Scaler::new(device.clone());
        let buf = device.alloc(64, MemoryKind::Device).expect("alloc");
        let e = scaler
            .scale(&buf.full(), 17, DataType::F32, &Factor::Value(0), &*stream)
            .unwrap_err();
        assert!(e.to_string().contains("fewer than 17"), "{e}");
        let e = scaler
            .scale(
                &buf.full(),
                4,
                DataType::F64,
                &Factor::Device(buf.slice(..4).unwrap()),
                &*stream,
            )
            .unwrap_err();
        assert!(e.to_string().contains("needs 8"), "{e}");
        assert!(Factor::from_le_bytes(DataType::F64, &[0; 4]).is_err());
    }
}
