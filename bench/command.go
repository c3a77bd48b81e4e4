// Package bench is luffy-bench's command line: it runs LuffyMQ's
// benchmark sets, one package each (shared, throughput, reliability, soak,
// sites, connections), over the harness in bench/internal/harness, and
// writes JSON, markdown and plots.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/bench/connections"
	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bench/shared"
	"github.com/luffymq/luffymq/bench/throughput"
)

const usage = `Usage: luffy-bench COMMAND [flags]

Commands:
  shared      shared-subscription latency scenarios (set A of docs/scenarios.md)
  throughput  broker throughput, shared fan-in and plain fan-out (set B)
  connections N idle MQTT v5 connections, each subscribed to its own topic, against
              luffymq, vanilla Mochi and Mosquitto: RSS per connection, connect rate,
              delivery of one command to each, RSS after churn
  reliability lost / stalled / dropped scenarios against luffymq, vanilla Mochi and Mosquitto
  soak        2 000 connections in shared groups with churn, for --duration
  sites       scenario set C across sites on real RabbitMQ nodes joined by delayed links
  sites-matrix  set C's work-queue scenarios over time scales and topologies, repeated,
              every architecture side by side (matrix.md)
  summary     rewrite DIR/summary.md from DIR/results.json and DIR/throughput.json
  mochi-server  run vanilla Mochi MQTT (default options, allow-all auth) on --listen;
              the benchmarks start it as a broker process of its own

Run luffy-bench COMMAND --help for its flags.
`

// Main runs luffy-bench with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "shared":
		err = shared.RunCommand(ctx, args[1:], stdout, stderr)
	case "throughput":
		err = throughput.RunCommand(ctx, args[1:], stdout, stderr, shared.WriteSummary)
	case connections.Command:
		err = connections.RunCommand(ctx, args[1:], stdout, stderr, shared.WriteSummary)
	case harness.MochiServerCommand:
		err = harness.RunMochiServer(ctx, args[1:], stdout, stderr)
	case "summary":
		fs := flag.NewFlagSet("luffy-bench summary", flag.ContinueOnError)
		fs.SetOutput(stderr)
		out := fs.String("out", "", "results directory")
		if err = fs.Parse(args[1:]); err == nil {
			if *out == "" {
				err = errors.New("--out DIR is required")
			} else {
				err = shared.WriteSummary(*out)
			}
		}
	default:
		err = fmt.Errorf("unknown command %q (want shared, throughput, connections, summary or %s)", args[0], harness.MochiServerCommand)
	}
	return harness.ExitCode(err, stderr)
}
