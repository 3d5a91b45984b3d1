//! Caller's arrays: whatever exposes `__dlpack__` (torch, CuPy, NumPy, JAX) or
//! `__cuda_array_interface__` (Numba, CuPy), read as a contiguous range of device memory with an
//! element type. Nothing is copied and nothing is consumed: the capsule is read while the caller's
//! object is alive and then released untouched (its producer's destructor frees its wrapper).

use std::ffi::c_void;

use mscclpp::hal::{BackendKind, DataType};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::errors::usage;

/// DLPack's device types (dlpack.h, `DLDeviceType`) that the backends can serve.
const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
const DL_ROCM: i32 = 10;
const DL_ROCM_HOST: i32 = 11;
const DL_CUDA_MANAGED: i32 = 13;

/// dlpack.h's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DlDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// dlpack.h's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DlDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// dlpack.h's `DLTensor`.
#[repr(C)]
pub(crate) struct DlTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DlDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DlDataType,
    pub(crate) shape: *const i64,
    pub(crate) strides: *const i64,
    pub(crate) byte_offset: u64,
}

/// dlpack.h's `DLManagedTensor` (the unversioned capsule `"dltensor"`, which every producer
/// returns when no `max_version` is asked for).
#[repr(C)]
pub(crate) struct DlManagedTensor {
    pub(crate) dl_tensor: DlTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// The element type as the producer described it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// A type the collectives know.
    Known(DataType),
    /// `bool`: moved as bytes, never reduced.
    Bool,
    /// A type without a collective of its own (int16, complex, other float8 formats): usable
    /// only with `dtype=` naming a type of the same size.
    Raw { size: usize },
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::Known(t) => t.size(),
            Elem::Bool => 1,
            Elem::Raw { size } => size,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::Known(t) => dtype_name(t),
            Elem::Bool => "bool",
            Elem::Raw { .. } => "a type without collectives",
        }
    }
}

/// Where the memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory (DLPack's CPU, CUDA-host, ROCm-host).
    Host,
    /// Memory of GPU `ordinal` of `vendor`.
    Gpu { vendor: BackendKind, ordinal: usize },
}

/// One caller array, as the collectives see it.
#[derive(Debug, Clone, Copy)]
pub struct ArrayView {
    /// Address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub len: usize,
    pub elem: Elem,
    pub place: Place,
}

impl ArrayView {
    pub fn nbytes(&self) -> usize {
        self.len * self.elem.size()
    }
}

/// The name users write (NumPy's and torch's spelling).
pub fn dtype_name(t: DataType) -> &'static str {
    match t {
        DataType::F32 => "float32",
        DataType::F16 => "float16",
        DataType::BF16 => "bfloat16",
        DataType::I32 => "int32",
        DataType::U32 => "uint32",
        DataType::F64 => "float64",
        DataType::I64 => "int64",
        DataType::U64 => "uint64",
        DataType::I8 => "int8",
        DataType::U8 => "uint8",
        DataType::F8E4M3 => "float8_e4m3fn",
        DataType::F8E5M2 => "float8_e5m2",
    }
}

const DTYPE_NAMES: &str = "float32, float16, bfloat16, int32, uint32, float64, int64, uint64, int8, uint8, float8_e4m3fn, float8_e5m2";

/// A `dtype=` argument: a name, or anything whose `str()` is one (`numpy.float16`'s dtype,
/// `torch.bfloat16`).
pub fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DataType> {
    let s = obj.str()?.to_string();
    let name = s
        .trim()
        .trim_start_matches("torch.")
        .trim_start_matches("<class 'numpy.")
        .trim_end_matches("'>")
        .to_ascii_lowercase();
    let t = match name.as_str() {
        "float32" | "float" | "f4" | "<f4" => DataType::F32,
        "float16" | "half" | "f2" | "<f2" => DataType::F16,
        "bfloat16" => DataType::BF16,
        "int32" | "i4" | "<i4" => DataType::I32,
        "uint32" | "u4" | "<u4" => DataType::U32,
        "float64" | "double" | "f8" | "<f8" => DataType::F64,
        "int64" | "i8" | "<i8" => DataType::I64,
        "uint64" | "u8" | "<u8" => DataType::U64,
        "int8" | "|i1" | "i1" => DataType::I8,
        "uint8" | "|u1" | "u1" => DataType::U8,
        "float8_e4m3fn" | "float8_e4m3" | "f8e4m3" => DataType::F8E4M3,
        "float8_e5m2" | "f8e5m2" => DataType::F8E5M2,
        _ => {
            return Err(usage(format!(
                "unknown dtype {s:?}: expected one of {DTYPE_NAMES}"
            )));
        }
    };
    Ok(t)
}

fn dl_elem(t: DlDataType) -> Result<Elem, String> {
    if t.lanes != 1 {
        return Err(format!("vector elements of {} lanes", t.lanes));
    }
    let known = |d| Ok(Elem::Known(d));
    match (t.code, t.bits) {
        (0, 8) => known(DataType::I8),
        (0, 32) => known(DataType::I32),
        (0, 64) => known(DataType::I64),
        (1, 8) => known(DataType::U8),
        (1, 32) => known(DataType::U32),
        (1, 64) => known(DataType::U64),
        (2, 16) => known(DataType::F16),
        (2, 32) => known(DataType::F32),
        (2, 64) => known(DataType::F64),
        (4, 16) => known(DataType::BF16),
        (6, 8) => Ok(Elem::Bool),
        // DLPack 1.1's float8 codes: kDLFloat8_e4m3fn and kDLFloat8_e5m2.
        (10, 8) => known(DataType::F8E4M3),
        (12, 8) => known(DataType::F8E5M2),
        (_, bits) if bits % 8 == 0 && bits > 0 => Ok(Elem::Raw {
            size: usize::from(bits / 8),
        }),
        (code, bits) => Err(format!("DLPack type code {code} of {bits} bits")),
    }
}

fn cai_elem(typestr: &str) -> Result<Elem, String> {
    let known = |d| Ok(Elem::Known(d));
    match typestr.trim_start_matches(['<', '|', '=']) {
        "f4" => known(DataType::F32),
        "f2" => known(DataType::F16),
        "f8" => known(DataType::F64),
        "i4" => known(DataType::I32),
        "u4" => known(DataType::U32),
        "i8" => known(DataType::I64),
        "u8" => known(DataType::U64),
        "i1" => known(DataType::I8),
        "u1" => known(DataType::U8),
        "b1" => Ok(Elem::Bool),
        t if t.len() >= 2 && t[1..].parse::<usize>().is_ok_and(|n| n > 0) => Ok(Elem::Raw {
            size: t[1..].parse().unwrap_or(1),
        }),
        _ => Err(format!(
            "typestr {typestr:?} (big-endian, int16, complex and void types have no collective here)"
        )),
    }
}

fn place_of(device_type: i32, device_id: i32) -> Result<Place, String> {
    let ordinal = usize::try_from(device_id).map_err(|_| format!("device id {device_id}"))?;
    match device_type {
        DL_CPU | DL_CUDA_HOST | DL_ROCM_HOST => Ok(Place::Host),
        DL_CUDA | DL_CUDA_MANAGED => Ok(Place::Gpu {
            vendor: BackendKind::Cuda,
            ordinal,
        }),
        DL_ROCM => Ok(Place::Gpu {
            vendor: BackendKind::Rocm,
            ordinal,
        }),
        other => Err(format!(
            "DLPack device type {other} (only CPU, CUDA and ROCm memory is served)"
        )),
    }
}

/// Checks row-major contiguity (dimensions of extent 1 may have any stride, and an array of no
/// elements any strides: NumPy gives an empty 2-D array strides of 0) and returns the element
/// count.
fn contiguous_len(shape: &[i64], strides: Option<&[i64]>, unit: i64) -> Result<usize, String> {
    let mut len: usize = 1;
    for &d in shape {
        let d =
            usize::try_from(d).map_err(|_| format!("negative extent {d} in shape {shape:?}"))?;
        len = len
            .checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    }
    if let Some(strides) = strides.filter(|_| len > 0) {
        let mut expect = unit;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d > 1 && s != expect {
                return Err(format!(
                    "not contiguous (shape {shape:?}, strides {strides:?}); pass a contiguous \
                     array (torch: .contiguous(), NumPy: numpy.ascontiguousarray)"
                ));
            }
            expect = expect.saturating_mul(d.max(1));
        }
    }
    Ok(len)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The `(device_type, device_id)` an object reports through `__dlpack_device__`, if it has one.
fn dlpack_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack_device__")? {
        return Ok(None);
    }
    let t = obj.call_method0("__dlpack_device__")?;
    let (kind, id): (i32, i32) = t.extract().map_err(|_| {
        usage(format!(
            "{}.__dlpack_device__() returned {}, not a (device_type, device_id) pair",
            type_name(obj),
            t.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    Ok(Some((kind, id)))
}

fn not_an_array(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    pyo3::exceptions::PyTypeError::new_err(format!(
        "{what}: expected an array exposing __dlpack__ or __cuda_array_interface__ \
         (torch.Tensor, cupy.ndarray, numpy.ndarray), got {}",
        type_name(obj)
    ))
}

/// Reads `obj`. `stream` is the stream the collective will run on (GPU memory only): DLPack
/// producers make it wait for their own pending work on the array, as the protocol asks.
pub fn view(obj: &Bound<'_, PyAny>, what: &str, stream: Option<u64>) -> PyResult<ArrayView> {
    let py = obj.py();
    if obj.hasattr("__dlpack__")? {
        let device = dlpack_device(obj)?;
        let gpu = matches!(device, Some((DL_CUDA | DL_CUDA_MANAGED | DL_ROCM, _)));
        let capsule = match (gpu, stream) {
            (true, Some(s)) => {
                let kwargs = PyDict::new(py);
                // DLPack's stream numbering: 0 is ambiguous on CUDA, where the legacy default
                // stream is 1; on ROCm 0 is the default stream.
                let rocm = matches!(device, Some((DL_ROCM, _)));
                let s = if s == 0 && !rocm { 1 } else { s };
                kwargs.set_item("stream", s)?;
                obj.call_method("__dlpack__", (), Some(&kwargs))?
            }
            _ => obj.call_method0("__dlpack__")?,
        };
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            usage(format!(
                "{what}: {}.__dlpack__() did not return a PyCapsule",
                type_name(obj)
            ))
        })?;
        let ptr = capsule
            .pointer_checked(Some(c"dltensor"))
            .map_err(|_| {
                usage(format!(
                    "{what}: the DLPack capsule of {} is not an unconsumed \"dltensor\"",
                    type_name(obj)
                ))
            })?
            .cast::<DlManagedTensor>();
        // SAFETY: a live "dltensor" capsule holds a DLManagedTensor its producer keeps valid
        // until the capsule is destroyed; `capsule` lives until the end of this function and no
        // Python code runs while the fields are read.
        let t = unsafe { &ptr.as_ref().dl_tensor };
        let elem = dl_elem(t.dtype).map_err(|e| usage(format!("{what}: {e}")))?;
        let place = place_of(t.device.device_type, t.device.device_id)
            .map_err(|e| usage(format!("{what}: {e}")))?;
        let ndim =
            usize::try_from(t.ndim).map_err(|_| usage(format!("{what}: ndim {}", t.ndim)))?;
        let (shape, strides): (&[i64], Option<&[i64]>) = if ndim == 0 {
            (&[], None)
        } else {
            if t.shape.is_null() {
                return Err(usage(format!("{what}: DLPack tensor without a shape")));
            }
            // SAFETY: DLPack: `shape` (non-null, checked) and `strides` (when non-null) point
            // to `ndim` integers owned by the managed tensor.
            let shape = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
            let strides = (!t.strides.is_null())
                // SAFETY: as above.
                .then(|| unsafe { std::slice::from_raw_parts(t.strides, ndim) });
            (shape, strides)
        };
        let len = contiguous_len(shape, strides, 1).map_err(|e| usage(format!("{what}: {e}")))?;
        let ptr = (t.data as u64)
            .checked_add(t.byte_offset)
            .ok_or_else(|| usage(format!("{what}: data pointer plus byte_offset overflows")))?;
        return Ok(ArrayView {
            ptr,
            len,
            elem,
            place,
        });
    }
    if obj.hasattr("__cuda_array_interface__")? {
        return cuda_array_interface(obj, what);
    }
    Err(not_an_array(obj, what))
}

fn cuda_array_interface(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<ArrayView> {
    let cai = obj.getattr("__cuda_array_interface__")?;
    let cai = cai.cast_into::<PyDict>().map_err(|_| {
        usage(format!(
            "{what}: __cuda_array_interface__ of {} is not a dict",
            type_name(obj)
        ))
    })?;
    let field = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(k)?
            .ok_or_else(|| usage(format!("{what}: __cuda_array_interface__ has no {k:?}")))
    };
    let typestr: String = field("typestr")?.extract()?;
    let elem = cai_elem(&typestr).map_err(|e| usage(format!("{what}: {e}")))?;
    let shape: Vec<i64> = field("shape")?.extract()?;
    let data = field("data")?;
    let data = data.cast::<PyTuple>().map_err(|_| {
        usage(format!(
            "{what}: __cuda_array_interface__['data'] is not a (ptr, readonly) tuple"
        ))
    })?;
    let (ptr, _readonly): (u64, bool) = data.extract()?;
    let strides: Option<Vec<i64>> = match cai.get_item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    let len = contiguous_len(&shape, strides.as_deref(), elem.size() as i64)
        .map_err(|e| usage(format!("{what}: {e}")))?;
    Ok(ArrayView {
        ptr,
        len,
        elem,
        place: Place::Gpu {
            vendor: BackendKind::Cuda,
            ordinal: usize::MAX,
        },
    })
}

/// The stream a GPU call runs on when the caller names none: torch's or CuPy's current stream
/// for their arrays, the stream a `__cuda_array_interface__` names, else the legacy default
/// stream (0).
pub fn current_stream(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let py = obj.py();
    let module: String = obj
        .get_type()
        .getattr("__module__")
        .and_then(|m| m.extract())
        .unwrap_or_default();
    if module == "torch" || module.starts_with("torch.") {
        let device = obj.getattr("device")?;
        let s = py
            .import("torch")?
            .getattr("cuda")?
            .call_method1("current_stream", (device,))?;
        return s.getattr("cuda_stream")?.extract();
    }
    if module == "cupy" || module.starts_with("cupy.") {
        let s = py
            .import("cupy")?
            .getattr("cuda")?
            .call_method0("get_current_stream")?;
        return s.getattr("ptr")?.extract();
    }
    if obj.hasattr("__cuda_array_interface__")? {
        let cai = obj.getattr("__cuda_array_interface__")?;
        if let Ok(d) = cai.cast::<PyDict>() {
            if let Some(s) = d.get_item("stream")? {
                if !s.is_none() {
                    return s.extract();
                }
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity() {
        assert_eq!(contiguous_len(&[2, 3], None, 1), Ok(6));
        assert_eq!(contiguous_len(&[2, 3], Some(&[3, 1]), 1), Ok(6));
        assert_eq!(contiguous_len(&[2, 1, 3], Some(&[3, 99, 1]), 1), Ok(6));
        assert!(contiguous_len(&[2, 3], Some(&[1, 2]), 1).is_err());
        assert_eq!(contiguous_len(&[4], Some(&[8]), 8), Ok(4));
        assert!(contiguous_len(&[-1], None, 1).is_err());
        assert_eq!(contiguous_len(&[], None, 1), Ok(1));
        // No elements: any strides (NumPy gives an empty 2-D array strides of 0).
        assert_eq!(contiguous_len(&[0, 2], Some(&[0, 0]), 1), Ok(0));
    }

    #[test]
    fn dlpack_types() {
        let t = |code, bits| {
            dl_elem(DlDataType {
                code,
                bits,
                lanes: 1,
            })
        };
        assert_eq!(t(4, 16), Ok(Elem::Known(DataType::BF16)));
        assert_eq!(t(6, 8), Ok(Elem::Bool));
        assert_eq!(t(0, 16), Ok(Elem::Raw { size: 2 }));
        assert!(t(0, 1).is_err());
        assert!(
            dl_elem(DlDataType {
                code: 2,
                bits: 32,
                lanes: 4
            })
            .is_err()
        );
    }
}
