//! The reductions behind [`super::tensor_stats`] and [`super::gradient_norms`].
//!
//! On the CPU the tensor's storage is read in place, in its own dtype, one
//! block of at most [`BLOCK`] elements at a time (a strided layout is
//! gathered block by block, a broadcast one reads its repeats), with `f64`
//! accumulators in [`LANES`] lanes per block and Neumaier-compensated totals
//! across blocks. Integer sums are exact (`i128`). Nothing of tensor size is
//! allocated: f16 and bf16 blocks are widened into a block-sized buffer.
//! Contiguous tensors are reduced in segments of [`SEGMENT`] elements merged
//! in order, on candle's CPU thread pool from [`PARALLEL_MIN`] elements on;
//! the results are the same bits whatever the number of threads.
//!
//! Elsewhere (CUDA, Metal, and dtypes the CPU path does not read) candle ops
//! reduce chunks of at most [`OPS_CHUNK`] elements in `f32` (`f64` for f64
//! tensors, and for integers where the device has f64), a few scalars per
//! chunk, read back in one transfer and combined in `f64` on the host.
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use candle_core::{CpuStorage, DType, Device, Layout, Storage, Tensor};
use half::slice::HalfFloatSliceExt;

use super::Stats;

/// Elements reduced at a time on the CPU (a gathered block's buffer).
pub(crate) const BLOCK: usize = 4096;
/// Accumulator lanes per block; what lets the compiler vectorize the loop.
const LANES: usize = 16;
/// Elements per segment of a contiguous CPU tensor: the unit of work of the
/// CPU pass. Segments are reduced each on its own and combined in order, so
/// the result does not depend on how many threads reduced them.
const SEGMENT: usize = 64 * BLOCK;
/// From this many elements in all, the CPU pass runs on candle's CPU thread
/// pool (the one its own ops use).
const PARALLEL_MIN: usize = 4 * SEGMENT;
/// Elements per chunk of the candle-op reduction: a chunk's temporaries are a
/// few times this, whatever the tensor's size. Below 2^24 so that counts
/// summed in `f32` are exact.
pub(crate) const OPS_CHUNK: usize = 1 << 22;

/// A Neumaier-compensated running sum.
#[derive(Debug, Default, Clone, Copy)]
struct Sum {
    s: f64,
    c: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.s + x;
        if self.s.abs() >= x.abs() {
            self.c += (self.s - t) + x;
        } else {
            self.c += (x - t) + self.s;
        }
        self.s = t;
    }

    fn value(self) -> f64 {
        // Past an overflow the compensation is NaN; the sum's inf says it.
        if self.s.is_finite() {
            self.s + self.c
        } else {
            self.s
        }
    }
}

/// One block's (or chunk's) partial results.
#[derive(Debug, Default, Clone, Copy)]
struct Block {
    non_finite: u64,
    sum: f64,
    sumsq: f64,
    abs_max: f64,
    /// The exact sum of an integer block (`sum` is 0 then).
    int_sum: i128,
}

/// Running totals of [`Block`]s.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    non_finite: u64,
    sum: Sum,
    sumsq: Sum,
    abs_max: f64,
    int_sum: i128,
}

impl Totals {
    fn add(&mut self, b: Block) {
        self.non_finite += b.non_finite;
        self.sum.add(b.sum);
        self.sumsq.add(b.sumsq);
        self.int_sum = self.int_sum.saturating_add(b.int_sum);
        if b.abs_max > self.abs_max {
            self.abs_max = b.abs_max;
        }
    }

    fn merge(&mut self, o: Totals) {
        self.non_finite += o.non_finite;
        self.sum.add(o.sum.value());
        self.sumsq.add(o.sumsq.value());
        self.int_sum = self.int_sum.saturating_add(o.int_sum);
        if o.abs_max > self.abs_max {
            self.abs_max = o.abs_max;
        }
    }

    fn finish(self, elements: u64) -> Stats {
        let finite = elements.saturating_sub(self.non_finite);
        finish_stats(
            elements,
            finite as f64,
            self.sum.value() + self.int_sum as f64,
            self.sumsq.value(),
            self.abs_max,
        )
    }
}

/// Stats from the totals of the finite elements: all 0 when none is finite,
/// a non-finite reduction (an overflowed sum of squares) written as 0.
pub(crate) fn finish_stats(
    elements: u64,
    finite: f64,
    sum: f64,
    sumsq: f64,
    abs_max: f64,
) -> Stats {
    let finite_n = finite.round().max(0.0) as u64;
    let non_finite = elements.saturating_sub(finite_n);
    let fin = |v: f64| if v.is_finite() { v } else { 0.0 };
    if finite_n == 0 {
        return Stats {
            elements,
            non_finite,
            rms: 0.0,
            abs_max: 0.0,
            mean: 0.0,
        };
    }
    let n = finite_n as f64;
    Stats {
        elements,
        non_finite,
        rms: fin((sumsq / n).sqrt()).max(0.0),
        abs_max: fin(abs_max).max(0.0),
        mean: fin(sum / n),
    }
}

/// A floating-point element the CPU kernels reduce in place.
trait Float: Copy + PartialOrd {
    const MAX: Self;
    const ZERO: Self;
    fn abs(self) -> Self;
    fn wide(self) -> f64;
}

macro_rules! float {
    ($($t:ty),*) => {$(
        impl Float for $t {
            const MAX: Self = <$t>::MAX;
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn wide(self) -> f64 {
                f64::from(self)
            }
        }
    )*};
}
float!(f32, f64);

/// An integer element; every one candle has fits an `i64`.
trait Int: Copy {
    fn wide(self) -> i64;
}

impl<T: Copy + Into<i64>> Int for T {
    #[inline(always)]
    fn wide(self) -> i64 {
        self.into()
    }
}

/// Sums the lanes pairwise.
#[inline(always)]
fn lanes_sum(mut v: [f64; LANES]) -> f64 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            v[i] += v[i + w];
        }
    }
    v[0]
}

#[inline(always)]
fn float_step<T: Float>(x: T, s: &mut f64, q: &mut f64, m: &mut T, bad: &mut u64) {
    let a = x.abs();
    // |x| <= MAX is false for NaN and ±inf.
    let ok = a <= T::MAX;
    *bad += u64::from(!ok);
    let v = if ok { x.wide() } else { 0.0 };
    let a = if ok { a } else { T::ZERO };
    *s += v;
    *q += v * v;
    if a > *m {
        *m = a;
    }
}

/// Whether all of `xs` are finite, and their largest magnitude.
#[inline(always)]
fn scan<T: Float>(xs: &[T]) -> (bool, T) {
    const W: usize = LANES;
    let (mut m, mut bad) = ([T::ZERO; W], [0u32; W]);
    let mut lanes = xs.chunks_exact(W);
    for c in &mut lanes {
        for i in 0..W {
            let a = c[i].abs();
            // |x| <= MAX is false for NaN and ±inf.
            let finite = a <= T::MAX;
            bad[i] |= u32::from(!finite);
            if a > m[i] {
                m[i] = a;
            }
        }
    }
    for (i, &x) in lanes.remainder().iter().enumerate() {
        let a = x.abs();
        let finite = a <= T::MAX;
        bad[i] |= u32::from(!finite);
        if a > m[i] {
            m[i] = a;
        }
    }
    let max = m
        .iter()
        .fold(T::ZERO, |acc, &v| if v > acc { v } else { acc });
    (bad.iter().all(|&b| b == 0), max)
}

/// Non-finite count, and sum, sum of squares and |max| of the finite rest:
/// a scan for non-finite values and the maximum, then plain sums when there
/// are none (the usual case), masked sums when there are.
#[inline(always)]
fn float_block_any<T: Float>(xs: &[T]) -> Block {
    let (all_finite, max) = scan(xs);
    if !all_finite {
        return masked_block(xs);
    }
    let (mut s, mut q) = ([0f64; LANES], [0f64; LANES]);
    let mut lanes = xs.chunks_exact(LANES);
    for c in &mut lanes {
        for i in 0..LANES {
            let v = c[i].wide();
            s[i] += v;
            q[i] += v * v;
        }
    }
    for (i, &x) in lanes.remainder().iter().enumerate() {
        let v = x.wide();
        s[i] += v;
        q[i] += v * v;
    }
    Block {
        non_finite: 0,
        sum: lanes_sum(s),
        sumsq: lanes_sum(q),
        abs_max: max.wide(),
        int_sum: 0,
    }
}

/// [`float_block`] of a block with non-finite elements.
fn masked_block<T: Float>(xs: &[T]) -> Block {
    let (mut s, mut q, mut m, mut bad) = (
        [0f64; LANES],
        [0f64; LANES],
        [T::ZERO; LANES],
        [0u64; LANES],
    );
    let mut lanes = xs.chunks_exact(LANES);
    for c in &mut lanes {
        for i in 0..LANES {
            float_step(c[i], &mut s[i], &mut q[i], &mut m[i], &mut bad[i]);
        }
    }
    for (i, &x) in lanes.remainder().iter().enumerate() {
        float_step(x, &mut s[i], &mut q[i], &mut m[i], &mut bad[i]);
    }
    let abs_max = m.iter().fold(0f64, |acc, v| acc.max(v.wide()));
    Block {
        non_finite: bad.iter().sum(),
        sum: lanes_sum(s),
        sumsq: lanes_sum(q),
        abs_max,
        int_sum: 0,
    }
}

/// The sum of squares of all elements (NaN or inf when one is not finite).
#[inline(always)]
fn float_sumsq_any<T: Float>(xs: &[T]) -> f64 {
    let mut q = [0f64; LANES];
    let mut lanes = xs.chunks_exact(LANES);
    for c in &mut lanes {
        for i in 0..LANES {
            let v = c[i].wide();
            q[i] += v * v;
        }
    }
    for (i, &x) in lanes.remainder().iter().enumerate() {
        let v = x.wide();
        q[i] += v * v;
    }
    lanes_sum(q)
}

// The float kernels once more for AVX2 (4 f64 a vector instead of SSE2's 2),
// taken where the CPU has it. The results are the same bits: the same
// operations in the same order (Rust neither fuses nor reorders them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn float_block_avx2<T: Float>(xs: &[T]) -> Block {
    float_block_any(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn float_sumsq_avx2<T: Float>(xs: &[T]) -> f64 {
    float_sumsq_any(xs)
}

fn float_block<T: Float>(xs: &[T]) -> Block {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, all that float_block_avx2 needs.
        return unsafe { float_block_avx2(xs) };
    }
    float_block_any(xs)
}

fn float_sumsq<T: Float>(xs: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, all that float_sumsq_avx2 needs.
        return unsafe { float_sumsq_avx2(xs) };
    }
    float_sumsq_any(xs)
}

/// The exact sum, the sum of squares in `f64` and |max| of integers.
fn int_block<T: Int>(xs: &[T]) -> Block {
    let (mut sum, mut q, mut m) = (0i128, [0f64; LANES], 0u64);
    for (i, &x) in xs.iter().enumerate() {
        let v = x.wide();
        sum += i128::from(v);
        let f = v as f64;
        q[i % LANES] += f * f;
        m = m.max(v.unsigned_abs());
    }
    Block {
        non_finite: 0,
        sum: 0.0,
        sumsq: lanes_sum(q),
        abs_max: m as f64,
        int_sum: sum,
    }
}

fn int_sumsq<T: Int>(xs: &[T]) -> f64 {
    let mut q = [0f64; LANES];
    for (i, &x) in xs.iter().enumerate() {
        let f = x.wide() as f64;
        q[i % LANES] += f * f;
    }
    lanes_sum(q)
}

/// What a CPU pass does with each block, and how two passes' results over
/// consecutive parts combine.
trait Kernel: Default + Send {
    fn float<T: Float>(&mut self, xs: &[T]);
    fn int<T: Int>(&mut self, xs: &[T]);
    fn merge(&mut self, later: Self);
}

impl Kernel for Totals {
    fn float<T: Float>(&mut self, xs: &[T]) {
        self.add(float_block(xs));
    }
    fn int<T: Int>(&mut self, xs: &[T]) {
        self.add(int_block(xs));
    }
    fn merge(&mut self, later: Self) {
        Totals::merge(self, later);
    }
}

/// The sum of squares of a gradient.
#[derive(Debug, Default)]
struct SumSq(Sum);

impl Kernel for SumSq {
    fn float<T: Float>(&mut self, xs: &[T]) {
        self.0.add(float_sumsq(xs));
    }
    fn int<T: Int>(&mut self, xs: &[T]) {
        self.0.add(int_sumsq(xs));
    }
    fn merge(&mut self, later: Self) {
        self.0.add(later.0.value());
    }
}

fn layout_error(layout: &Layout, len: usize) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "candle-trace: layout {layout:?} reaches past its storage of {len} elements"
    ))
}

/// Calls `f` with the elements of `layout` in `data`, in logical order, in
/// blocks of at most [`BLOCK`]: slices of `data` where the layout has runs
/// that long, else gathered into one block-sized buffer. `part` (logical
/// element indices) restricts a contiguous layout; a strided one is read
/// whole.
fn for_each_block<T: Copy>(
    data: &[T],
    layout: &Layout,
    part: Option<Range<usize>>,
    mut f: impl FnMut(&[T]),
) -> candle_core::Result<()> {
    if layout.shape().elem_count() == 0 {
        return Ok(());
    }
    if let Some((start, end)) = layout.contiguous_offsets() {
        let (a, b) = part.map_or((start, end), |r| {
            (start + r.start, (start + r.end).min(end))
        });
        data.get(a..b)
            .ok_or_else(|| layout_error(layout, data.len()))?
            .chunks(BLOCK)
            .for_each(f);
        return Ok(());
    }
    let (dims, strides) = (layout.dims(), layout.stride());
    // The innermost run of adjacent elements, over the trailing dims it spans.
    let (mut k, mut run) = (dims.len(), 1usize);
    while k > 0 && (dims[k - 1] == 1 || strides[k - 1] == run) {
        run *= dims[k - 1];
        k -= 1;
    }
    if k == 0 {
        let start = layout.start_offset();
        data.get(start..start + run)
            .ok_or_else(|| layout_error(layout, data.len()))?
            .chunks(BLOCK)
            .for_each(f);
        return Ok(());
    }
    // Rows: the innermost remaining dim, `len` runs `stride` apart.
    let (len, stride) = (dims[k - 1], strides[k - 1]);
    let (outer, outer_strides) = (&dims[..k - 1], &strides[..k - 1]);
    let gather = run < BLOCK / 4;
    let mut buf: Vec<T> = if gather {
        Vec::with_capacity(BLOCK)
    } else {
        Vec::new()
    };
    let mut idx = vec![0usize; outer.len()];
    let mut off = layout.start_offset();
    loop {
        let last = off + (len - 1) * stride + run;
        if last > data.len() {
            return Err(layout_error(layout, data.len()));
        }
        for j in 0..len {
            let piece = &data[off + j * stride..off + j * stride + run];
            if !gather {
                piece.chunks(BLOCK).for_each(&mut f);
                continue;
            }
            if buf.len() + run > BLOCK {
                f(&buf);
                buf.clear();
            }
            buf.extend_from_slice(piece);
        }
        // The next row: advance the outer index, last dim fastest.
        let mut d = outer.len();
        loop {
            if d == 0 {
                if !buf.is_empty() {
                    f(&buf);
                }
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            off += outer_strides[d];
            if idx[d] < outer[d] {
                break;
            }
            off -= outer_strides[d] * outer[d];
            idx[d] = 0;
        }
    }
}

/// Widens f16/bf16 blocks into `w` and hands them on as f32.
fn widened<'a, K: Kernel, H: Copy>(
    k: &'a mut K,
    w: &'a mut [f32; BLOCK],
    widen: impl Fn(&[H], &mut [f32]) + 'a,
) -> impl FnMut(&[H]) + 'a {
    move |b: &[H]| {
        let n = b.len().min(BLOCK);
        widen(&b[..n], &mut w[..n]);
        k.float(&w[..n]);
    }
}

/// Runs `k` over a CPU tensor's storage in place (over `part` of it, see
/// [`for_each_block`]). `false` when the tensor is not on the CPU or its
/// dtype is not one the kernels read.
fn visit_cpu<K: Kernel>(
    t: &Tensor,
    part: Option<Range<usize>>,
    k: &mut K,
) -> candle_core::Result<bool> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Ok(false);
    };
    match cpu {
        CpuStorage::F32(v) => for_each_block(v, layout, part, |b| k.float(b))?,
        CpuStorage::F64(v) => for_each_block(v, layout, part, |b| k.float(b))?,
        CpuStorage::F16(v) => {
            let mut w = [0f32; BLOCK];
            for_each_block(
                v,
                layout,
                part,
                widened(k, &mut w, |b: &[half::f16], w| b.convert_to_f32_slice(w)),
            )?
        }
        CpuStorage::BF16(v) => {
            let mut w = [0f32; BLOCK];
            // bf16 is the top half of an f32.
            let widen = |b: &[half::bf16], w: &mut [f32]| {
                b.iter()
                    .zip(w.iter_mut())
                    .for_each(|(x, y)| *y = f32::from_bits(u32::from(x.to_bits()) << 16))
            };
            for_each_block(v, layout, part, widened(k, &mut w, widen))?
        }
        CpuStorage::U8(v) => for_each_block(v, layout, part, |b| k.int(b))?,
        CpuStorage::U32(v) => for_each_block(v, layout, part, |b| k.int(b))?,
        CpuStorage::I16(v) => for_each_block(v, layout, part, |b| k.int(b))?,
        CpuStorage::I32(v) => for_each_block(v, layout, part, |b| k.int(b))?,
        CpuStorage::I64(v) => for_each_block(v, layout, part, |b| k.int(b))?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// How the CPU pass reads a tensor: `None` when it cannot (not on the CPU,
/// or a dtype it does not read), else the parts it reduces one by one.
fn cpu_parts(t: &Tensor) -> Option<Vec<Option<Range<usize>>>> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let readable = matches!(
        cpu,
        CpuStorage::F32(_)
            | CpuStorage::F64(_)
            | CpuStorage::F16(_)
            | CpuStorage::BF16(_)
            | CpuStorage::U8(_)
            | CpuStorage::U32(_)
            | CpuStorage::I16(_)
            | CpuStorage::I32(_)
            | CpuStorage::I64(_)
    );
    if !readable {
        return None;
    }
    if !layout.is_contiguous() {
        return Some(vec![None]);
    }
    let n = layout.shape().elem_count();
    Some(
        (0..n)
            .step_by(SEGMENT)
            .map(|s| Some(s..(s + SEGMENT).min(n)))
            .collect(),
    )
}

/// A fresh `K` run over each tensor of `ts` the CPU pass reads (`None` for
/// the others): contiguous ones segment by segment, the segments' results
/// merged in order; on candle's CPU thread pool when there are at least
/// `parallel_min` elements in all.
fn reduce_cpu<K: Kernel>(
    ts: &[&Tensor],
    parallel_min: usize,
) -> candle_core::Result<Vec<Option<K>>> {
    let mut out: Vec<Option<K>> = ts.iter().map(|_| None).collect();
    let mut tasks: Vec<(usize, Option<Range<usize>>)> = Vec::new();
    let mut total = 0usize;
    for (i, t) in ts.iter().enumerate() {
        if let Some(parts) = cpu_parts(t) {
            tasks.extend(parts.into_iter().map(|p| (i, p)));
            out[i] = Some(K::default());
            total += t.elem_count();
        }
    }
    let run = |(i, part): &(usize, Option<Range<usize>>)| -> candle_core::Result<K> {
        let mut k = K::default();
        if visit_cpu(ts[*i], part.clone(), &mut k)? {
            Ok(k)
        } else {
            Err(candle_core::Error::Msg(
                "candle-trace: a tensor left the CPU during its statistics".to_string(),
            ))
        }
    };
    let results: Vec<candle_core::Result<K>> = if total < parallel_min || tasks.len() < 2 {
        tasks.iter().map(run).collect()
    } else {
        let slots: Vec<Mutex<Option<candle_core::Result<K>>>> =
            tasks.iter().map(|_| Mutex::new(None)).collect();
        candle_core::utils::barrier_pool().execute_chunked(tasks.len(), |range| {
            for j in range {
                let r = run(&tasks[j]);
                *slots[j].lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
            }
        });
        let missing = || {
            Err(candle_core::Error::Msg(
                "candle-trace: a part of the statistics was not reduced".to_string(),
            ))
        };
        slots
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unwrap_or_else(missing)
            })
            .collect()
    };
    for ((i, _), r) in tasks.iter().zip(results) {
        let k = r?;
        if let Some(acc) = out[*i].as_mut() {
            acc.merge(k);
        }
    }
    Ok(out)
}

/// The statistics of a non-empty tensor: in place on the CPU, else by ops.
pub(crate) fn stats(t: &Tensor) -> candle_core::Result<Stats> {
    match reduce_cpu::<Totals>(&[t], PARALLEL_MIN)?.pop().flatten() {
        Some(totals) => Ok(totals.finish(t.elem_count() as u64)),
        None => stats_by_ops(t, OPS_CHUNK),
    }
}

/// The dtype the op path reduces `dtype` in on `device`.
fn ops_dtype(dtype: DType, device: &Device) -> DType {
    if dtype == DType::F64 || (dtype.is_int() && !device.is_metal()) {
        DType::F64
    } else {
        DType::F32
    }
}

/// `t` flattened and cut in chunks of at most `chunk` elements, each in the
/// op path's dtype; one contiguous copy of `t` first when it is strided.
fn chunks(
    t: &Tensor,
    chunk: usize,
) -> candle_core::Result<impl Iterator<Item = candle_core::Result<Tensor>>> {
    let n = t.elem_count();
    let cd = ops_dtype(t.dtype(), t.device());
    let flat = t.flatten_all()?;
    let chunk = chunk.max(1);
    Ok((0..n)
        .step_by(chunk)
        .map(move |start| flat.narrow(0, start, chunk.min(n - start))?.to_dtype(cd)))
}

/// `[non_finite, sum, sumsq, abs_max]` of one flat chunk, on its device.
fn chunk_partials(x: &Tensor, int: bool) -> candle_core::Result<Tensor> {
    let (dev, cd) = (x.device(), x.dtype());
    if int {
        let zero = Tensor::zeros(1, cd, dev)?;
        return Tensor::cat(
            &[
                zero,
                x.sum_all()?.reshape(1)?,
                x.sqr()?.sum_all()?.reshape(1)?,
                x.abs()?.max_all()?.reshape(1)?,
            ],
            0,
        );
    }
    let max = if cd == DType::F64 {
        f64::MAX
    } else {
        f32::MAX as f64
    };
    let a = x.abs()?;
    // |x| <= MAX is false for NaN and ±inf.
    let finite = a.le(max)?;
    let non_finite = finite
        .to_dtype(cd)?
        .sum_all()?
        .affine(-1.0, x.elem_count() as f64)?;
    let zero = Tensor::zeros((), cd, dev)?.broadcast_as(x.shape())?;
    let abs_max = finite.where_cond(&a, &zero)?.max_all()?;
    drop(a);
    let xf = finite.where_cond(x, &zero)?;
    drop(finite);
    Tensor::stack(
        &[non_finite, xf.sum_all()?, xf.sqr()?.sum_all()?, abs_max],
        0,
    )
}

/// The statistics of a non-empty tensor by candle ops on its device, in
/// chunks of at most `chunk` elements; one transfer to the host.
pub(crate) fn stats_by_ops(t: &Tensor, chunk: usize) -> candle_core::Result<Stats> {
    let int = t.dtype().is_int();
    let parts = chunks(t, chunk)?
        .map(|x| chunk_partials(&x?, int))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let v = to_f64s(&Tensor::cat(&parts, 0)?)?;
    let mut totals = Totals::default();
    for p in v.chunks_exact(4) {
        totals.add(Block {
            non_finite: p[0].round().max(0.0) as u64,
            sum: p[1],
            sumsq: p[2],
            abs_max: p[3],
            int_sum: 0,
        });
    }
    Ok(totals.finish(t.elem_count() as u64))
}

/// The values of a 1-D tensor as `f64`.
pub(crate) fn to_f64s(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    match t.dtype() {
        DType::F64 => t.to_vec1::<f64>(),
        _ => Ok(t
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect()),
    }
}

/// The sums of squares of `grads`: in place for CPU tensors; by ops for the
/// rest (all of them unless `in_place`), one transfer per device for all of
/// them. NaN or inf for a gradient
/// with a non-finite element.
pub(crate) fn sums_of_squares(
    grads: &[&Tensor],
    chunk: usize,
    in_place: bool,
) -> candle_core::Result<Vec<f64>> {
    let mut out = vec![0f64; grads.len()];
    let cpu = if in_place {
        reduce_cpu::<SumSq>(grads, PARALLEL_MIN)?
    } else {
        grads.iter().map(|_| None).collect()
    };
    // Per device: its chunks' partial sums, and which gradient each is of.
    let mut pending: Vec<(Device, Vec<usize>, Vec<Tensor>)> = Vec::new();
    for ((i, g), k) in grads.iter().enumerate().zip(cpu) {
        if let Some(k) = k {
            out[i] = k.0.value();
            continue;
        }
        let at = match pending
            .iter()
            .position(|(d, _, _)| d.same_device(g.device()))
        {
            Some(at) => at,
            None => {
                pending.push((g.device().clone(), Vec::new(), Vec::new()));
                pending.len() - 1
            }
        };
        let rd = if g.device().is_metal() {
            DType::F32
        } else {
            DType::F64
        };
        for x in chunks(g, chunk)? {
            let partial = x?.sqr()?.sum_all()?.to_dtype(rd)?.reshape(1)?;
            pending[at].1.push(i);
            pending[at].2.push(partial);
        }
    }
    for (_, owners, partials) in pending {
        let v = to_f64s(&Tensor::cat(&partials, 0)?)?;
        let mut sums = vec![Sum::default(); grads.len()];
        for (&i, x) in owners.iter().zip(v) {
            sums[i].add(x);
        }
        for &i in &owners {
            out[i] = sums[i].value();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::IndexOp;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
    }

    fn assert_same(a: Stats, b: Stats, rel: f64) {
        assert_eq!(
            (a.elements, a.non_finite),
            (b.elements, b.non_finite),
            "{a:?} vs {b:?}"
        );
        assert!(
            close(a.rms, b.rms, rel)
                && close(a.mean, b.mean, rel)
                && close(a.abs_max, b.abs_max, rel),
            "{a:?} vs {b:?}"
        );
    }

    fn values(n: usize) -> Vec<f32> {
        let mut x = 0x9e3779b97f4a7c15u64;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match i % 997 {
                    5 => f32::NAN,
                    17 => f32::INFINITY,
                    29 => f32::NEG_INFINITY,
                    _ => ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * 8.0,
                }
            })
            .collect()
    }

    #[test]
    fn strided_layouts_reduce_like_their_contiguous_copy() {
        let dev = Device::Cpu;
        let t = Tensor::from_vec(values(6 * 50 * 70), (6, 50, 70), &dev).unwrap();
        let views = [
            t.transpose(1, 2).unwrap(),
            t.transpose(0, 2).unwrap(),
            t.narrow(2, 3, 40).unwrap(),
            t.narrow(1, 0, 20).unwrap(),
            t.narrow(1, 1, 7).unwrap().narrow(2, 0, 69).unwrap(),
            t.i((.., 3, ..)).unwrap(),
            t.i((2, .., 5)).unwrap(),
            t.i((.., .., 1..2)).unwrap(),
            t.i((1..2, .., ..)).unwrap().transpose(0, 1).unwrap(),
            t.i((.., 0..1, ..))
                .unwrap()
                .broadcast_as((6, 3, 70))
                .unwrap(),
            Tensor::new(&[1f32, f32::NAN], &dev)
                .unwrap()
                .broadcast_as((5000, 2))
                .unwrap(),
        ];
        for v in views {
            assert!(
                !v.is_contiguous() || v.layout().start_offset() > 0,
                "{:?}",
                v.layout()
            );
            let copy = v.contiguous().unwrap().copy().unwrap();
            let (a, b) = (stats(&v).unwrap(), stats(&copy).unwrap());
            assert_same(a, b, 1e-13);
            // And the op path agrees, chunked, within f32 sums.
            assert_same(stats_by_ops(&v, 1000).unwrap(), a, 1e-5);
            let f64v = v.to_dtype(DType::F64).unwrap();
            assert_same(stats(&f64v).unwrap(), a, 1e-13);
        }
    }

    #[test]
    fn dispatched_kernels_give_the_portable_bits() {
        let v = values(BLOCK);
        let w: Vec<f64> = v.iter().map(|&x| f64::from(x) * 1e5).collect();
        let finite: Vec<f32> = v
            .iter()
            .map(|&x| if x.is_finite() { x } else { 1.0 })
            .collect();
        for xs in [&v[..], &finite[..], &finite[..1000], &v[3..]] {
            let (a, b) = (float_block(xs), float_block_any(xs));
            assert_eq!(
                (
                    a.non_finite,
                    a.sum.to_bits(),
                    a.sumsq.to_bits(),
                    a.abs_max.to_bits()
                ),
                (
                    b.non_finite,
                    b.sum.to_bits(),
                    b.sumsq.to_bits(),
                    b.abs_max.to_bits()
                )
            );
            assert_eq!(float_sumsq(xs).to_bits(), float_sumsq_any(xs).to_bits());
        }
        let (a, b) = (float_block(&w[..]), float_block_any(&w[..]));
        assert_eq!(
            (a.sum.to_bits(), a.sumsq.to_bits()),
            (b.sum.to_bits(), b.sumsq.to_bits())
        );
        assert_eq!(
            float_sumsq(&w[..]).to_bits(),
            float_sumsq_any(&w[..]).to_bits()
        );
    }

    #[test]
    fn threads_do_not_change_the_bits() {
        let dev = Device::Cpu;
        let big = Tensor::from_vec(values(5 * SEGMENT + 123), 5 * SEGMENT + 123, &dev).unwrap();
        let bf = big.to_dtype(DType::BF16).unwrap();
        let ints = big
            .affine(100.0, 0.0)
            .unwrap()
            .clamp(-1e6f32, 1e6f32)
            .unwrap()
            .to_dtype(DType::I64)
            .unwrap();
        let strided = big
            .narrow(0, 0, 3 * SEGMENT)
            .unwrap()
            .reshape((3, SEGMENT))
            .unwrap()
            .t()
            .unwrap();
        let small = Tensor::new(&[1f32, 2.0], &dev).unwrap();
        let ts = [&big, &bf, &ints, &strided, &small];
        let bits = |v: Vec<Option<Totals>>| -> Vec<(u64, u64, u64, u64, i128)> {
            v.into_iter()
                .flatten()
                .map(|t| {
                    (
                        t.non_finite,
                        t.sum.value().to_bits(),
                        t.sumsq.value().to_bits(),
                        t.abs_max.to_bits(),
                        t.int_sum,
                    )
                })
                .collect()
        };
        let one = bits(reduce_cpu::<Totals>(&ts, usize::MAX).unwrap());
        assert_eq!(one.len(), ts.len());
        assert_eq!(one, bits(reduce_cpu::<Totals>(&ts, 0).unwrap()));
        let sq = |min| {
            reduce_cpu::<SumSq>(&ts, min)
                .unwrap()
                .into_iter()
                .flatten()
                .map(|k| k.0.value().to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(sq(usize::MAX), sq(0));
        // Segments of the contiguous tensor against the strided read of it.
        let flat = reduce_cpu::<Totals>(&[&big.narrow(0, 0, 3 * SEGMENT).unwrap()], 0)
            .unwrap()
            .pop()
            .flatten()
            .unwrap()
            .finish(3 * SEGMENT as u64);
        let t = reduce_cpu::<Totals>(&[&strided], 0)
            .unwrap()
            .pop()
            .flatten()
            .unwrap()
            .finish(3 * SEGMENT as u64);
        assert_same(flat, t, 1e-13);
    }

    #[test]
    fn op_path_matches_the_cpu_kernels_per_dtype() {
        let dev = Device::Cpu;
        let t = Tensor::from_vec(values(10_001), 10_001, &dev).unwrap();
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let x = t.to_dtype(dt).unwrap();
            assert_same(stats_by_ops(&x, 777).unwrap(), stats(&x).unwrap(), 1e-5);
        }
        let ints = Tensor::from_vec(
            (0..10_001i64)
                .map(|i| (i * 7919) % 2001 - 1000)
                .collect::<Vec<_>>(),
            10_001,
            &dev,
        )
        .unwrap();
        for dt in [DType::I64, DType::U8, DType::U32] {
            let x = if dt == DType::I64 {
                ints.clone()
            } else {
                ints.abs().unwrap().to_dtype(dt).unwrap()
            };
            let (a, b) = (stats_by_ops(&x, 777).unwrap(), stats(&x).unwrap());
            assert_eq!(
                (a.mean, a.abs_max, a.non_finite),
                (b.mean, b.abs_max, 0),
                "{dt:?}"
            );
            assert!(close(a.rms, b.rms, 1e-14), "{dt:?}: {a:?} {b:?}");
        }
    }

    #[test]
    fn sums_of_squares_by_ops_and_in_place_agree() {
        let dev = Device::Cpu;
        let clean: Vec<f32> = values(5000)
            .into_iter()
            .map(|v| if v.is_finite() { v } else { 0.5 })
            .collect();
        let g = Tensor::from_vec(clean, (50, 100), &dev).unwrap();
        let bf = g.to_dtype(DType::BF16).unwrap();
        let t = g.t().unwrap();
        let nan = Tensor::new(&[1f32, f32::NAN], &dev).unwrap();
        let empty = Tensor::zeros((0, 3), DType::F32, &dev).unwrap();
        let ints = Tensor::new(&[3u32, 4], &dev).unwrap();
        let grads = [&g, &bf, &t, &nan, &empty, &ints];
        let v = sums_of_squares(&grads, OPS_CHUNK, true).unwrap();
        let want = |x: &Tensor| {
            x.to_dtype(DType::F64)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert!(
            close(v[0], want(&g), 1e-14) && close(v[2], want(&g), 1e-14),
            "{v:?}"
        );
        assert!(close(v[1], want(&bf), 1e-14), "{v:?}");
        assert!(v[3].is_nan() && v[4] == 0.0 && v[5] == 25.0, "{v:?}");
        let ops = sums_of_squares(&grads, 333, false).unwrap();
        for (a, b) in v.iter().zip(&ops) {
            assert!(
                close(*a, *b, 1e-5) || (a.is_nan() && b.is_nan()),
                "{v:?} vs {ops:?}"
            );
        }
    }
}
