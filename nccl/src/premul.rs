//! Operators made by `ncclRedOpCreatePreMulSum`: `sum(scalar * x_i)`, served natively as a sum
//! followed by scaling the output in place (mscclpp's `Scaler`), on the same stream.
//!
//! Codes start at `ncclNumOps` as NCCL's do, but are unique across communicators and never
//! reused, so that an operator of another communicator, or one destroyed, is named as such
//! instead of silently meaning another operator.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp::collectives::{Factor, Scaler};
use mscclpp::hal::{DataType, DevicePtr};

use crate::abi::{NcclComm, redop};
use crate::comm::Comm;
use crate::error::{Failure, Res};
use crate::types::dtype_info;

/// `ncclScalarDevice`: the scalar is in device memory, read when the operation runs.
pub const SCALAR_DEVICE: c_int = 0;
/// `ncclScalarHostImmediate`: the scalar is in host memory, copied at creation.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// One user-created operator.
#[derive(Debug)]
pub struct UserOp {
    /// The communicator it was made for (a `Weak` keeps the allocation, so the address never
    /// names another communicator).
    comm: Weak<Comm>,
    /// Its `ncclDataType_t` and HAL type.
    dtype: c_int,
    hal: DataType,
    /// The factor (native communicators).
    pub factor: Option<Factor>,
    /// The scale kernel of the communicator's device (native communicators).
    pub scaler: Option<Arc<Scaler>>,
    /// The same operator in the real NCCL, for the operations that fall back.
    pub real: Option<c_int>,
}

fn ops() -> &'static Mutex<HashMap<c_int, Arc<UserOp>>> {
    static OPS: OnceLock<Mutex<HashMap<c_int, Arc<UserOp>>>> = OnceLock::new();
    OPS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The next code to issue; those below it were issued.
static NEXT: AtomicI32 = AtomicI32::new(redop::NUM_OPS);

/// `ncclRedOpCreatePreMulSum`'s work for communicator `c` (handle `h`).
///
/// # Safety
/// `scalar` must point to one element of `datatype`: host memory for
/// [`SCALAR_HOST_IMMEDIATE`], device memory of the communicator's device for [`SCALAR_DEVICE`]
/// (alive while the operator is used).
pub unsafe fn create(
    c: &Arc<Comm>,
    h: NcclComm,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
) -> Res<c_int> {
    let (size, hal) = dtype_info(datatype)?;
    let hal = hal.ok_or_else(|| Failure::argument(format!("datatype {datatype}")))?;
    if scalar.is_null() {
        return Err(Failure::argument("scalar is NULL"));
    }
    let device = c.native_device();
    let factor = match residence {
        SCALAR_HOST_IMMEDIATE => {
            let mut b = [0u8; 8];
            // SAFETY: the caller's host scalar of `size` bytes (NCCL's contract).
            unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), b.as_mut_ptr(), size) };
            Some(Factor::from_le_bytes(hal, &b)?)
        }
        SCALAR_DEVICE => match &device {
            None => None,
            Some(d) => {
                // SAFETY: NCCL's contract: one element of device memory that stays allocated
                // while the operator is used (CUDA checks the address with the driver).
                let buf = unsafe { d.wrap_external(DevicePtr(scalar as u64), size) }.map_err(
                    |e| {
                        Failure::argument(format!(
                            "scalar {scalar:p} with ncclScalarDevice: not device memory of this communicator's device: {e}"
                        ))
                    },
                )?;
                Some(Factor::Device(buf.full()))
            }
        },
        other => {
            return Err(Failure::argument(format!(
                "residence {other}: expected ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
            )));
        }
    };
    // SAFETY: forwarded contract.
    let real = unsafe { c.create_real_premul(scalar, datatype, residence)? };
    if device.is_none() && real.is_none() {
        return Err(Failure::internal(
            "a communicator with neither a native side nor a real NCCL",
        ));
    }
    let code = NEXT.fetch_add(1, Ordering::Relaxed);
    if code < redop::NUM_OPS {
        return Err(Failure::internal("ncclRedOp_t codes ran out"));
    }
    let op = UserOp {
        comm: Arc::downgrade(c),
        dtype: datatype,
        hal,
        factor,
        scaler: device.map(|d| Arc::new(Scaler::new(d))),
        real,
    };
    let mut map = ops().lock().unwrap_or_else(|p| p.into_inner());
    // Operators of destroyed communicators go with them.
    map.retain(|_, o| o.comm.strong_count() > 0);
    map.insert(code, Arc::new(op));
    tracing::debug!(op = code, comm = ?h, dtype = %hal, residence, "PreMulSum operator created");
    Ok(code)
}

/// The operator `op` of communicator `c`, or why it cannot be used there.
fn find(c: &Arc<Comm>, op: c_int) -> Res<Arc<UserOp>> {
    if op < redop::NUM_OPS {
        return Err(Failure::argument(format!(
            "operator {op} is built in, not one made by ncclRedOpCreatePreMulSum"
        )));
    }
    let map = ops().lock().unwrap_or_else(|p| p.into_inner());
    let Some(u) = map.get(&op) else {
        return Err(Failure::argument(if op < NEXT.load(Ordering::Relaxed) {
            format!("operator {op} was destroyed (ncclRedOpDestroy) or its communicator was")
        } else {
            format!("operator {op} was not made by ncclRedOpCreatePreMulSum")
        }));
    };
    if u.comm.as_ptr() != Arc::as_ptr(c) {
        return Err(Failure::argument(format!(
            "operator {op} was made for another communicator: ncclRedOp_t values are per communicator"
        )));
    }
    Ok(u.clone())
}

/// Operator `op` for a call of `dtype` on communicator `c`.
pub fn resolve(c: &Arc<Comm>, op: c_int, dtype: c_int) -> Res<Arc<UserOp>> {
    let u = find(c, op)?;
    if u.dtype != dtype {
        let name = dtype_info(dtype)
            .ok()
            .and_then(|(_, t)| t)
            .map_or_else(|| dtype.to_string(), |t| t.to_string());
        return Err(Failure::argument(format!(
            "operator {op} was made for {}, the call passes {name}: the types must match",
            u.hal
        )));
    }
    Ok(u)
}

/// `ncclRedOpDestroy`'s work: forgets the operator (and destroys the real NCCL's).
pub fn destroy(c: &Arc<Comm>, op: c_int) -> Res<()> {
    find(c, op)?;
    let u = ops().lock().unwrap_or_else(|p| p.into_inner()).remove(&op);
    if let Some(real) = u.and_then(|u| u.real) {
        c.destroy_real_premul(real)?;
    }
    Ok(())
}
