// Package health judges one trace the way candle-graph 0.10.1 does: the
// stream rules of its parser and its analyze_health issue codes and
// severities, each issue with the line that shows it. Check reads the
// records of package trace in one streaming pass and returns the Checker,
// which holds the verdict (Health) and the compact model the rules need:
// one Span per span, the memory Lifetimes with the logical-memory peak,
// the GradientState per parameter. The analyses above read that model and
// see every accepted record through Options.Observe; this package knows
// nothing of them.
//
// Memory is bounded by the number of spans, distinct tensor ids (as 64-bit
// hashes), live storages and parameters, never by the number of events:
// evidence that names a span is folded into that span's record (counts,
// earliest start, latest end), so "lies outside its span" is decided when
// the span closes, or at once when it closed earlier. Memory records are
// replayed in timestamp order as candle-graph does; they are applied as they
// stream and only re-read (or, for a reader that cannot seek, kept) when
// they turn out to be out of order.
//
// Deliberate differences from candle-graph:
//   - A trace without a terminal record, or whose last line is cut short, is
//     what a killed writer leaves. candle-graph refuses it; we read it to the
//     cut, judge it as a failed capture (open spans are warnings) and add the
//     warning trace_incomplete. It is never structurally valid "and
//     complete", so plain `validate` still fails it.
//   - Parse problems stop the read: nothing after them can be trusted.
//   - graph_node_id_collision mirrors an error `candle-graph summary` raises
//     outside its health analysis; device_interval_outside_session is a
//     warning of ours.
//
// It imports package trace only.
package health
