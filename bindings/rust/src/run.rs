//! The run description `ct_open` takes, as a builder serialised with serde.
//! Field meanings and rules: docs/trace-format.md, "The run JSON of ct_open".
use std::collections::BTreeMap;

use serde::Serialize;

// Kept reachable here: `crate::run::GradientContract` predates its module.
pub(crate) use crate::contract::GradientContract;

/// Training update or inference call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Train,
    Infer,
}

/// How nested span durations were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingMode {
    Host,
    DeviceSynchronized,
}

/// Coverage level of one kind of evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    #[default]
    None,
    Partial,
    Complete,
}

/// What the measured time stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasurementScope {
    #[default]
    Unknown,
    ProfiledWork,
    ProductionEquivalent,
}

/// What the capture promises (`capture_contract`). Every level defaults to
/// `none` and the scope to `unknown`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CaptureContract {
    pub measurement_scope: MeasurementScope,
    pub operations: Level,
    pub activations: Level,
    pub tensors: Level,
    pub gradients: Level,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gradient_contract: Option<GradientContract>,
    pub logical_memory: Level,
    pub physical_memory: Level,
    pub device_timing: Level,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub required_semantic_labels: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_expected_semantic_labels: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cpu_only_semantic_labels: Vec<String>,
}

impl CaptureContract {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn measurement_scope(mut self, scope: MeasurementScope) -> Self {
        self.measurement_scope = scope;
        self
    }
    pub fn operations(mut self, level: Level) -> Self {
        self.operations = level;
        self
    }
    pub fn activations(mut self, level: Level) -> Self {
        self.activations = level;
        self
    }
    pub fn tensors(mut self, level: Level) -> Self {
        self.tensors = level;
        self
    }
    pub fn gradients(mut self, level: Level) -> Self {
        self.gradients = level;
        self
    }
    /// Sets the exact gradient manifest, and `gradients` to `complete` (the
    /// only level a contract may come with).
    pub fn gradient_contract(mut self, contract: GradientContract) -> Self {
        self.gradients = Level::Complete;
        self.gradient_contract = Some(contract);
        self
    }
    pub fn logical_memory(mut self, level: Level) -> Self {
        self.logical_memory = level;
        self
    }
    pub fn physical_memory(mut self, level: Level) -> Self {
        self.physical_memory = level;
        self
    }
    pub fn device_timing(mut self, level: Level) -> Self {
        self.device_timing = level;
        self
    }
    /// Span names that must occur exactly once in the capture.
    pub fn required_labels<I, S>(mut self, labels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.required_semantic_labels
            .extend(labels.into_iter().map(Into::into));
        self
    }
}

/// Which runs may be compared: equal in every field but `implementation_id`
/// and `pair_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComparisonIdentity {
    pub workload_id: String,
    pub model_id: String,
    pub config_id: String,
    pub data_id: String,
    pub seed_policy: String,
    pub precision: String,
    pub device_state: String,
    pub physical_batch: u64,
    pub accumulation_steps: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implementation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_id: Option<String>,
}

/// The run description given to [`crate::Session::open`].
///
/// ```
/// use candle_trace::{Run, CaptureContract, Level};
/// let run = Run::training("mlp::train", 3, "cpu")
///     .tag("batch", "32")
///     .capture_contract(CaptureContract::new().operations(Level::Partial));
/// assert!(run.to_json().contains("\"capture_step\":3"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    entrypoint: String,
    phase: Phase,
    capture_step: u64,
    device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup_steps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timing_mode: Option<TimingMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_region_device_synchronized: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capture_contract: Option<CaptureContract>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comparison_identity: Option<ComparisonIdentity>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candle_version: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    measured_root: bool,
    /// Names this binding in the trace's `meta.producer.binding`.
    binding: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    buffer: Option<Buffer>,
}

/// The `buffer` object of the run JSON (see [`Run::buffered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Buffer {
    max_bytes: u64,
}

impl Run {
    fn new(
        phase: Phase,
        entrypoint: impl Into<String>,
        capture_step: u64,
        device: impl Into<String>,
    ) -> Self {
        Run {
            entrypoint: entrypoint.into(),
            phase,
            capture_step,
            device: device.into(),
            warmup_steps: None,
            correlation_id: None,
            timing_mode: None,
            measured_region_device_synchronized: None,
            capture_contract: None,
            comparison_identity: None,
            tags: BTreeMap::new(),
            candle_version: None,
            measured_root: false,
            binding: "rust",
            mode: None,
            aggregate_interval_ms: None,
            buffer: None,
        }
    }

    /// A training run capturing update `capture_step` (one-based) on `device`.
    pub fn training(
        entrypoint: impl Into<String>,
        capture_step: u64,
        device: impl Into<String>,
    ) -> Self {
        Self::new(Phase::Train, entrypoint, capture_step, device)
    }

    /// An inference run capturing call `capture_step` (one-based) on `device`.
    pub fn inference(
        entrypoint: impl Into<String>,
        capture_step: u64,
        device: impl Into<String>,
    ) -> Self {
        Self::new(Phase::Infer, entrypoint, capture_step, device)
    }

    /// Statistics over the whole run instead of a trace of one step: the
    /// session's path receives a `candle-trace/aggregate/1` summary, rewritten
    /// every `interval_ms` (None: the library's default) and at finish.
    pub fn aggregate(mut self, interval_ms: Option<u64>) -> Self {
        self.mode = Some("aggregate");
        self.aggregate_interval_ms = interval_ms;
        self
    }

    /// A flight recorder: the trace stays in memory, within `max_bytes` (past
    /// it records are dropped and counted, never refused; see `ct_open`),
    /// until [`crate::Session::finish`] or `finish_failed` writes it or
    /// [`crate::Session::discard`] drops it. Nothing is created at open.
    pub fn buffered(mut self, max_bytes: u64) -> Self {
        self.buffer = Some(Buffer { max_bytes });
        self
    }

    /// Calls completed before the captured one (default `capture_step - 1`).
    pub fn warmup_steps(mut self, n: u64) -> Self {
        self.warmup_steps = Some(n);
        self
    }
    /// Key joining this run to other artifacts (default `<entrypoint>/update-<step>`).
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
    pub fn timing_mode(mut self, mode: TimingMode) -> Self {
        self.timing_mode = Some(mode);
        self
    }
    /// Declares that the measured region starts and ends with a device
    /// synchronize (`measured_region_device_synchronized`). The candle helper
    /// `candle::measure_synchronized` does the synchronizing.
    pub fn device_synchronized(mut self) -> Self {
        self.measured_region_device_synchronized = Some(true);
        self
    }
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }
    pub fn capture_contract(mut self, contract: CaptureContract) -> Self {
        self.capture_contract = Some(contract);
        self
    }
    pub fn comparison_identity(mut self, identity: ComparisonIdentity) -> Self {
        self.comparison_identity = Some(identity);
        self
    }
    pub fn candle_version(mut self, version: impl Into<String>) -> Self {
        self.candle_version = Some(version.into());
        self
    }
    /// Makes the root span the measured region (then `measure` is refused).
    pub fn measured_root(mut self) -> Self {
        self.measured_root = true;
        self
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// The captured update or call (one-based).
    pub fn capture_step(&self) -> u64 {
        self.capture_step
    }
    pub fn is_measured_root(&self) -> bool {
        self.measured_root
    }
    pub fn is_device_synchronized(&self) -> bool {
        self.measured_region_device_synchronized == Some(true)
    }
    /// The gradient contract of the run's capture contract, if any.
    pub fn gradient_contract_ref(&self) -> Option<&GradientContract> {
        self.capture_contract
            .as_ref()
            .and_then(|c| c.gradient_contract.as_ref())
    }

    /// The run JSON `ct_open` takes.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a Run always serialises")
    }
}
