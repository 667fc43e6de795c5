// Package events encodes the records of the candle-graph/trace/10 JSONL format and checks
// them before they are written.
//
// It has three jobs, each in its own files: parse and validate the run provenance a caller
// gives to ct_open (run.go, strictjson.go, contract.go, identity.go), check one record's
// fields (validate.go, dtype.go), and append one record as one JSON line (json.go,
// append.go, meta.go). Every rule here is one candle-graph 0.10.1 enforces when it reads a
// trace; a record is refused here rather than written into a trace that candle-graph would
// reject. Appenders never fail and never write invalid JSON, but they trust their input:
// the session validates first.
//
// Nothing in this package keeps state between calls; every function is safe for concurrent
// use.
package events
