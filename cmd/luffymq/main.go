// Command luffymq runs a LuffyMQ broker: MQTT v5 whose shared subscriptions
// give each message to the member that will start it soonest.
//
// Exit status: 0 after a signal, --help or --print-config; 2 for a bad
// setting (one line on stderr); 1 when the broker cannot start or stop.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/broker"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr, nil))
}

// run runs the broker configured by args and environ until a signal
// arrives (or stop is closed) and returns the exit status.
func run(args, environ []string, stdout, stderr io.Writer, stop <-chan struct{}) int {
	cfg, err := broker.LoadConfig(args, environ, stdout, stderr)
	if errors.Is(err, broker.ErrHelp) || errors.Is(err, broker.ErrConfigPrinted) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "luffymq:", err)
		return 2
	}
	defer broker.ApplyRuntimeSettings(cfg)()
	b, err := broker.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "luffymq:", err)
		return 2
	}
	if err := b.Start(); err != nil {
		fmt.Fprintln(stderr, "luffymq:", err)
		_ = b.Close()
		return 1
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	select {
	case <-signals:
	case <-stop:
	}
	if err := b.Close(); err != nil {
		fmt.Fprintln(stderr, "luffymq: stopping:", err)
		return 1
	}
	return 0
}
