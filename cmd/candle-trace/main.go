// Command candle-trace reads candle-graph/trace/10 traces: validate them
// against candle-graph's rules and report where a captured step spent its
// time. See internal/report/cli for the commands.
package main

import (
	"os"

	"github.com/candle-trace/candle-trace/internal/report/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
