// Command worker joins a shared subscription, emulates processing each
// message and reports its load to the broker.
//
//	go run ./examples/worker --process-time 25ms
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/luffymq/luffymq/clientsdk"
	"github.com/luffymq/luffymq/examples/internal/worker"
)

func main() {
	var cfg worker.Config
	var qos uint
	var filters, processTime, reportVia string
	flag.StringVar(&cfg.Broker, "broker", "mqtt://localhost:1883", "broker URL (mqtt://, mqtts:// or ws://)")
	flag.StringVar(&cfg.ClientID, "client-id", "", "MQTT client ID (default: a random one)")
	flag.StringVar(&cfg.Group, "group", "g", "shared-subscription group")
	flag.StringVar(&filters, "filter", "sensors/#", "topic filter(s) to share, comma-separated")
	flag.UintVar(&qos, "qos", 0, "subscription QoS: 0, 1 or 2 (1 and 2 are acknowledged after processing)")
	flag.StringVar(&processTime, "process-time", "25ms", "emulated processing time: 25ms, exp:25ms or uniform:10ms-40ms")
	flag.IntVar(&cfg.Workers, "workers", 1, "messages processed at once")
	flag.IntVar(&cfg.QueueCapacity, "queue", 0, "pending queue capacity (default 1000)")
	flag.DurationVar(&cfg.ReportInterval, "report-interval", 0, "load-report interval (default: the broker's, else 1s)")
	flag.StringVar(&reportVia, "report-via", "pingreq", "load-report channel: pingreq, publish or off")
	verbose := flag.Bool("v", false, "log every load report")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: worker [flags]\n\nJoins $share/<group>/<filter>, emulates processing without drift and reports its load.\nPrints once a second: messages received, pending, mean processing time.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "worker: "+format+"\n", args...)
		os.Exit(2)
	}
	if qos > 2 {
		fail("--qos %d: want 0, 1 or 2", qos)
	}
	cfg.QoS = byte(qos)
	var err error
	if cfg.ProcessTime, err = clientsdk.ParseServiceTime(processTime); err != nil {
		fail("--process-time: %v", err)
	}
	if cfg.ReportVia, err = clientsdk.ParseReportChannel(reportVia); err != nil {
		fail("--report-via: %v", err)
	}
	for _, f := range strings.Split(filters, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Filters = append(cfg.Filters, f)
		}
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Out = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := worker.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
