// Package aggsummary reads candle-trace/aggregate/1 summaries (written by
// internal/aggregate): per-name distributions with the spans categorized
// (compute, data, transfer, other) and a compute-bound hypothesis tested,
// the comparison of two summaries, and both as text. It imports
// internal/aggregate, text and trace.
package aggsummary
