// Command luffy-controller is LuffyMQ's control plane: every --period it
// reads each site's RabbitMQ management API and luffymq status API, places
// each global pub/sub exchange's synchronisation instance and publishes
// each site's federation configuration to its luffymq.config.<site> queue
// when it changes (see package bridge/controller).
//
// Exit status: 0 after a signal, --help or a successful --once round; 2 for
// a bad flag or sites file (one line on stderr); 1 when a --once round
// could not read or configure every site, or the HTTP server cannot start.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/bridge/controller"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := controller.ConfigFromArgs(args, stderr)
	if errors.Is(err, controller.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "luffy-controller:", err)
		return 2
	}
	cfg.Output = stdout
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	c, err := controller.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "luffy-controller:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(stderr, "luffy-controller:", err)
		return 1
	}
	return 0
}
