// Package trace is the bottom layer of the trace reader: it scans a
// candle-graph/trace/10 JSONL file line by line (lines.go, jsonscan.go) and
// decodes each line into one reused record of the trace model (events.go,
// meta.go) with the rules of candle-graph's serde types, down to which
// duplicate keys, nulls and number spellings it refuses. Stream yields those
// records with the reader's rules for the end of a file: it stops at the
// first line candle-graph could not parse and treats a cut last line before
// any terminal record as the end of a partial trace.
//
// It judges nothing beyond one line: the rules across lines are package
// health's. Record kinds and enum spellings come from internal/traceformat,
// shared with the writer. The decoded records alias the line (byte slices
// valid until the next one): whoever keeps something copies it.
//
// Problems that make candle-graph refuse the file outright carry codes of
// ours (invalid_json, duplicate_key, null_field, ...; Issue.Parse is set). A
// line longer than DefaultMaxLineBytes (64 MiB) is refused; the JSON array
// form of a record, which serde happens to accept, is refused.
//
// Layers of internal/report, each importing only those below it:
//
//	cli                                    the candle-trace command line
//	htmlview                               the HTML page (over compare, aggsummary)
//	text, compare, aggsummary, chrome      outputs
//	analysis                               what `report` computes
//	health                                 candle-graph's rules
//	trace                                  scan, decode, the trace model
package trace
