// Package report reads candle-graph/trace/10 traces (see
// ../shared/design/trace-format.md) in one streaming pass and judges them the
// way candle-graph 0.10.1 does: its parser's rules (serde's, down to which
// duplicate keys and nulls it refuses) and its analyze_health issue codes and
// severities, each issue with the line that shows it. On request it also
// gathers what `candle-trace report` prints.
//
// The same streaming decoder (stream.go) feeds the other commands: Compare
// sets two reports side by side under their comparison identities;
// ExportChrome writes Chrome Trace Event JSON as it reads (one record per
// span, the live storages and each tensor's producing op are all it keeps);
// Merge exports several ranks into one timeline, aligned by their wall
// clocks at open.
//
// Memory is bounded by the number of spans, distinct tensor ids (as 64-bit
// hashes), live storages, parameters and the report's summaries, never by
// the number of events: evidence that names a span is folded into that
// span's record (counts, earliest start, latest end), so "lies outside its
// span" is decided when the span closes, or at once when it closed earlier.
// Memory records are replayed in timestamp order as candle-graph does; they
// are applied as they stream and only re-read (or, for a reader that cannot
// seek, kept) when they turn out to be out of order.
//
// Deliberate differences from candle-graph:
//   - A trace without a terminal record, or whose last line is cut short, is
//     what a killed writer leaves. candle-graph refuses it; we read it to the
//     cut, judge it as a failed capture (open spans are warnings) and add the
//     warning trace_incomplete. It is never structurally valid "and
//     complete", so plain `validate` still fails it.
//   - Problems that make candle-graph refuse the file outright carry codes of
//     ours (invalid_json, duplicate_key, null_field, ...; Issue.Parse is set)
//     and stop the read: nothing after them can be trusted.
//   - graph_node_id_collision mirrors an error `candle-graph summary` raises
//     outside its health analysis; device_interval_outside_session is a
//     warning of ours.
//   - A line longer than Options.MaxLineBytes (64 MiB) is refused; the JSON
//     array form of a record, which serde happens to accept, is refused.
package trace
