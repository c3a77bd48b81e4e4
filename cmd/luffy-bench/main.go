// Command luffy-bench runs LuffyMQ's benchmarks (docs/scenarios.md) against
// Mosquitto, vanilla Mochi MQTT and a perfect-information greedy oracle,
// and writes JSON, markdown and PNG plots.
//
//	luffy-bench shared --scenario thesis-2 --repeat 3 --subscriber sdk,thesis-reporter --out bench/results
//	luffy-bench throughput --repeat 3 --out bench/results
//	luffy-bench reliability --out bench/results
//	luffy-bench connections --connections 10000 --repeat 3 --out bench/results
//	luffy-bench soak --duration 30m --out bench/results/soak
//	luffy-bench sites --out bench/results/sites
//	luffy-bench sites-matrix --repeat 3 --out bench/results/sites-matrix
//	luffy-bench mochi-server --listen 127.0.0.1:1883
//
// Every broker runs as a process of its own; vanilla Mochi runs as this
// command's mochi-server subcommand. `reliability` runs the lost / stalled /
// dropped scenarios (crash-qos1, stuck-subscriber, qos0-burst) against
// luffymq, vanilla Mochi and Mosquitto in the same run. `soak` runs 2 000
// connections in shared groups with churn for 30 min against luffymq and
// records lost, duplicated, latency, RSS and goroutines over time.
// `connections` opens N idle subscribed connections against luffymq,
// vanilla Mochi and Mosquitto and reports RSS per connection, the connect
// rate and the delivery of one command to each.
// `sites` runs scenario set C across sites on real RabbitMQ nodes joined
// by delayed links: luffymq against RabbitMQ federation full mesh, star,
// random placement and a central cloud broker. `sites-matrix` runs its
// work-queue scenarios over time scales and topologies, repeated.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/bench"
	"github.com/luffymq/luffymq/bench/reliability"
	"github.com/luffymq/luffymq/bench/sites"
	"github.com/luffymq/luffymq/bench/soak"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == soak.Command {
		os.Exit(soak.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == reliability.Command {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := reliability.Main(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == sites.MatrixCommand {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := sites.MatrixMain(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == sites.Command {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := sites.Main(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
