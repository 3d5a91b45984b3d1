//! DLPack export: the library's own memory (a `Buffer`) seen by torch, CuPy or NumPy without a
//! copy, as MSCCL++'s `RawGpuBuffer.to_dlpack` does. The capsule is the unversioned
//! `"dltensor"`, which every consumer accepts; its managed tensor holds a reference to the
//! Python object that owns the memory, dropped when the consumer calls the deleter (or when an
//! unconsumed capsule is destroyed).

use std::ffi::{CStr, c_void};

use mscclpp::hal::{BackendKind, DataType};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::array::{DlDataType, DlDevice, DlManagedTensor, DlTensor};
use crate::errors::usage;

/// DLPack's device types for a backend (dlpack.h `DLDeviceType`).
pub fn device_of(backend: BackendKind, ordinal: usize) -> (i32, i32) {
    let id = i32::try_from(ordinal).unwrap_or(i32::MAX);
    match backend {
        BackendKind::Cuda => (2, id),
        BackendKind::Rocm => (10, id),
        BackendKind::Host => (1, 0),
    }
}

/// The DLPack type of a collective element type.
pub fn dl_type(t: DataType) -> DlDataType {
    let (code, bits) = match t {
        DataType::I8 => (0, 8),
        DataType::I32 => (0, 32),
        DataType::I64 => (0, 64),
        DataType::U8 => (1, 8),
        DataType::U32 => (1, 32),
        DataType::U64 => (1, 64),
        DataType::F16 => (2, 16),
        DataType::F32 => (2, 32),
        DataType::F64 => (2, 64),
        DataType::BF16 => (4, 16),
        DataType::F8E4M3 => (10, 8),
        DataType::F8E5M2 => (12, 8),
    };
    DlDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// A managed tensor with the arrays its fields point at and the owner it keeps alive.
/// `managed` comes first: a pointer to it is a pointer to the whole (the deleter frees that).
#[repr(C)]
struct Holder {
    managed: DlManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    owner: Option<Py<PyAny>>,
}

const NAME: &CStr = c"dltensor";

/// The managed tensor's deleter (called by the consumer once it is done with the memory, or by
/// the capsule's destructor when no consumer took it).
unsafe extern "C" fn delete_managed(p: *mut DlManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is the first field of a `Holder` boxed by `capsule` (repr(C)), handed out
    // once; DLPack calls the deleter exactly once.
    let holder = unsafe { Box::from_raw(p.cast::<Holder>()) };
    let Holder { owner, .. } = *holder;
    // The consumer may call this on any thread, with or without the GIL: released at once
    // where the interpreter can be attached, else left to pyo3's deferred release.
    let mut slot = owner;
    let _ = Python::try_attach(|_py| drop(slot.take()));
    drop(slot);
}

/// The capsule's destructor: frees the managed tensor unless a consumer took it (renamed the
/// capsule `"used_dltensor"`).
unsafe extern "C" fn destroy_capsule(cap: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed (the GIL held).
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, NAME.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()).cast::<DlManagedTensor>();
            delete_managed(p);
        }
    }
}

/// A `"dltensor"` capsule over `ptr` (`shape`, C-contiguous unless `strides`), of `dtype` on
/// `device`, keeping `owner` alive until the consumer releases it.
pub fn capsule<'py>(
    py: Python<'py>,
    ptr: u64,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: DlDataType,
    device: (i32, i32),
    owner: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let ndim = i32::try_from(shape.len()).map_err(|_| usage("to_dlpack: too many dimensions"))?;
    if let Some(s) = &strides {
        if s.len() != shape.len() {
            return Err(usage(format!(
                "to_dlpack: {} strides for {} dimensions",
                s.len(),
                shape.len()
            )));
        }
    }
    let mut holder = Box::new(Holder {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: ptr as *mut c_void,
                device: DlDevice {
                    device_type: device.0,
                    device_id: device.1,
                },
                ndim,
                dtype,
                shape: std::ptr::null(),
                strides: std::ptr::null(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape,
        strides: strides.unwrap_or_default(),
        owner,
    });
    holder.managed.dl_tensor.shape = holder.shape.as_ptr();
    if !holder.strides.is_empty() {
        holder.managed.dl_tensor.strides = holder.strides.as_ptr();
    }
    let raw = Box::into_raw(holder);
    // SAFETY: `raw` is a live, uniquely owned Holder; its address is stable (boxed).
    unsafe { (*raw).managed.manager_ctx = raw.cast::<c_void>() };
    // SAFETY: `raw` points to a Holder whose first field is the DLManagedTensor consumers read;
    // `NAME` is 'static; the destructor frees it unless a consumer renamed the capsule.
    let obj = unsafe {
        pyo3::ffi::PyCapsule_New(raw.cast::<c_void>(), NAME.as_ptr(), Some(destroy_capsule))
    };
    if obj.is_null() {
        // SAFETY: the capsule was not made, so `raw` is still ours alone.
        unsafe { delete_managed(raw.cast::<DlManagedTensor>()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `obj` is a new (owned) reference to a capsule.
    let any = unsafe { Bound::from_owned_ptr(py, obj) };
    Ok(any.cast_into::<PyCapsule>()?)
}

/// Shape and strides of a typed view of `nbytes` bytes: `shape` given (checked against the
/// bytes), else one dimension of every element.
pub fn typed_shape(
    nbytes: usize,
    elem: usize,
    shape: Option<Vec<i64>>,
    strides: Option<&[i64]>,
) -> PyResult<Vec<i64>> {
    if nbytes % elem != 0 {
        return Err(usage(format!(
            "to_dlpack: {nbytes} bytes are not a whole number of {elem}-byte elements"
        )));
    }
    let n = (nbytes / elem) as i64;
    match shape {
        None => Ok(vec![n]),
        Some(s) if s.is_empty() => Ok(vec![n]),
        Some(s) => {
            if s.iter().any(|&d| d < 0) {
                return Err(usage(format!("to_dlpack: negative dimension in {s:?}")));
            }
            // The furthest element addressed must lie inside the buffer.
            let last: i64 = match strides {
                Some(st) if !st.is_empty() => {
                    s.iter()
                        .zip(st)
                        .map(|(&d, &k)| (d - 1).max(0) * k)
                        .sum::<i64>()
                        + 1
                }
                _ => s.iter().product(),
            };
            if s.contains(&0) || last <= n {
                Ok(s)
            } else {
                Err(usage(format!(
                    "to_dlpack: shape {s:?} needs {last} elements, but the buffer holds {n}"
                )))
            }
        }
    }
}
