package events

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestManifestDigest(t *testing.T) {
	tests := []struct {
		name     string
		expected []ExpectedGradient
		want     string
	}{
		{
			name:     "trace-format.md test vector",
			expected: []ExpectedGradient{{"vb", "encoder.weight", "encoder"}, {"vb", "head.weight", "head"}},
			want:     "sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f",
		},
		{
			// An empty manifest digests the domain separator and the 0x00 only.
			name: "empty manifest",
			want: func() string {
				s := sha256.Sum256(append([]byte("candle-graph/gradient-manifest/1"), 0))
				return "sha256:" + hex.EncodeToString(s[:])
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, ManifestDigest(tt.expected))
		})
	}
}

func TestManifestDigestIsOrderedAndLengthPrefixed(t *testing.T) {
	a := ManifestDigest([]ExpectedGradient{{"vb", "a", "f"}, {"vb", "b", "f"}})
	b := ManifestDigest([]ExpectedGradient{{"vb", "b", "f"}, {"vb", "a", "f"}})
	assert.NotEqual(t, a, b, "order is part of the manifest")
	// Without length prefixes these two would hash the same bytes.
	c := ManifestDigest([]ExpectedGradient{{"ab", "c", "f"}})
	d := ManifestDigest([]ExpectedGradient{{"a", "bc", "f"}})
	assert.NotEqual(t, c, d)
}

func TestNewGradientContract(t *testing.T) {
	g, err := NewGradientContract(
		[]ExpectedGradient{{"vb", "encoder.weight", "encoder"}, {"vb", "head.weight", "head"}},
		[]GradientFamily{{"encoder", FamilyActive, 1}, {"head", FamilyDataConditional, 1}})
	require.NoError(t, err)
	assert.Equal(t, "sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f", g.ManifestSHA256)

	_, err = NewGradientContract(nil, []GradientFamily{{"x", FamilyActive, 1}})
	assert.ErrorContains(t, err, `"expected" must not be empty`)
}

func TestGradientContractValidateDigestMismatch(t *testing.T) {
	g := &GradientContract{
		ManifestSHA256: "sha256:bad",
		Expected:       []ExpectedGradient{{"vb", "w", "f"}},
		Families:       []GradientFamily{{"f", FamilyActive, 1}},
	}
	assert.ErrorContains(t, g.Validate(), `"manifest_sha256" is "sha256:bad"`)
	g.ManifestSHA256 = ManifestDigest(g.Expected)
	assert.NoError(t, g.Validate())
	g.Families[0].Expectation = FamilyExpectation(9)
	assert.ErrorContains(t, g.Validate(), "invalid expectation 9")
}

func TestCaptureContractValidateEnumRanges(t *testing.T) {
	tests := []struct {
		name string
		c    CaptureContract
		want string
	}{
		{"bad scope", CaptureContract{MeasurementScope: 7}, "invalid measurement_scope 7"},
		{"bad level", CaptureContract{DeviceTiming: 3}, "invalid device_timing level 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorContains(t, tt.c.Validate(), tt.want)
		})
	}
	var zero CaptureContract
	assert.NoError(t, zero.Validate(), "the default contract is valid")
}
