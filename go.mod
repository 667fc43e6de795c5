module github.com/candle-trace/candle-trace

go 1.26

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/goccy/go-json v0.12.0
	github.com/stretchr/testify v1.12.1
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
