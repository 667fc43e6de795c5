//! The candle capture helpers and the train_mlp example, against the real
//! library, judged by candle-graph.
#![cfg(feature = "candle")]
mod common;

#[path = "../examples/common/mlp.rs"]
mod mlp;

use std::collections::BTreeSet;

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Optimizer, VarMap, SGD};
use candle_trace::candle::{
    backward_step, gradient_contract, gradient_norms, gradient_of, tensor_stats, Stats, Traced,
};
use candle_trace::*;
use common::*;

#[test]
fn example_trace_is_valid_and_complete() {
    let dir = fresh_dir("example");
    let out = dir.path().join("train_mlp.jsonl");
    let (path, losses) = mlp::train(&out, 4).unwrap();
    assert_eq!(losses.len(), 4);
    assert!(losses.iter().all(|l| l.is_finite()));
    let summary = assert_valid_complete(&path);
    let l = lines(&path);
    let meta = &l[0];
    assert_eq!(meta["capture_step"], 3);
    assert_eq!(meta["warmup_steps"], 2);
    assert_eq!(meta["comparison_identity"]["workload_id"], "mlp-synthetic");
    assert_eq!(meta["comparison_identity"]["implementation_id"], "candle");
    assert_eq!(meta["comparison_identity"]["physical_batch"], 32);
    for label in mlp::LABELS {
        span_named(&l, label);
    }
    assert_eq!(span_named(&l, "fc1")["step"], "forward");
    assert!(of_kind(&l, "op").len() >= 2);
    assert!(of_kind(&l, "tensor_stats")
        .iter()
        .any(|s| s["label"] == "fc2/output"));
    let issues = summary["health"]["issues"].as_array().unwrap();
    assert!(
        issues.iter().all(|i| i["severity"] != "error"),
        "{issues:?}"
    );
}

#[test]
fn gradients_match_the_varmap_one_to_one() {
    let dir = fresh_dir("grads");
    let (path, _) = mlp::train(&dir.path().join("t.jsonl"), 3).unwrap();
    let l = lines(&path);
    let s = mlp::setup().unwrap();
    let vars: BTreeSet<String> = s.varmap.data().lock().unwrap().keys().cloned().collect();
    assert_eq!(vars.len(), 4);
    let grads = of_kind(&l, "gradient");
    let keys: Vec<String> = grads
        .iter()
        .map(|g| g["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), vars.len(), "one event per variable: {keys:?}");
    assert_eq!(keys.iter().cloned().collect::<BTreeSet<_>>(), vars);
    assert!(grads.iter().all(|g| g["root"] == mlp::ROOT
        && g["state"] == "present"
        && g["norm"].as_f64().unwrap() > 0.0));
    let expected: Vec<String> = l[0]["capture_contract"]["gradient_contract"]["expected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        expected,
        vars.iter().cloned().collect::<Vec<_>>(),
        "the contract is the VarMap, sorted"
    );
}

#[test]
fn gradient_states_missing_zero_present() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let used = varmap
        .get(
            (2, 2),
            "used.weight",
            candle_nn::Init::Const(1.0),
            DType::F32,
            &dev,
        )
        .unwrap();
    let zeroed = varmap
        .get(
            2,
            "zeroed.bias",
            candle_nn::Init::Const(1.0),
            DType::F32,
            &dev,
        )
        .unwrap();
    let _unused = varmap
        .get(
            3,
            "unused.weight",
            candle_nn::Init::Const(1.0),
            DType::F32,
            &dev,
        )
        .unwrap();
    let x = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &dev).unwrap();
    // zeroed.bias gets an all-zero gradient: d(z - z)/dz = 1 - 1. (candle
    // prunes `z * 0.0` from the graph, which would make it missing.)
    let loss = (x.matmul(&used).unwrap().sum_all().unwrap()
        + (&zeroed - &zeroed).unwrap().sum_all().unwrap())
    .unwrap();

    let dir = fresh_dir("states");
    let path = dir.path().join("t.jsonl");
    let run = Run::training("rust::grads", 1, "cpu").capture_contract(
        CaptureContract::new().gradient_contract(
            gradient_contract("vb", &varmap)
                .family("unused", Expectation::Inactive, 0)
                .family("zeroed", Expectation::DataConditional, 1),
        ),
    );
    let session = Session::open(&path, run).unwrap();
    let mut opt = SGD::new(varmap.all_vars(), 0.1).unwrap();
    {
        let _m = session.measure("update").unwrap();
        let (_, facts) = backward_step(&session, &mut opt, &loss, "vb", &varmap).unwrap();
        let by: std::collections::HashMap<_, _> = facts.into_iter().collect();
        assert!(matches!(by["used.weight"], Gradient::Present(n) if n > 0.0));
        assert_eq!(by["zeroed.bias"], Gradient::Zero);
        assert_eq!(by["unused.weight"], Gradient::Missing);
    }
    session.finish().unwrap();
    let (_, summary, _) = common::summary(&path, false);
    assert_eq!(
        summary["health"]["structurally_valid"], true,
        "{}",
        summary["health"]
    );
    let l = lines(&path);
    let zero = of_kind(&l, "gradient")
        .into_iter()
        .find(|g| g["key"] == "zeroed.bias")
        .unwrap();
    assert_eq!(zero["state"], "zero");
    assert_eq!(zero["norm"].as_f64(), Some(0.0));
}

#[test]
fn stats_count_non_finite_and_reduce_the_finite_rest() {
    let dev = Device::Cpu;
    let t = Tensor::new(
        &[1f32, -2.0, f32::NAN, f32::INFINITY, 3.0, f32::NEG_INFINITY],
        &dev,
    )
    .unwrap()
    .reshape((2, 3))
    .unwrap();
    let s = tensor_stats(&t).unwrap();
    assert_eq!((s.elements, s.non_finite), (6, 3));
    assert!((s.mean - 2.0 / 3.0).abs() < 1e-12);
    assert!((s.rms - (14.0f64 / 3.0).sqrt()).abs() < 1e-12);
    assert_eq!(s.abs_max, 3.0);

    let all_bad = Tensor::new(&[f32::NAN, f32::NAN], &dev).unwrap();
    let s = tensor_stats(&all_bad).unwrap();
    assert_eq!((s.non_finite, s.rms, s.abs_max, s.mean), (2, 0.0, 0.0, 0.0));

    let empty = Tensor::zeros((0, 4), DType::F32, &dev).unwrap();
    assert_eq!(tensor_stats(&empty).unwrap().elements, 0);

    let half = Tensor::new(&[1f32, -3.0], &dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let s = tensor_stats(&half).unwrap();
    assert_eq!((s.abs_max, s.mean), (3.0, -1.0));

    let ints = Tensor::new(&[1u32, 5, 3], &dev).unwrap();
    let s = tensor_stats(&ints).unwrap();
    assert_eq!((s.non_finite, s.abs_max, s.mean), (0, 5.0, 3.0));

    // Recorded through the library, which checks the invariants again.
    let dir = fresh_dir("stats");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(
        &path,
        Run::inference("rust::stats", 1, "cpu").measured_root(),
    )
    .unwrap();
    session
        .record_tensor_stats(SpanId::ROOT, "mixed", &t)
        .unwrap();
    session
        .record_tensor_stats(SpanId::ROOT, "bf16", &half)
        .unwrap();
    session.record_tensor(SpanId::ROOT, &t).unwrap();
    session.finish().unwrap();
    assert_valid_complete(&path);
    let l = lines(&path);
    let mixed = of_kind(&l, "tensor_stats")
        .into_iter()
        .find(|s| s["label"] == "mixed")
        .unwrap();
    assert_eq!(mixed["non_finite"], 3);
    assert_eq!(mixed["shape"], serde_json::json!([2, 3]));
    assert_eq!(of_kind(&l, "tensor")[0]["dtype"], "f32");
}

/// A Neumaier-compensated f64 sum: the reference the stats are held to.
fn reference_sum(v: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0f64, 0f64);
    for x in v {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    s + c
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

/// Deterministic pseudo-random f32 values in [-4, 6).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 10.0 - 4.0
        })
        .collect()
}

#[test]
fn f32_stats_stay_within_1e12_of_an_f64_reference() {
    let dev = Device::Cpu;
    let n = 3_000_003;
    let mut v = noise(n, 7);
    v[12_345] = f32::NAN;
    v[2_000_000] = f32::NEG_INFINITY;
    let t = Tensor::from_vec(v.clone(), n, &dev).unwrap();
    let finite: Vec<f64> = v
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| f64::from(x))
        .collect();
    let m = finite.len() as f64;
    let mean = reference_sum(finite.iter().copied()) / m;
    let rms = (reference_sum(finite.iter().map(|x| x * x)) / m).sqrt();
    let abs_max = finite.iter().fold(0f64, |a, x| a.max(x.abs()));
    for x in [t.clone(), t.reshape((3, 1_000_001)).unwrap().t().unwrap()] {
        let s = tensor_stats(&x).unwrap();
        assert_eq!((s.elements, s.non_finite), (n as u64, 2));
        assert!(
            rel(s.mean, mean) <= 1e-12 && rel(s.rms, rms) <= 1e-12,
            "{s:?} vs mean {mean} rms {rms}"
        );
        assert_eq!(s.abs_max, abs_max);
    }
}

#[test]
fn stats_of_every_cpu_dtype_and_layout() {
    let dev = Device::Cpu;
    let base = Tensor::new(&[[1f32, -2.0, 3.5], [0.25, -8.0, 4.0]], &dev).unwrap();
    let exact = Stats {
        elements: 6,
        non_finite: 0,
        rms: (97.3125f64 / 6.0).sqrt(),
        abs_max: 8.0,
        mean: -1.25 / 6.0,
    };
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = base.to_dtype(dt).unwrap();
        assert_eq!(tensor_stats(&x).unwrap(), exact, "{dt:?}");
        let t = x.t().unwrap();
        assert_eq!(tensor_stats(&t).unwrap(), exact, "{dt:?} transposed");
        let nan = Tensor::cat(
            &[
                &x.flatten_all().unwrap(),
                &Tensor::new(&[f32::NAN, f32::INFINITY], &dev)
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap(),
            ],
            0,
        )
        .unwrap();
        assert_eq!(
            tensor_stats(&nan).unwrap(),
            Stats {
                elements: 8,
                non_finite: 2,
                ..exact
            },
            "{dt:?} with NaN and inf"
        );
    }
    let ints = Tensor::new(&[[7i64, -3, 250], [0, 12, -250]], &dev).unwrap();
    let s = tensor_stats(&ints).unwrap();
    assert_eq!((s.non_finite, s.abs_max, s.mean), (0, 250.0, 16.0 / 6.0));
    assert_eq!(
        s.rms,
        ((49.0f64 + 9.0 + 62500.0 + 144.0 + 62500.0) / 6.0).sqrt()
    );
    let u8s = Tensor::new(&[[7u8, 3, 250], [0, 12, 255]], &dev).unwrap();
    let s = tensor_stats(&u8s.t().unwrap()).unwrap();
    assert_eq!((s.elements, s.abs_max, s.mean), (6, 255.0, 527.0 / 6.0));
    // i64 sums are exact where f64 partial sums would not be.
    let big = Tensor::new(&[i64::MAX, i64::MAX, -i64::MAX, -i64::MAX, 3], &dev).unwrap();
    assert_eq!(tensor_stats(&big).unwrap().mean, 3.0 / 5.0);
    let s = tensor_stats(&Tensor::new(&[i64::MIN], &dev).unwrap()).unwrap();
    assert_eq!((s.abs_max, s.mean), (2f64.powi(63), -(2f64.powi(63))));
    // A broadcast view counts its repeats, like its contiguous copy.
    let b = Tensor::new(&[2f32, -1.0], &dev)
        .unwrap()
        .broadcast_as((1000, 2))
        .unwrap();
    assert_eq!(
        tensor_stats(&b).unwrap(),
        tensor_stats(&b.contiguous().unwrap()).unwrap()
    );
    assert_eq!(
        tensor_stats(&Tensor::zeros((3, 0), DType::U32, &dev).unwrap())
            .unwrap()
            .elements,
        0
    );
    // f64 squares past f64::MAX: rms written as 0, the rest kept.
    let huge = Tensor::new(&[1e300f64, -1e300], &dev).unwrap();
    assert_eq!(
        tensor_stats(&huge).unwrap(),
        Stats {
            elements: 2,
            non_finite: 0,
            rms: 0.0,
            abs_max: 1e300,
            mean: 0.0
        }
    );
}

#[test]
fn gradient_norms_classify_in_place() {
    let dev = Device::Cpu;
    let g = Tensor::new(&[[3f32, 0.0], [0.0, -4.0]], &dev).unwrap();
    let zero = Tensor::zeros(4, DType::BF16, &dev).unwrap();
    let nan = Tensor::new(&[1f32, f32::NAN], &dev).unwrap();
    let inf = Tensor::new(&[f64::INFINITY], &dev).unwrap();
    let overflow = Tensor::new(&[1e300f64, 1e300], &dev).unwrap();
    let empty = Tensor::zeros(0, DType::F32, &dev).unwrap();
    let half = g.t().unwrap().to_dtype(DType::F16).unwrap();
    let norms = gradient_norms(&[&g, &zero, &nan, &inf, &overflow, &empty, &half]).unwrap();
    assert_eq!(
        norms,
        [
            Gradient::Present(5.0),
            Gradient::Zero,
            Gradient::NonFinite,
            Gradient::NonFinite,
            Gradient::NonFinite,
            Gradient::Zero,
            Gradient::Present(5.0)
        ]
    );
    assert_eq!(gradient_of(&g).unwrap(), Gradient::Present(5.0));
    let v = noise(100_000, 3);
    let want = reference_sum(v.iter().map(|&x| f64::from(x) * f64::from(x))).sqrt();
    let Gradient::Present(n) =
        gradient_of(&Tensor::from_vec(v, (100, 1000), &dev).unwrap()).unwrap()
    else {
        panic!("not present")
    };
    assert!(rel(n, want) <= 1e-12, "{n} vs {want}");
}

#[test]
fn traced_module_is_plain_without_a_session() {
    let dev = Device::Cpu;
    let lin = candle_nn::Linear::new(Tensor::ones((3, 2), DType::F32, &dev).unwrap(), None);
    let traced = Traced::new("lin", lin.clone());
    let x = Tensor::ones((1, 2), DType::F32, &dev).unwrap();
    assert!(current().is_none());
    let a = traced.forward(&x).unwrap().to_vec2::<f32>().unwrap();
    let b = lin.forward(&x).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(a, b);
}

#[test]
fn variables_are_parameters() {
    let dev = Device::Cpu;
    let v = Var::ones(3, DType::F32, &dev).unwrap();
    let dir = fresh_dir("params");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(
        &path,
        Run::inference("rust::params", 1, "cpu").measured_root(),
    )
    .unwrap();
    session.record_tensor(SpanId::ROOT, v.as_tensor()).unwrap();
    session.finish().unwrap();
    let l = lines(&path);
    let t = of_kind(&l, "tensor")[0];
    assert_eq!(
        (t["category"].as_str(), t["requires_grad"].as_bool()),
        (Some("parameter"), Some(true))
    );
}

#[test]
fn aggregate_schedule_counts_every_update_and_keeps_the_capture() {
    let dir = fresh_dir("aggregate-schedule");
    let (out, sum) = (dir.path().join("t.jsonl"), dir.path().join("agg.json"));
    let (trace, summary, losses) = mlp::train_aggregate(&out, &sum, Some(50), 200).unwrap();
    assert_eq!(losses.len(), 200);
    assert_valid_complete(&trace);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(doc["schema"], "candle-trace/aggregate/1");
    assert_eq!(doc["final"], true);
    let spans = doc["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 5, "{spans:?}");
    for (name, step) in [
        (mlp::LABELS[0], "forward"),
        (mlp::LABELS[1], "backward"),
        (mlp::LABELS[2], "optimizer"),
        (mlp::AGG_STEP, ""),
        (mlp::AGG_DATA, ""),
    ] {
        let s = spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(s["count"], 200, "{s}");
        assert_eq!(s["step"].as_str().unwrap_or(""), step);
    }
    let scalars = doc["scalars"].as_array().unwrap();
    assert_eq!(scalars.len(), 1);
    assert_eq!(scalars[0]["label"], "loss");
    assert_eq!(scalars[0]["count"], 200);
}

#[test]
fn heap_capture_refuses_without_the_tracing_allocator() {
    // This binary keeps the system allocator.
    let dir = fresh_dir("heap-none");
    let session = Session::open(
        dir.path().join("t.jsonl"),
        Run::inference("rust::heap", 1, "cpu").measured_root(),
    )
    .unwrap();
    let err = candle_trace::heap::HeapCapture::start(&session, SpanId::ROOT).unwrap_err();
    assert_eq!(err.status(), Some(Status::State));
    assert!(
        err.message()
            .contains("TracingAllocator is not the global allocator"),
        "{}",
        err.message()
    );
    assert!(!candle_trace::heap::capturing());
    session.finish().unwrap();
}

#[test]
fn capture_helpers_count_as_the_tracers_work() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let w = varmap
        .get(
            (4, 4),
            "lin.weight",
            candle_nn::Init::Const(0.5),
            DType::F32,
            &dev,
        )
        .unwrap();
    let traced = Traced::new("lin", candle_nn::Linear::new(w.clone(), None));
    let x = Tensor::ones((2, 4), DType::F32, &dev).unwrap();
    let dir = fresh_dir("tracer-work");
    let path = dir.path().join("t.jsonl");
    let run = Run::training("rust::tracer_work", 1, "cpu").capture_contract(
        CaptureContract::new().gradient_contract(gradient_contract("vb", &varmap)),
    );
    let session = Session::open(&path, run).unwrap();
    {
        let _m = session.measure("update").unwrap();
        let grew = |what: &str, f: &mut dyn FnMut()| {
            let before = session.tracer_ns();
            f();
            assert!(
                session.tracer_ns() > before,
                "{what} is not bracketed as the tracer's work"
            );
        };
        let mut y = None;
        grew("Traced::forward", &mut || {
            y = Some(traced.forward(&x).unwrap())
        });
        let y = y.unwrap();
        grew("record_tensor_stats", &mut || {
            session.record_tensor_stats(SpanId::ROOT, "y", &y).unwrap();
        });
        grew("record_tensor", &mut || {
            session.record_tensor(SpanId::ROOT, &y).unwrap()
        });
        grew("trace_op", &mut || {
            candle_trace::candle::trace_op("sum", &[&y], || y.sum_all()).unwrap();
        });
        let grads = y.sum_all().unwrap().backward().unwrap();
        grew("record_gradients", &mut || {
            session.record_gradients("vb", &grads, &varmap).unwrap();
        });
    }
    session.finish().unwrap();
    assert_valid_complete(&path);
}
