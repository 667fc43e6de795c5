//! Writes a handful of traces with candle-graph 0.10.1's own `TraceSession`
//! into the directory given as the first argument:
//!
//! - `train.jsonl`: a training capture with a measured region, forward /
//!   backward / optimizer step spans, ops, tensors, scalar stats, memory,
//!   device memory, device intervals, edges and an exact gradient contract.
//! - `infer.jsonl`: an inference capture with less evidence (its health
//!   carries evidence-gap warnings).
//! - `failed.jsonl`: a capture ended with `finish_failed`, spans left open.
//! - `flawed.jsonl`: a capture whose content breaks health rules that the
//!   session does not check on write (an op outside its span, an unpaired
//!   free, a call edge with the wrong duration, a manifest gradient never
//!   recorded).
//!
//! The Go test `TestCandleGraphWriterAgreement` runs it and compares our
//! reader's verdict with `candle-graph summary` on each file.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use candle_graph::capability::{
    CaptureContract, CoverageLevel, ExpectedGradient, GradientContract, GradientFamilyContract,
    MeasurementScope,
};
use candle_graph::phase::ExecutionStep;
use candle_graph::trace::{ComparisonIdentity, GradientState, MemoryCategory};
use candle_graph::{
    DeviceIntervalRecord, DeviceMemoryRecord, MemoryRecord, OpRecord, ProfileRun, SpanId, SpanKind,
    TensorRecord, TraceSession,
};

fn main() -> Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: candle_graph_writer OUT_DIR")?,
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    write_train(&dir.join("train.jsonl"))?;
    write_infer(&dir.join("infer.jsonl"))?;
    write_failed(&dir.join("failed.jsonl"))?;
    write_flawed(&dir.join("flawed.jsonl"))?;
    println!("wrote 4 traces to {}", dir.display());
    Ok(())
}

/// Spins until the session clock has advanced, so every interval we record
/// has a positive duration and lies strictly inside its span.
fn tick(session: &TraceSession) -> u64 {
    let start = session.elapsed_ns();
    let t = Instant::now();
    while session.elapsed_ns() <= start + 1_000 || t.elapsed().as_nanos() < 1_000 {
        std::hint::spin_loop();
    }
    session.elapsed_ns()
}

fn identity(implementation: &str) -> ComparisonIdentity {
    ComparisonIdentity {
        implementation_id: Some(implementation.into()),
        workload_id: "tiny-mlp".into(),
        model_id: "mlp-2x4".into(),
        config_id: "default".into(),
        data_id: "synthetic-8".into(),
        seed_policy: "fixed-0".into(),
        physical_batch: 8,
        accumulation_steps: 1,
        precision: "f32".into(),
        device_state: "cold".into(),
        pair_id: None,
    }
}

/// One matmul-like op in `span`: op record, output tensor, device interval,
/// an alloc of its output storage and a data edge from its input.
fn op(session: &TraceSession, span: SpanId, name: &str, input: &str, output: &str) -> Result<()> {
    let start = tick(session);
    let end = tick(session);
    let inputs = vec![input.to_string(), "w".to_string()];
    session.record_op(
        span,
        OpRecord {
            op_name: name,
            inputs: &inputs,
            output: Some(output),
            shape: &[8, 4],
            dtype: "f32",
            device: "cpu",
            duration_ns: end - start,
            timestamp_ns: start,
            output_dense_bytes: None,
            input_dense_bytes: 256,
        },
    )?;
    session.record_tensor(
        span,
        TensorRecord {
            tensor_id: output,
            label: Some(output),
            shape: &[8, 4],
            dtype: "f32",
            device: "cpu",
            requires_grad: false,
            dense_bytes: None,
            category: MemoryCategory::Activation,
        },
    )?;
    session.record_device_interval(
        span,
        DeviceIntervalRecord {
            device: "cpu",
            stream_id: "0",
            clock_id: "host-monotonic",
            backend: "cpu",
            start_ns: start,
            duration_ns: end - start,
        },
    )?;
    session.record_memory_alloc(span, mem(output, None))?;
    session.record_data_edge(input, output)?;
    Ok(())
}

fn mem<'a>(tensor: &'a str, op_name: Option<&'a str>) -> MemoryRecord<'a> {
    MemoryRecord {
        storage_id: tensor,
        tensor_id: tensor,
        device: "cpu",
        bytes: 128,
        dtype: "f32",
        category: MemoryCategory::Activation,
        timestamp_ns: None,
        op_name,
        shape: &[8, 4],
    }
}

fn device_memory(session: &TraceSession, used: u64) -> Result<()> {
    session.record_device_memory(DeviceMemoryRecord {
        device: "cpu",
        used_bytes: Some(used),
        free_bytes: None,
        reserved_bytes: Some(4096),
        capacity_bytes: Some(1 << 20),
        timestamp_ns: None,
    })
}

fn contract(gradients: Option<GradientContract>) -> CaptureContract {
    CaptureContract {
        measurement_scope: MeasurementScope::ProfiledWork,
        operations: CoverageLevel::Complete,
        activations: CoverageLevel::Partial,
        tensors: CoverageLevel::Partial,
        gradients: if gradients.is_some() {
            CoverageLevel::Complete
        } else {
            CoverageLevel::None
        },
        gradient_contract: gradients,
        logical_memory: CoverageLevel::Complete,
        physical_memory: CoverageLevel::Partial,
        device_timing: CoverageLevel::Partial,
        required_semantic_labels: vec!["mlp/forward".into()],
        gpu_expected_semantic_labels: Vec::new(),
        cpu_only_semantic_labels: Vec::new(),
    }
}

fn gradient_contract() -> Result<GradientContract> {
    GradientContract::new(
        vec![
            ExpectedGradient::new("vb", "layer1.weight", "body"),
            ExpectedGradient::new("vb", "layer2.weight", "body"),
            ExpectedGradient::new("vb", "head.weight", "head"),
        ],
        vec![
            GradientFamilyContract::active("body", 2),
            GradientFamilyContract::data_conditional("head", 1),
        ],
    )
}

fn write_train(path: &Path) -> Result<()> {
    let run = ProfileRun::training("mlp::train_step", 3, "cpu")
        .tag("writer", "candle_graph_writer")
        .capture_contract(contract(Some(gradient_contract()?)))
        .comparison_identity(identity("candle-graph-writer"));
    let session = TraceSession::open(path, run)?;
    {
        let measured = session.begin_measurement("mlp/step");
        {
            let fwd =
                session.begin_step_span("mlp/forward", ExecutionStep::Forward, SpanKind::Module);
            op(&session, fwd.id(), "matmul", "x", "h1")?;
            op(&session, fwd.id(), "relu", "h1", "h2")?;
            session.record_scalar(fwd.id(), "loss", 0.75)?;
            session.record_memory_free(fwd.id(), mem("h1", Some("relu")))?;
            device_memory(&session, 2048)?;
            tick(&session);
        }
        {
            let bwd =
                session.begin_step_span("mlp/backward", ExecutionStep::Backward, SpanKind::Module);
            op(&session, bwd.id(), "matmul_backward", "h2", "g1")?;
            session.record_memory_free(bwd.id(), mem("h2", None))?;
            session.record_memory_free(bwd.id(), mem("g1", None))?;
            tick(&session);
        }
        {
            let opt = session.begin_step_span(
                "mlp/optimizer",
                ExecutionStep::Optimizer,
                SpanKind::Function,
            );
            session.record_scalar(opt.id(), "lr", 1e-3)?;
            device_memory(&session, 1024)?;
            tick(&session);
        }
        drop(measured);
    }
    session.record_gradient("vb", "layer1.weight", GradientState::Present, Some(0.5))?;
    session.record_gradient("vb", "layer2.weight", GradientState::Present, Some(0.25))?;
    session.record_gradient("vb", "head.weight", GradientState::Zero, Some(0.0))?;
    // Completed host work attached to the root (candle-graph's API for
    // work that overlapped the live stack).
    let start = session.elapsed_ns();
    tick(&session);
    let dur = tick(&session) - start;
    session.record_completed_host_span("mlp/data_loader", SpanKind::Function, start, dur)?;
    session.finish()?;
    Ok(())
}

fn write_infer(path: &Path) -> Result<()> {
    let run = ProfileRun::inference("mlp::infer", 1, "cpu")
        .capture_contract(contract(None))
        .comparison_identity(identity("candle-graph-writer"));
    let session = TraceSession::open(path, run)?;
    {
        let measured = session.begin_measurement("mlp/measured");
        {
            let fwd = session.begin_span("mlp/forward", SpanKind::Module);
            op(&session, fwd.id(), "matmul", "x", "y")?;
            session.record_memory_free(fwd.id(), mem("y", None))?;
            tick(&session);
        }
        drop(measured);
    }
    session.finish()?;
    Ok(())
}

fn write_failed(path: &Path) -> Result<()> {
    let run = ProfileRun::training("mlp::train_step", 1, "cpu").capture_contract(contract(None));
    let session = TraceSession::open(path, run)?;
    let measured = session.begin_measurement("mlp/step");
    let fwd = session.begin_step_span("mlp/forward", ExecutionStep::Forward, SpanKind::Module);
    op(&session, fwd.id(), "matmul", "x", "h1")?;
    tick(&session);
    // The process "dies" inside the forward pass: the spans stay open.
    std::mem::forget(fwd);
    std::mem::forget(measured);
    session.finish_failed("out of memory in mlp/forward")?;
    Ok(())
}

fn write_flawed(path: &Path) -> Result<()> {
    let run = ProfileRun::training("mlp::train_step", 2, "cpu")
        .capture_contract(contract(Some(gradient_contract()?)));
    let session = TraceSession::open(path, run)?;
    {
        let measured = session.begin_measurement("mlp/step");
        {
            let fwd =
                session.begin_step_span("mlp/forward", ExecutionStep::Forward, SpanKind::Module);
            op(&session, fwd.id(), "matmul", "x", "h1")?;
            // An op stamped before its span started: operation_outside_span.
            session.record_op(
                fwd.id(),
                OpRecord {
                    op_name: "early",
                    inputs: &[],
                    output: None,
                    shape: &[1],
                    dtype: "f32",
                    device: "cpu",
                    duration_ns: 1,
                    timestamp_ns: 1,
                    output_dense_bytes: None,
                    input_dense_bytes: 0,
                },
            )?;
            // A free of a storage that was never allocated: unpaired_free.
            session.record_memory_free(fwd.id(), mem("ghost", None))?;
            tick(&session);
            // A call edge whose duration cannot match the span's (the
            // guard measures its own on drop): call_edge_duration_mismatch.
            session.record_call_edge(measured.id(), fwd.id(), 1)?;
        }
        drop(measured);
    }
    session.record_gradient("vb", "layer1.weight", GradientState::Present, Some(1.0))?;
    session.record_gradient("vb", "layer2.weight", GradientState::Zero, Some(0.0))?;
    // head.weight is never recorded: gradient_manifest_missing_key.
    session.finish()?;
    Ok(())
}
