//go:build cgo

package events

// #cgo CFLAGS: -O2
// #include "reduce_f32.h"
import "C"

import (
	"math"
	"unsafe"
)

// reduceF32 is StatsFromF32's pass over the data: reduce_f32.c, at memory bandwidth
// (AVX2 where the CPU has it; the same result as reduceF32Lanes on every path).
func reduceF32(data []float32) (sum, sumSq, absMax float64, finite uint64) {
	return reduceF32C(data, false)
}

// reduceF32C runs reduce_f32.c; portable takes its portable loop (for the tests).
func reduceF32C(data []float32, portable bool) (sum, sumSq, absMax float64, finite uint64) {
	var r C.ct_f32_reduction
	var p *C.float
	if len(data) > 0 {
		p = (*C.float)(unsafe.Pointer(&data[0]))
	}
	port := C.int(0)
	if portable {
		port = 1
	}
	C.ct__reduce_f32(p, C.size_t(len(data)), port, &r)
	return float64(r.sum), float64(r.sum_sq), float64(math.Float32frombits(uint32(r.abs_max_bits))),
		uint64(len(data)) - uint64(r.non_finite)
}
