package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// MochiServerCommand is the luffy-bench subcommand that runs vanilla Mochi
// MQTT as a broker process of its own, the way the benchmarks start it.
const MochiServerCommand = "mochi-server"

// MochiBroker is vanilla Mochi MQTT v2: default options and no hook but
// allow-all authentication.
type MochiBroker struct {
	server *mqtt.Server
	addr   string
}

// StartVanillaMochi starts vanilla Mochi MQTT listening on addr (host:port;
// port 0 picks a free one), with extra hooks if any (the live oracle's).
// Its log goes to logger.
func StartVanillaMochi(addr string, logger *slog.Logger, extra ...mqtt.Hook) (*MochiBroker, error) {
	server := mqtt.New(&mqtt.Options{InlineClient: false, Logger: logger})
	for _, h := range append([]mqtt.Hook{new(auth.AllowHook)}, extra...) {
		if err := server.AddHook(h, nil); err != nil {
			return nil, fmt.Errorf("mochi: %w", err)
		}
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "bench", Address: addr})
	if err := server.AddListener(tcp); err != nil {
		return nil, fmt.Errorf("mochi: listen on %s: %w", addr, err)
	}
	if err := server.Serve(); err != nil {
		return nil, fmt.Errorf("mochi: serve: %w", err)
	}
	return &MochiBroker{server: server, addr: tcp.Address()}, nil
}

func (m *MochiBroker) Addr() string { return m.addr }
func (m *MochiBroker) Close() error { return m.server.Close() }

// RunMochiServer runs vanilla Mochi on --listen until ctx ends (SIGTERM
// or SIGINT). Mochi 2.7.9 can deadlock under QoS 1 load, and then its Close
// never returns: the command gives it 3 s and exits anyway.
func RunMochiServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("luffy-bench "+MochiServerCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:1883", "loopback host:port to listen on")
	metrics := fs.String("metrics", "", "loopback host:port to serve the Go runtime's gauges on, in Prometheus text at /metrics (the process's memory by kind; Mochi itself is unchanged); empty: none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := checkLoopback(*listen); err != nil {
		return fmt.Errorf("--listen %q: %w", *listen, err)
	}
	if err := checkLoopback(*metrics); *metrics != "" && err != nil {
		return fmt.Errorf("--metrics %q: %w", *metrics, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	br, err := StartVanillaMochi(*listen, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "vanilla Mochi MQTT %s listening on %s\n", mqtt.Version, br.Addr())
	if *metrics != "" {
		stopMetrics, err := ServeGoMetrics(*metrics)
		if err != nil {
			_ = br.Close()
			return err
		}
		defer stopMetrics()
	}
	<-ctx.Done()
	if !Within(3*time.Second, func() { _ = br.Close() }) {
		return errors.New("mochi did not close within 3 s (wedged); exiting anyway")
	}
	return nil
}

// checkLoopback fails unless addr is a host:port on a loopback address.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("the benchmarks use loopback addresses only")
	}
	return nil
}

func mochiVersion() string {
	return "Mochi MQTT " + mqtt.Version + " (separate process `luffy-bench " + MochiServerCommand + "`: default options, allow-all auth hook only)"
}

// TestMain runs a package's tests with m (its *testing.M), or vanilla
// Mochi when the test binary was started as `luffy-bench mochi-server`: a
// test that starts vanilla Mochi runs it as a process of its own, and
// os.Executable is the test binary there. Each bench package's TestMain
// calls it.
func TestMain(m interface{ Run() int }) {
	if len(os.Args) < 2 || os.Args[1] != MochiServerCommand {
		os.Exit(m.Run())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := RunMochiServer(ctx, os.Args[2:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "luffy-bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
