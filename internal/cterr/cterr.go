// Package cterr is the error every candle-trace call returns: a ct_status of
// include/candle_trace.h and the message ct_last_error() shows. It has a
// package of its own, below the session and the device collectors alike,
// so that a collector can report errors without importing the session that
// owns it.
package cterr

import "fmt"

// Status mirrors ct_status of include/candle_trace.h; the values are fixed.
type Status int

const (
	OK              Status = 0
	InvalidArgument Status = 1
	InvalidHandle   Status = 2
	SpanMismatch    Status = 3
	State           Status = 4
	IO              Status = 5
	Poisoned        Status = 6
	Unavailable     Status = 7
	Internal        Status = 8
)

var statusNames = [...]string{"CT_OK", "CT_ERR_INVALID_ARGUMENT", "CT_ERR_INVALID_HANDLE",
	"CT_ERR_SPAN_MISMATCH", "CT_ERR_STATE", "CT_ERR_IO", "CT_ERR_POISONED",
	"CT_ERR_UNAVAILABLE", "CT_ERR_INTERNAL"}

func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("ct_status(%d)", int(s))
}

// Error is what every failing call returns: the status the C ABI reports and
// the message ct_last_error() shows.
type Error struct {
	Code Status
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Errorf is an Error of code with a formatted message.
func Errorf(code Status, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf extracts the status of err (Internal for foreign errors, OK for nil).
func CodeOf(err error) Status {
	if err == nil {
		return OK
	}
	if e, ok := err.(*Error); ok {
		return e.Code
	}
	return Internal
}
