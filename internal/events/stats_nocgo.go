//go:build !cgo

package events

// reduceF32 is StatsFromF32's pass over the data; without cgo, the Go reference.
func reduceF32(data []float32) (sum, sumSq, absMax float64, finite uint64) {
	return reduceF32Lanes(data)
}
