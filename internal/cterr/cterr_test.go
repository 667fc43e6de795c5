package cterr

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStatusNamesMatchTheHeader(t *testing.T) {
	tests := []struct {
		s    Status
		want string
	}{
		{OK, "CT_OK"}, {InvalidArgument, "CT_ERR_INVALID_ARGUMENT"}, {InvalidHandle, "CT_ERR_INVALID_HANDLE"},
		{SpanMismatch, "CT_ERR_SPAN_MISMATCH"}, {State, "CT_ERR_STATE"}, {IO, "CT_ERR_IO"},
		{Poisoned, "CT_ERR_POISONED"}, {Unavailable, "CT_ERR_UNAVAILABLE"}, {Internal, "CT_ERR_INTERNAL"},
		{Status(9), "ct_status(9)"}, {Status(-1), "ct_status(-1)"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.s.String())
	}
}

func TestCodeOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Status
	}{
		{"nil", nil, OK},
		{"ours", Errorf(State, "ct_finish: %d spans still open", 2), State},
		{"foreign", errors.New("boom"), Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, CodeOf(tt.err)) })
	}
	assert.Equal(t, "ct_finish: 2 spans still open", Errorf(State, "ct_finish: %d spans still open", 2).Error())
}
