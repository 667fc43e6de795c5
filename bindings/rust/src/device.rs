//! Typed options of `ct_device_start`: which device collectors run on a
//! session, and how.

use std::time::Duration;

use serde::Serialize;

/// A device collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collector {
    /// Device-memory samples from NVML (used, free, total, reserved where the
    /// driver has it; utilisation and power as extra fields).
    Nvml,
    /// Every kernel, memcpy and memset the GPUs run, from CUPTI, each on the
    /// span that launched it.
    Cupti,
}

/// Where CUPTI attributes work launched from a thread with no open span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnspannedLaunches {
    /// The root span s1: the span innermost on the launching thread (the
    /// library's default).
    Root,
    /// The span innermost, at launch, on the session's main thread (the one
    /// that began the measured region, else the first to open a span).
    MainThread,
}

/// The options of [`SessionRef::start_devices`](crate::SessionRef::start_devices);
/// every field the library's default until set.
///
/// ```
/// use candle_trace::{Collector, DeviceOptions};
/// let o = DeviceOptions::new().collect(Collector::Nvml).collect(Collector::Cupti).devices(&[0]);
/// assert_eq!(o.to_json(), r#"{"collect":["nvml","cupti"],"devices":[0]}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceOptions {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    collect: Vec<Collector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cupti_lib: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unspanned_launches: Option<UnspannedLaunches>,
}

impl DeviceOptions {
    /// All defaults: NVML on every visible device every 10 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a collector (the first call replaces the default, NVML alone).
    #[must_use]
    pub fn collect(mut self, c: Collector) -> Self {
        self.collect.push(c);
        self
    }

    /// The NVML sampling period, whole milliseconds (the library takes 1 ms
    /// to 60 s and refuses the rest).
    #[must_use]
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval_ms = Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The CUDA ordinals to sample (default every visible device).
    #[must_use]
    pub fn devices(mut self, ordinals: &[u32]) -> Self {
        self.devices = Some(ordinals.to_vec());
        self
    }

    /// A libcupti file, or the folder holding one, to try first.
    #[must_use]
    pub fn cupti_lib(mut self, path: impl Into<String>) -> Self {
        self.cupti_lib = Some(path.into());
        self
    }

    /// Where CUPTI attributes work launched from threads with no open span.
    #[must_use]
    pub fn unspanned_launches(mut self, u: UnspannedLaunches) -> Self {
        self.unspanned_launches = Some(u);
        self
    }

    /// The `options_json` these options are.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain fields serialize")
    }
}
