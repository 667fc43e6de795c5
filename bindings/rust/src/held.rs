//! Records a flight recorder holds in the binding until its update is kept.
//!
//! A [`crate::Schedule`]'s flight recorder records every update and drops
//! nearly all of them. Its spans and the session's re-arming (`ct_reopen`)
//! stay in the library's C fast paths, but each record call (`ct_record_op`,
//! `ct_record_tensor`, the gradient facts...) enters the library's Go
//! runtime, and entering it after an update's work costs more than the record
//! (the runtime's threads are woken and its caches are cold): most of what a
//! flight-recorded update paid. So a session set to hold records keeps them
//! here, as the C strings and values the call would have taken, and hands
//! them to the library only when the session ends with a trace (`finish`,
//! `finish_failed`, a drop, `flush`); a dropped update's are discarded with
//! its session. A record whose time is "now" (0) takes the session clock when
//! it is held, so that it lands where it would have.
//!
//! What the library would refuse is found when the records are handed over:
//! each refusal is deferred and reported by `finish`, as a capture helper's
//! refusals always were. The held bytes are bounded (the flight recorder's
//! own bound): past it, what is held goes to the library at once, whose
//! bound then counts what it drops.
use std::ffi::CString;
use std::os::raw::c_char;
use std::ptr;

use crate::error::{check, Result};
use crate::ffi;
use crate::session::opt_ptr;

/// One record call, owned: what `ct_record_*` takes.
pub(crate) enum Record {
    Op {
        span: u64,
        name: CString,
        dtype: CString,
        device: CString,
        inputs: Vec<CString>,
        output: Option<CString>,
        shape: Vec<i64>,
        flags: u32,
        duration_ns: u64,
        timestamp_ns: u64,
        output_dense_bytes: u64,
        input_dense_bytes: u64,
    },
    Tensor {
        span: u64,
        id: CString,
        dtype: CString,
        device: CString,
        label: Option<CString>,
        shape: Vec<i64>,
        flags: u32,
        requires_grad: i32,
        category: ffi::ct_category,
        dense_bytes: u64,
    },
    /// `fallback`: the span it goes to where `span` refuses it (a heap
    /// record whose span had closed when it was logged).
    Memory {
        span: u64,
        fallback: Option<u64>,
        action: ffi::ct_memory_action,
        timestamp_ns: u64,
        storage: CString,
        tensor: CString,
        device: CString,
        dtype: CString,
        op_name: Option<CString>,
        bytes: u64,
        shape: Vec<i64>,
        category: ffi::ct_category,
    },
    Scalar {
        span: u64,
        label: CString,
        value: f64,
    },
    DataEdge {
        from: CString,
        to: CString,
    },
    Gradient {
        root: CString,
        key: CString,
        state: ffi::ct_gradient_state,
        norm: Option<f64>,
    },
}

fn len(s: &CString) -> usize {
    s.as_bytes().len() + 1
}

/// What a held record costs beside its strings and shape: the enum itself.
const RECORD_BYTES: usize = std::mem::size_of::<Record>();

impl Record {
    /// The memory it holds, roughly: the enum and what it points to.
    fn bytes(&self) -> usize {
        RECORD_BYTES
            + match self {
                Record::Op {
                    name,
                    dtype,
                    device,
                    inputs,
                    output,
                    shape,
                    ..
                } => {
                    len(name)
                        + len(dtype)
                        + len(device)
                        + inputs.iter().map(len).sum::<usize>()
                        + output.as_ref().map_or(0, len)
                        + 8 * shape.len()
                }
                Record::Tensor {
                    id,
                    dtype,
                    device,
                    label,
                    shape,
                    ..
                } => {
                    len(id)
                        + len(dtype)
                        + len(device)
                        + label.as_ref().map_or(0, len)
                        + 8 * shape.len()
                }
                Record::Memory {
                    storage,
                    tensor,
                    device,
                    dtype,
                    op_name,
                    shape,
                    ..
                } => {
                    len(storage)
                        + len(tensor)
                        + len(device)
                        + len(dtype)
                        + op_name.as_ref().map_or(0, len)
                        + 8 * shape.len()
                }
                Record::Scalar { label, .. } => len(label),
                Record::DataEdge { from, to } => len(from) + len(to),
                Record::Gradient { root, key, .. } => len(root) + len(key),
            }
    }

    /// Makes the library call the record stands for.
    pub(crate) fn send(&self, handle: ffi::ct_session) -> Result<()> {
        match self {
            Record::Op {
                span,
                name,
                dtype,
                device,
                inputs,
                output,
                shape,
                flags,
                duration_ns,
                timestamp_ns,
                output_dense_bytes,
                input_dense_bytes,
            } => {
                let input_ptrs: Vec<*const c_char> = inputs.iter().map(|c| c.as_ptr()).collect();
                let raw = ffi::ct_op {
                    size: std::mem::size_of::<ffi::ct_op>() as u32,
                    flags: *flags,
                    op_name: name.as_ptr(),
                    dtype: dtype.as_ptr(),
                    device: device.as_ptr(),
                    inputs: if input_ptrs.is_empty() {
                        ptr::null()
                    } else {
                        input_ptrs.as_ptr()
                    },
                    n_inputs: input_ptrs.len(),
                    output: opt_ptr(output),
                    shape: shape.as_ptr(),
                    rank: shape.len(),
                    duration_ns: *duration_ns,
                    timestamp_ns: *timestamp_ns,
                    output_dense_bytes: *output_dense_bytes,
                    input_dense_bytes: *input_dense_bytes,
                };
                // SAFETY: every pointer of `raw` points into self or locals alive across the call.
                check(unsafe { ffi::ct_record_op(handle, *span, &raw) })
            }
            Record::Tensor {
                span,
                id,
                dtype,
                device,
                label,
                shape,
                flags,
                requires_grad,
                category,
                dense_bytes,
            } => {
                let raw = ffi::ct_tensor {
                    size: std::mem::size_of::<ffi::ct_tensor>() as u32,
                    flags: *flags,
                    tensor_id: id.as_ptr(),
                    dtype: dtype.as_ptr(),
                    device: device.as_ptr(),
                    label: opt_ptr(label),
                    shape: shape.as_ptr(),
                    rank: shape.len(),
                    requires_grad: *requires_grad,
                    category: *category,
                    dense_bytes: *dense_bytes,
                };
                // SAFETY: every pointer of `raw` points into self, alive across the call.
                check(unsafe { ffi::ct_record_tensor(handle, *span, &raw) })
            }
            Record::Memory {
                span,
                fallback,
                action,
                timestamp_ns,
                storage,
                tensor,
                device,
                dtype,
                op_name,
                bytes,
                shape,
                category,
            } => {
                let raw = ffi::ct_memory {
                    size: std::mem::size_of::<ffi::ct_memory>() as u32,
                    reserved: 0,
                    timestamp_ns: *timestamp_ns,
                    storage_id: storage.as_ptr(),
                    tensor_id: tensor.as_ptr(),
                    device: device.as_ptr(),
                    dtype: dtype.as_ptr(),
                    op_name: opt_ptr(op_name),
                    bytes: *bytes,
                    shape: if shape.is_empty() {
                        ptr::null()
                    } else {
                        shape.as_ptr()
                    },
                    rank: shape.len(),
                    category: *category,
                };
                // SAFETY: every pointer of `raw` points into self, alive across the calls.
                let first = check(unsafe { ffi::ct_record_memory(handle, *span, *action, &raw) });
                match (first, fallback) {
                    (Err(_), Some(f)) => {
                        check(unsafe { ffi::ct_record_memory(handle, *f, *action, &raw) })
                    }
                    (r, _) => r,
                }
            }
            // SAFETY (the three below): NUL-terminated strings of self, alive across the call.
            Record::Scalar { span, label, value } => {
                check(unsafe { ffi::ct_record_scalar(handle, *span, label.as_ptr(), *value) })
            }
            Record::DataEdge { from, to } => {
                check(unsafe { ffi::ct_record_data_edge(handle, from.as_ptr(), to.as_ptr()) })
            }
            Record::Gradient {
                root,
                key,
                state,
                norm,
            } => {
                let norm_ptr = norm.as_ref().map_or(ptr::null(), |n| n as *const f64);
                check(unsafe {
                    ffi::ct_record_gradient(handle, root.as_ptr(), key.as_ptr(), *state, norm_ptr)
                })
            }
        }
    }
}

/// The records a session holds, and its bound (0: it holds none).
#[derive(Default)]
pub(crate) struct Held {
    limit: usize,
    bytes: usize,
    records: Vec<Record>,
}

impl Held {
    /// Holds up to `limit` bytes of records from now on (0: none; what is
    /// held stays until [`Held::take`]: see [`Held::over_limit`]).
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Something is held beyond the bound (any record, with a bound of 0).
    pub(crate) fn over_limit(&self) -> bool {
        !self.records.is_empty() && (self.limit == 0 || self.bytes > self.limit)
    }

    /// Keeps `r`, or gives it back when the session holds nothing. Past the
    /// bound, everything held so far is returned to be sent at once.
    pub(crate) fn hold(&mut self, r: Record) -> Holding {
        if self.limit == 0 {
            return Holding::Send(r);
        }
        self.bytes += r.bytes();
        self.records.push(r);
        if self.bytes > self.limit {
            return Holding::Overflow(self.take());
        }
        Holding::Held
    }

    /// Everything held, in the order it was recorded; the memory of the list
    /// stays for the next records.
    pub(crate) fn take(&mut self) -> Vec<Record> {
        self.bytes = 0;
        std::mem::take(&mut self.records)
    }

    /// Drops what is held (an update nobody will read), keeping the list's
    /// memory for the next update's records.
    pub(crate) fn clear(&mut self) {
        self.bytes = 0;
        self.records.clear();
    }

    /// The state a reopened session starts from: this bound and this list's
    /// memory, nothing held.
    pub(crate) fn carry(&mut self) -> Held {
        self.clear();
        Held {
            limit: self.limit,
            bytes: 0,
            records: std::mem::take(&mut self.records),
        }
    }

    /// The list [`Held::take`] gave out, once sent: its memory is kept for
    /// the next records (unless others were held meanwhile).
    pub(crate) fn give_back(&mut self, mut records: Vec<Record>) {
        if self.records.is_empty() && self.records.capacity() < records.capacity() {
            records.clear();
            self.records = records;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }
}

/// What [`Held::hold`] did with a record.
pub(crate) enum Holding {
    Held,
    /// Not held: to be sent now.
    Send(Record),
    /// Over the bound: these (the new one last) are to be sent now.
    Overflow(Vec<Record>),
}
