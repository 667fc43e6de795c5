// Package aggregate is the always-on mode of candle-trace: instead of
// writing every span, it folds span durations and scalar values into
// statistics whose size depends on the number of distinct names, never on
// the number of steps, and rewrites a small JSON summary
// (candle-trace/aggregate/1, docs/aggregate-format.md) atomically from
// time to time. A tracer that appends every measurement grows with the run
// (the entrenar reference reached 2.8 GB at 28K steps before it switched
// to counters); this one does not.
//
// Pieces:
//   - Aggregator (aggregator.go): interning of (span name, step) pairs and
//     scalar labels into dense keys, capped (DefaultMaxKeys) with an
//     overflow key; Observe / ObserveBatch / Buffer; run-time enable and
//     disable with the enabled periods recorded.
//   - The histogram (hist.go): a fixed log-linear layout of 976 buckets,
//     1/16 of an octave wide, from which p50/p95/p99 are read to within one
//     bucket (≤ 3.1% relative error).
//   - Summary (summary.go): the document, built by Snapshot.
//   - Read / Parse (read.go): the strict reader.
//   - Writer (writer.go): temp file, fsync, rename, at an interval and at
//     Finish, behind FS and Ticker seams.
//
// How a C fast path should feed it: the span hot path must not enter Go (a
// cgo call is ~70 ns). The C side interns a name once per thread (a small
// per-thread table from name bytes to Key, filled by one cgo call to Intern
// on a miss), checks an atomic enabled flag, and at span end appends a
// 16-byte Observation {key, duration} to a per-thread buffer. The buffers
// are handed to ObserveBatch — by the existing ring drainer, or by the
// producing thread when its buffer is full — so the cgo and lock costs are
// paid once per batch, and folding is an array index and a few adds.
package aggregate
