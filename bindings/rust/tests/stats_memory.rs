//! Tensor statistics and gradient norms of a large CPU tensor allocate at
//! most 1.2x the tensor's size on top of it (issue 18: the f64 copies and
//! masks of the op-based reduction held about 10x). A counting global allocator
//! measures the peak; one test in this binary, so nothing else allocates
//! meanwhile.
#![cfg(feature = "candle")]
mod common;

use candle_core::{DType, Device, Tensor};
use candle_trace::candle::{gradient_norms, tensor_stats};
use candle_trace::{Run, Session, SpanId};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::held_during as extra;

#[test]
fn stats_and_norms_of_a_large_tensor_allocate_at_most_1_2x_its_size() {
    let dev = Device::Cpu;
    let n = 8 * 256 * 2000; // 4.1 M f32 elements, 16 MiB
    let mut x = 0x2545f4914f6cdd1du64;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let t = Tensor::from_vec(v, (8, 256, 2000), &dev).unwrap();
    let bf16 = t.to_dtype(DType::BF16).unwrap();
    let strided = t.transpose(1, 2).unwrap();
    let dir = common::fresh_dir("stats-memory");
    let session = Session::open(
        dir.path().join("t.jsonl"),
        Run::inference("rust::stats_memory", 1, "cpu").measured_root(),
    )
    .unwrap();

    let cases: [(&str, &Tensor); 3] = [("f32", &t), ("f32 transposed", &strided), ("bf16", &bf16)];
    for (name, x) in cases {
        let bytes = x.elem_count() * x.dtype().size_in_bytes();
        let limit = bytes * 6 / 5;
        let (s, stats) = extra(|| tensor_stats(x).unwrap());
        assert_eq!((s.elements, s.non_finite), (n as u64, 0));
        let (_, record) = extra(|| session.record_tensor_stats(SpanId::ROOT, name, x).unwrap());
        let (g, norm) = extra(|| gradient_norms(&[x]).unwrap());
        assert!(matches!(g[0], candle_trace::Gradient::Present(_)), "{g:?}");
        eprintln!("{name}: {bytes}-byte tensor; bytes held on top: tensor_stats {stats}, record_tensor_stats {record}, gradient_norms {norm}");
        for (what, used) in [
            ("tensor_stats", stats),
            ("record_tensor_stats", record),
            ("gradient_norms", norm),
        ] {
            assert!(
                used <= limit,
                "{name}: {what} held {used} bytes on top of a {bytes}-byte tensor"
            );
        }
    }
    session.finish().unwrap();
}
