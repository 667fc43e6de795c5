package session

import "github.com/candle-trace/candle-trace/internal/cterr"

// The session's errors are package cterr's (the device collectors return
// them too, without importing the session); these names keep the session's
// callers as they were.
type (
	// Status mirrors ct_status of include/candle_trace.h.
	Status = cterr.Status
	// Error is what every failing call returns.
	Error = cterr.Error
)

const (
	OK              = cterr.OK
	InvalidArgument = cterr.InvalidArgument
	InvalidHandle   = cterr.InvalidHandle
	SpanMismatch    = cterr.SpanMismatch
	State           = cterr.State
	IO              = cterr.IO
	Poisoned        = cterr.Poisoned
	Unavailable     = cterr.Unavailable
	Internal        = cterr.Internal
)

var errorf = cterr.Errorf

// CodeOf extracts the status of err (Internal for foreign errors, OK for nil).
func CodeOf(err error) Status { return cterr.CodeOf(err) }
