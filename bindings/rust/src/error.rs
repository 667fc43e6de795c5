use std::ffi::CStr;
use std::fmt;

use crate::ffi;

/// A failure status of the C ABI (`ct_status` other than `CT_OK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `CT_ERR_INVALID_ARGUMENT`: NULL, empty, non-UTF-8, unknown enum, inconsistent record.
    InvalidArgument,
    /// `CT_ERR_INVALID_HANDLE`: unknown or finished session, unknown span.
    InvalidHandle,
    /// `CT_ERR_SPAN_MISMATCH`: a span end that is not this thread's innermost span.
    SpanMismatch,
    /// `CT_ERR_STATE`: not allowed now (open spans at finish, second measured region, fork child).
    State,
    /// `CT_ERR_IO`: the trace could not be written; the session is poisoned.
    Io,
    /// `CT_ERR_POISONED`: an earlier write failed; only `finish_failed` works.
    Poisoned,
    /// `CT_ERR_UNAVAILABLE`: a device collector or its library is missing.
    Unavailable,
    /// `CT_ERR_INTERNAL`: a bug or out of memory.
    Internal,
    /// A code this binding does not know (a newer library).
    Other(u32),
}

impl Status {
    /// The status of a `ct_status` value; `None` for `CT_OK`.
    pub fn from_code(code: ffi::ct_status) -> Option<Status> {
        Some(match code {
            ffi::CT_OK => return None,
            ffi::CT_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            ffi::CT_ERR_INVALID_HANDLE => Status::InvalidHandle,
            ffi::CT_ERR_SPAN_MISMATCH => Status::SpanMismatch,
            ffi::CT_ERR_STATE => Status::State,
            ffi::CT_ERR_IO => Status::Io,
            ffi::CT_ERR_POISONED => Status::Poisoned,
            ffi::CT_ERR_UNAVAILABLE => Status::Unavailable,
            ffi::CT_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        })
    }

    /// The `ct_status` value.
    pub fn code(self) -> ffi::ct_status {
        match self {
            Status::InvalidArgument => ffi::CT_ERR_INVALID_ARGUMENT,
            Status::InvalidHandle => ffi::CT_ERR_INVALID_HANDLE,
            Status::SpanMismatch => ffi::CT_ERR_SPAN_MISMATCH,
            Status::State => ffi::CT_ERR_STATE,
            Status::Io => ffi::CT_ERR_IO,
            Status::Poisoned => ffi::CT_ERR_POISONED,
            Status::Unavailable => ffi::CT_ERR_UNAVAILABLE,
            Status::Internal => ffi::CT_ERR_INTERNAL,
            Status::Other(c) => c,
        }
    }

    /// The header's name of the status, e.g. `CT_ERR_STATE`.
    pub fn name(self) -> &'static str {
        match self {
            Status::InvalidArgument => "CT_ERR_INVALID_ARGUMENT",
            Status::InvalidHandle => "CT_ERR_INVALID_HANDLE",
            Status::SpanMismatch => "CT_ERR_SPAN_MISMATCH",
            Status::State => "CT_ERR_STATE",
            Status::Io => "CT_ERR_IO",
            Status::Poisoned => "CT_ERR_POISONED",
            Status::Unavailable => "CT_ERR_UNAVAILABLE",
            Status::Internal => "CT_ERR_INTERNAL",
            Status::Other(_) => "CT_ERR_?",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Other(c) => write!(f, "ct_status {c}"),
            s => f.write_str(s.name()),
        }
    }
}

/// The errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The library refused a call (`status`), or the binding refused it before
    /// calling (then `message` starts with `candle-trace:` and `status` is the
    /// one the library would have returned). `message` is `ct_last_error()`.
    #[error("{message} [{status}]")]
    Trace { status: Status, message: String },
    /// The loaded library speaks another ABI version than this binding.
    #[error(
        "candle-trace: libcandle_trace.so has ABI version {library}, this binding was written for {binding}; rebuild the library or the binding"
    )]
    AbiMismatch { library: u32, binding: u32 },
    /// Calls that could not report their failure when made (a span begun with
    /// the infallible [`crate::SessionRef::span`], a span end in `Drop`, a
    /// capture wrapper) failed; `finish` refuses to claim the capture complete.
    #[error("{count} earlier call(s) of this session failed; first: {first}")]
    Deferred { count: usize, first: Box<Error> },
    /// A candle operation of a capture helper failed.
    #[cfg(feature = "candle")]
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// The library status behind this error, when there is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Trace { status, .. } => Some(*status),
            Error::Deferred { first, .. } => first.status(),
            _ => None,
        }
    }

    /// The library's message (`ct_last_error()`), or the binding's.
    pub fn message(&self) -> String {
        match self {
            Error::Trace { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::Trace {
            status: Status::InvalidArgument,
            message: format!("candle-trace: {}", message.into()),
        }
    }

    pub(crate) fn state(message: impl Into<String>) -> Error {
        Error::Trace {
            status: Status::State,
            message: format!("candle-trace: {}", message.into()),
        }
    }

    /// Reads `ct_last_error()` of this thread for a failed `code`.
    pub(crate) fn last(code: ffi::ct_status) -> Error {
        // SAFETY: ct_last_error never returns NULL and the string lives until
        // this thread's next ct_* call; it is copied at once.
        let message = unsafe { CStr::from_ptr(ffi::ct_last_error()) }
            .to_string_lossy()
            .into_owned();
        Error::Trace {
            status: Status::from_code(code).unwrap_or(Status::Internal),
            message,
        }
    }
}

#[cfg(feature = "candle")]
impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => c,
            other => candle_core::Error::wrap(other),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[inline]
pub(crate) fn check(code: ffi::ct_status) -> Result<()> {
    if code == ffi::CT_OK {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}
