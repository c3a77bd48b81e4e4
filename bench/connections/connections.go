// Package connections runs `luffy-bench connections`: N idle subscribed
// MQTT v5 connections against luffymq, vanilla Mochi and Mosquitto, for
// RSS per connection, the connect rate and the delivery of one command to
// each.
package connections

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Command is the luffy-bench subcommand that measures what an
// idle, subscribed connection costs each broker (issue 21).
const Command = "connections"

// ConnectionsSystems are the systems `connections` compares.
var ConnectionsSystems = []string{"luffymq-adaptive", harness.SystemMochi, harness.SystemMosquitto}

// fdReserve is how many file descriptors beyond the connections the bench
// (and each broker) needs: listeners, logs, the publisher, pipes.
const fdReserve = 64

// ConnectionsConfig configures a `connections` invocation.
type ConnectionsConfig struct {
	// Connections is how many idle MQTT v5 devices connect, each subscribed
	// to its own dev/<id>/cmd.
	Connections int `json:"connections"`
	// Repeat is the runs per system; the summary reports medians.
	Repeat  int      `json:"repeat"`
	Systems []string `json:"systems"`
	// Dialers is how many connections are being set up at once.
	Dialers int `json:"dialers"`
	// Churn is how many short sessions (connect, subscribe, disconnect),
	// one after another, a fresh broker of each system gets in each
	// repeat (0: none).
	Churn int `json:"churn_sessions"`
	// SettleWindow: the broker's RSS is read once it moved less than
	// 0.5 % over this long (an idle broker), waiting at most SettleMax.
	SettleWindow time.Duration `json:"settle_window_ns"`
	SettleMax    time.Duration `json:"settle_max_ns"`
	// DeliveryTimeout bounds the wait for the commands.
	DeliveryTimeout time.Duration `json:"delivery_timeout_ns"`
	// Idle, when positive, keeps the devices connected this long after
	// the commands, reading the RSS meanwhile: what an idle fleet costs at
	// most while the broker's own periodic work and its garbage collector
	// run (0: not measured).
	Idle time.Duration `json:"idle_ns,omitempty"`
	// LuffyMQArgs are extra luffymq flags (an A/B of its options).
	LuffyMQArgs []string `json:"luffymq_args,omitempty"`
	// LuffyMQ is the luffymq binary ("" builds ./cmd/luffymq).
	LuffyMQ string `json:"-"`
	// Out receives connections.json, connections.md and the plot.
	Out      string    `json:"-"`
	Progress io.Writer `json:"-"`
	// WriteSummary, when set, rewrites the summary in Out once the
	// results are written (luffy-bench's summary.md).
	WriteSummary func(dir string) error `json:"-"`
}

// DefaultConnectionsConfig returns issue 21's sizes.
func DefaultConnectionsConfig() ConnectionsConfig {
	return ConnectionsConfig{Connections: 10000, Repeat: 3, Systems: slices.Clone(ConnectionsSystems), Dialers: 32,
		Churn: 3000, SettleWindow: 3 * time.Second, SettleMax: 20 * time.Second, DeliveryTimeout: 60 * time.Second}
}

func (c ConnectionsConfig) validate() error {
	if c.Out == "" {
		return errors.New("--out DIR is required")
	}
	if c.Connections < 1 || c.Connections > 1_000_000 {
		return fmt.Errorf("--connections %d: want 1 to 1000000", c.Connections)
	}
	if c.Repeat < 1 || c.Repeat > 20 {
		return fmt.Errorf("--repeat %d: want 1 to 20", c.Repeat)
	}
	if c.Dialers < 1 || c.Dialers > 1024 {
		return fmt.Errorf("--dialers %d: want 1 to 1024", c.Dialers)
	}
	if c.Churn < 0 || c.Churn > 1_000_000 {
		return fmt.Errorf("--churn %d: want 0 to 1000000", c.Churn)
	}
	if c.SettleWindow < time.Second || c.SettleMax < c.SettleWindow || c.DeliveryTimeout <= 0 || c.Idle < 0 || c.Idle > time.Hour {
		return errors.New("--settle-window must be at least 1s, --settle-max at least the window, --delivery-timeout positive and --idle from 0 to 1h")
	}
	if len(c.Systems) == 0 {
		return errors.New("no system to run")
	}
	for _, s := range c.Systems {
		if !slices.Contains(ConnectionsSystems, s) {
			return fmt.Errorf("unknown system %q; choose from %s", s, strings.Join(ConnectionsSystems, ", "))
		}
	}
	return nil
}

// ConnectionsRun is one system's idle-connection run.
type ConnectionsRun struct {
	System      string `json:"system"`
	Repeat      int    `json:"repeat"`
	Connections int    `json:"connections"`
	// Connected counts devices that got their CONNACK, Subscribed their
	// SUBACK.
	Connected  int `json:"connected"`
	Subscribed int `json:"subscribed"`
	// ConnectPerS is Connected over the time from the first dial to the
	// last CONNACK (Dialers at a time).
	ConnectPerS float64 `json:"connect_per_s"`
	SubscribeS  float64 `json:"subscribe_s"`
	// RSS of the broker process (VmRSS), settled, before the devices
	// connected and after they subscribed.
	RSSBeforeBytes int64 `json:"rss_before_bytes"`
	RSSAfterBytes  int64 `json:"rss_after_bytes"`
	// RSSPerConnBytes is the growth over Subscribed.
	RSSPerConnBytes float64 `json:"rss_per_connection_bytes"`
	// RSSCommandedBytes is the settled RSS once every device got its
	// command (or the delivery timeout passed); RSSPerConnCommandedBytes
	// its growth over Subscribed since RSSBeforeBytes.
	RSSCommandedBytes        int64   `json:"rss_commanded_bytes"`
	RSSPerConnCommandedBytes float64 `json:"rss_per_connection_commanded_bytes"`
	// The Go runtime's gauges at the same three points, for the brokers
	// written in Go (nil for Mosquitto).
	GoBefore     *harness.GoMemory `json:"go_before,omitempty"`
	GoSubscribed *harness.GoMemory `json:"go_subscribed,omitempty"`
	GoCommanded  *harness.GoMemory `json:"go_commanded,omitempty"`
	// With Config.Idle: the highest RSS while the devices idled that
	// long after their commands (read every rssPoll), its growth per
	// device, and the Go gauges at the end.
	RSSIdledBytes        int64             `json:"rss_idled_bytes,omitempty"`
	RSSPerConnIdledBytes float64           `json:"rss_per_connection_idled_bytes,omitempty"`
	GoIdled              *harness.GoMemory `json:"go_idled,omitempty"`
	// Delivered counts devices that got the command published to their
	// topic (QoS 1) within the delivery timeout.
	Delivered int     `json:"delivered"`
	DeliverS  float64 `json:"deliver_s"`
	Error     string  `json:"error,omitempty"`
}

// ChurnRun is one system's churn run: short sessions one after another on
// a fresh broker.
type ChurnRun struct {
	System         string  `json:"system"`
	Repeat         int     `json:"repeat"`
	Sessions       int     `json:"sessions"`
	Completed      int     `json:"completed"`
	RSSBeforeBytes int64   `json:"rss_before_bytes"`
	RSSAfterBytes  int64   `json:"rss_after_bytes"`
	Seconds        float64 `json:"seconds"`
	Error          string  `json:"error,omitempty"`
}

// FDLimit is the bench's open-file limit.
type FDLimit struct {
	SoftBefore uint64 `json:"soft_before"`
	Soft       uint64 `json:"soft"`
	Hard       uint64 `json:"hard"`
}

// ConnectionsResults is connections.json.
type ConnectionsResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    ConnectionsConfig   `json:"config"`
	FDLimit   FDLimit             `json:"fd_limit"`
	Notes     []string            `json:"notes"`
	Runs      []ConnectionsRun    `json:"runs"`
	Churn     []ChurnRun          `json:"churn,omitempty"`
}

// raiseFDLimit raises the soft open-file limit to the hard one (brokers
// started afterwards inherit it) and fails, naming the limit, when the
// hard limit is below need.
func raiseFDLimit(need uint64) (FDLimit, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return FDLimit{}, fmt.Errorf("reading the open-file limit: %w", err)
	}
	l := FDLimit{SoftBefore: rl.Cur, Hard: rl.Max}
	if _, _, _, err := harness.EnsureFDLimit(max(need, rl.Max)); err != nil {
		return l, fmt.Errorf("%w (soft limit was %d)", err, rl.Cur)
	}
	l.Soft = rl.Max
	return l, nil
}

// connectionsBroker is a broker process of one run.
type connectionsBroker struct {
	*harness.Process
	// metricsURL serves the Go runtime's gauges ("" for Mosquitto).
	metricsURL string
}

// goMemory reads the broker's Go runtime gauges, or returns nil for a
// broker that has none.
func (b connectionsBroker) goMemory(ctx context.Context) (*harness.GoMemory, error) {
	if b.metricsURL == "" {
		return nil, nil
	}
	m, err := harness.ReadGoMemory(ctx, b.metricsURL)
	if err != nil {
		return nil, err
	}
	return &m, nil
}

func (b connectionsBroker) rss() (int64, error) {
	mb, _, err := harness.ProcStatus(strconv.Itoa(b.Cmd.Process.Pid))
	return int64(mb * (1 << 20)), err
}

// rssPoll is how often settledRSS reads the broker's RSS.
const rssPoll = 500 * time.Millisecond

// settledRSS polls the broker's RSS until two readings window apart
// differ by less than 0.5 %, or limit passes, and returns the last
// reading.
func (b connectionsBroker) settledRSS(ctx context.Context, window, limit time.Duration) (int64, error) {
	deadline := time.Now().Add(limit)
	back := int(window / rssPoll)
	var hist []int64
	for {
		v, err := b.rss()
		if err != nil {
			return 0, fmt.Errorf("reading the broker's RSS: %w", err)
		}
		hist = append(hist, v)
		if n := len(hist); n > back {
			prev := hist[n-1-back]
			if d := v - prev; max(d, -d)*200 < prev {
				return v, nil
			}
		}
		if time.Now().After(deadline) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(rssPoll):
		}
	}
}

// startConnectionsBroker starts system's broker on a free loopback port.
func startConnectionsBroker(ctx context.Context, starter harness.BrokerStarter, cfg ConnectionsConfig, system, logName string) (connectionsBroker, error) {
	// The Go brokers serve their runtime's gauges on a second port: the
	// stacks of the goroutines per connection are the part of the RSS
	// that no broker option changes.
	metricsAddr, err := harness.FreeAddr()
	if err != nil {
		return connectionsBroker{}, err
	}
	logPath := filepath.Join(starter.LogDir, logName+".broker.log")
	var (
		br         harness.RunningBroker
		metricsURL = "http://" + metricsAddr + "/metrics"
	)
	switch {
	case strings.HasPrefix(system, "luffymq-"):
		br, err = harness.StartProcess(ctx, starter.LuffyMQ, logPath, func(addr string) ([]string, error) {
			args := append([]string{"--listen", addr, "--http", metricsAddr, "--log-level", "warn"}, harness.LuffyMQSelectionArgs(system)...)
			return append(args, cfg.LuffyMQArgs...), nil
		})
	case system == harness.SystemMochi:
		br, err = harness.StartProcess(ctx, starter.Self, logPath, func(addr string) ([]string, error) {
			return []string{harness.MochiServerCommand, "--listen", addr, "--metrics", metricsAddr}, nil
		})
	default:
		metricsURL = ""
		br, err = starter.Start(ctx, system, time.Second, logName)
	}
	if err != nil {
		return connectionsBroker{}, err
	}
	p, ok := br.(*harness.Process)
	if !ok {
		_ = br.Close()
		return connectionsBroker{}, fmt.Errorf("%s does not run as a process of its own", system)
	}
	return connectionsBroker{Process: p, metricsURL: metricsURL}, nil
}

// onFreshBroker starts system's broker, runs fn against it and stops it;
// it returns the error of either as text ("" when none).
func onFreshBroker(ctx context.Context, starter harness.BrokerStarter, cfg ConnectionsConfig, system, logName string, fn func(connectionsBroker) error) string {
	br, err := startConnectionsBroker(ctx, starter, cfg, system, logName)
	if err == nil {
		err = fn(br)
		_ = br.Close()
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// device is one idle MQTT v5 client.
type device struct {
	conn net.Conn
}

// deviceTopic is device id's command topic.
func deviceTopic(id int) string { return "dev/" + strconv.Itoa(id) + "/cmd" }

// DialDevice connects device id as an MQTT v5 client (client ID d<id>)
// with clean start and a 10 min keep-alive (no PINGREQ during a run) and
// returns once its CONNACK came. The in-process connect benchmark
// (hooks/connect_bench_test.go) dials the same way.
func DialDevice(addr string, id int) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	cp := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "d" + strconv.Itoa(id), CleanStart: true,
		KeepAlive: 600, Properties: &packets.Properties{}}
	if _, err := cp.WriteTo(conn); err != nil {
		CloseNow(conn)
		return nil, err
	}
	pk, err := packets.ReadPacket(conn)
	if err != nil {
		CloseNow(conn)
		return nil, fmt.Errorf("reading CONNACK: %w", err)
	}
	if ca, ok := pk.Content.(*packets.Connack); !ok || ca.ReasonCode != 0 {
		CloseNow(conn)
		return nil, fmt.Errorf("CONNECT refused: %s", pk)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// SubscribeDevice subscribes conn, device id's connection, to its command
// topic (dev/<id>/cmd) at QoS 1 and returns once the SUBACK came.
func SubscribeDevice(conn net.Conn, id int) error {
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	defer conn.SetDeadline(time.Time{})
	sp := &packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: deviceTopic(id), QoS: 1}}, Properties: &packets.Properties{}}
	if _, err := sp.WriteTo(conn); err != nil {
		return err
	}
	pk, err := packets.ReadPacket(conn)
	if err != nil {
		return fmt.Errorf("reading SUBACK: %w", err)
	}
	if sa, ok := pk.Content.(*packets.Suback); !ok || len(sa.Reasons) == 0 || sa.Reasons[0] >= 0x80 {
		return fmt.Errorf("SUBSCRIBE refused: %s", pk)
	}
	return nil
}

// CloseNow closes conn with a reset, so the bench leaves no TIME_WAIT
// sockets behind on the ephemeral ports.
func CloseNow(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// ForEach runs fn(i) for i in [0, n) on workers goroutines and returns
// how many succeeded and the first error.
func ForEach(n, workers int, fn func(i int) error) (ok int, first error) {
	var (
		next, done atomic.Int64
		mu         sync.Mutex
		wg         sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(done.Load()), first
}

// runConnections runs the idle-connection measurement once against br.
func runConnections(ctx context.Context, cfg ConnectionsConfig, br connectionsBroker, run *ConnectionsRun) error {
	n := cfg.Connections
	pub, pubConn, _, err := harness.DialPaho(ctx, br.Addr(), "bench-publisher", 600, paho.ClientConfig{})
	if err != nil {
		return err
	}
	defer CloseNow(pubConn)
	if run.RSSBeforeBytes, err = br.settledRSS(ctx, cfg.SettleWindow, cfg.SettleMax); err != nil {
		return err
	}
	if run.GoBefore, err = br.goMemory(ctx); err != nil {
		return err
	}

	devs := make([]device, n)
	defer func() {
		for _, d := range devs {
			if d.conn != nil {
				CloseNow(d.conn)
			}
		}
	}()
	start := time.Now()
	var connected int
	connected, err = ForEach(n, cfg.Dialers, func(i int) error {
		c, err := DialDevice(br.Addr(), i)
		if err == nil {
			devs[i].conn = c
		}
		return err
	})
	run.Connected = connected
	run.ConnectPerS = float64(connected) / time.Since(start).Seconds()
	if err != nil {
		return fmt.Errorf("%d of %d connected: %w", connected, n, err)
	}
	start = time.Now()
	run.Subscribed, err = ForEach(n, cfg.Dialers, func(i int) error { return SubscribeDevice(devs[i].conn, i) })
	run.SubscribeS = time.Since(start).Seconds()
	if err != nil {
		return fmt.Errorf("%d of %d subscribed: %w", run.Subscribed, n, err)
	}
	if run.RSSAfterBytes, err = br.settledRSS(ctx, cfg.SettleWindow, cfg.SettleMax); err != nil {
		return err
	}
	run.RSSPerConnBytes = float64(run.RSSAfterBytes-run.RSSBeforeBytes) / float64(run.Subscribed)
	if run.GoSubscribed, err = br.goMemory(ctx); err != nil {
		return err
	}

	// One command to each device, QoS 1; every device reads one PUBLISH.
	var delivered atomic.Int64
	var readers sync.WaitGroup
	deadline := time.Now().Add(cfg.DeliveryTimeout)
	for i := range devs {
		readers.Add(1)
		go func(id int, conn net.Conn) {
			defer readers.Done()
			_ = conn.SetReadDeadline(deadline)
			for {
				pk, err := packets.ReadPacket(conn)
				if err != nil {
					return
				}
				p, ok := pk.Content.(*packets.Publish)
				if !ok {
					continue
				}
				if p.QoS > 0 {
					_, _ = (&packets.Puback{PacketID: p.PacketID, Properties: &packets.Properties{}}).WriteTo(conn)
				}
				if p.Topic == deviceTopic(id) && string(p.Payload) == "cmd "+strconv.Itoa(id) {
					delivered.Add(1)
					return
				}
			}
		}(i, devs[i].conn)
	}
	start = time.Now()
	_, pubErr := ForEach(n, 64, func(i int) error {
		pctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		_, err := pub.Publish(pctx, &paho.Publish{Topic: deviceTopic(i), QoS: 1, Payload: []byte("cmd " + strconv.Itoa(i))})
		return err
	})
	readers.Wait()
	run.DeliverS = time.Since(start).Seconds()
	run.Delivered = int(delivered.Load())
	if pubErr != nil {
		return fmt.Errorf("publishing the commands: %w", pubErr)
	}
	// A device that got a command costs what an idle one does plus what
	// the delivery left behind (a write loop's grown stack, buffers kept,
	// garbage not yet collected): the measure issue 21 was filed with.
	if run.RSSCommandedBytes, err = br.settledRSS(ctx, cfg.SettleWindow, cfg.SettleMax); err != nil {
		return err
	}
	run.RSSPerConnCommandedBytes = float64(run.RSSCommandedBytes-run.RSSBeforeBytes) / float64(run.Subscribed)
	if run.GoCommanded, err = br.goMemory(ctx); err != nil || cfg.Idle <= 0 {
		return err
	}
	// Whether a garbage collection ran just before a single reading
	// moves it by a third: the peak over the idle time is what the
	// machine must have.
	end := time.Now().Add(cfg.Idle)
	tick := time.NewTicker(rssPoll)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		v, err := br.rss()
		if err != nil {
			return err
		}
		run.RSSIdledBytes = max(run.RSSIdledBytes, v)
	}
	run.RSSPerConnIdledBytes = float64(run.RSSIdledBytes-run.RSSBeforeBytes) / float64(run.Subscribed)
	run.GoIdled, err = br.goMemory(ctx)
	return err
}

// runChurn runs cfg.Churn short sessions one after another against br.
func runChurn(ctx context.Context, cfg ConnectionsConfig, br connectionsBroker, run *ChurnRun) error {
	var err error
	if run.RSSBeforeBytes, err = br.settledRSS(ctx, cfg.SettleWindow, cfg.SettleMax); err != nil {
		return err
	}
	start := time.Now()
	for i := range cfg.Churn {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		conn, err := DialDevice(br.Addr(), i)
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		err = SubscribeDevice(conn, i)
		if err == nil {
			_, err = (&packets.Disconnect{Properties: &packets.Properties{}}).WriteTo(conn)
		}
		_ = conn.Close()
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		run.Completed++
	}
	run.Seconds = time.Since(start).Seconds()
	run.RSSAfterBytes, err = br.settledRSS(ctx, cfg.SettleWindow, cfg.SettleMax)
	return err
}

// RunConnections measures every system in cfg and writes
// connections.json, connections.md and connections-rss.png into cfg.Out.
func RunConnections(ctx context.Context, cfg ConnectionsConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	fdl, err := raiseFDLimit(uint64(cfg.Connections + fdReserve))
	if err != nil {
		return fmt.Errorf("--connections %d: %w", cfg.Connections, err)
	}
	starter, cleanup, err := harness.NewBrokerStarter(ctx, cfg.Out, cfg.Systems, cfg.LuffyMQ, cfg.Progress)
	if err != nil {
		return err
	}
	defer cleanup()
	res := &ConnectionsResults{Machine: harness.DescribeMachine(starter.Mosquitto), Config: cfg, FDLimit: fdl, Notes: connectionsNotes(cfg, fdl)}
	save := func() error {
		res.Generated = time.Now().UTC()
		return harness.WriteJSON(filepath.Join(cfg.Out, "connections.json"), res)
	}
	began := time.Now()
	for rep := 1; rep <= cfg.Repeat; rep++ {
		for _, sys := range cfg.Systems {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted; partial results in %s", cfg.Out)
			}
			run := ConnectionsRun{System: sys, Repeat: rep, Connections: cfg.Connections}
			fmt.Fprintf(cfg.Progress, "%s · repeat %d/%d · %d idle connections · elapsed %s\n", sys, rep, cfg.Repeat, cfg.Connections, harness.FmtDur(time.Since(began)))
			run.Error = onFreshBroker(ctx, starter, cfg, sys, fmt.Sprintf("connections-%s-%d", sys, rep), func(br connectionsBroker) error {
				return runConnections(ctx, cfg, br, &run)
			})
			fmt.Fprintf(cfg.Progress, "      connect %.0f/s · RSS %s -> %s = %.1f KiB per connection, %.1f KiB after a command each, at most %.1f KiB while idling %s · delivered %d/%d %s\n",
				run.ConnectPerS, harness.FmtBytes(run.RSSBeforeBytes), harness.FmtBytes(run.RSSAfterBytes), run.RSSPerConnBytes/1024, run.RSSPerConnCommandedBytes/1024,
				run.RSSPerConnIdledBytes/1024, cfg.Idle, run.Delivered, cfg.Connections, run.Error)
			res.Runs = append(res.Runs, run)
			if cfg.Churn > 0 {
				ch := ChurnRun{System: sys, Repeat: rep, Sessions: cfg.Churn}
				ch.Error = onFreshBroker(ctx, starter, cfg, sys, fmt.Sprintf("churn-%s-%d", sys, rep), func(br connectionsBroker) error {
					return runChurn(ctx, cfg, br, &ch)
				})
				fmt.Fprintf(cfg.Progress, "      churn: %d sessions in %.1f s · RSS %s -> %s %s\n", ch.Completed, ch.Seconds,
					harness.FmtBytes(ch.RSSBeforeBytes), harness.FmtBytes(ch.RSSAfterBytes), ch.Error)
				res.Churn = append(res.Churn, ch)
			}
			if err := save(); err != nil {
				return err
			}
		}
	}
	if err := plotConnections(filepath.Join(cfg.Out, RSSPlotFile), res); err != nil {
		return fmt.Errorf("connections plot: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "connections.md"), []byte(connectionsMarkdown(res, cfg.Out)), 0o644); err != nil {
		return err
	}
	if cfg.WriteSummary != nil {
		if err := cfg.WriteSummary(cfg.Out); err != nil {
			return fmt.Errorf("summary: %w", err)
		}
	}
	fmt.Fprintf(cfg.Progress, "done in %s: %s, %s\n", harness.FmtDur(time.Since(began)),
		filepath.Join(cfg.Out, "connections.json"), filepath.Join(cfg.Out, "connections.md"))
	return nil
}

// RunCommand parses `luffy-bench connections` flags and runs it;
// writeSummary rewrites the summary once the results are written.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer, writeSummary func(dir string) error) error {
	d := DefaultConnectionsConfig()
	fs := flag.NewFlagSet("luffy-bench "+Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required): connections.json, connections.md, "+RSSPlotFile)
	n := fs.Int("connections", d.Connections, "idle MQTT v5 connections, each subscribed to its own dev/<id>/cmd")
	repeat := fs.Int("repeat", d.Repeat, "runs on each system (the summary reports medians)")
	systems := fs.String("systems", strings.Join(d.Systems, ","), "comma-separated systems: "+strings.Join(ConnectionsSystems, ", "))
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	dialers := fs.Int("dialers", d.Dialers, "connections set up at once")
	churn := fs.Int("churn", d.Churn, "short sessions (connect, subscribe, disconnect) one after another on a fresh broker of each system per repeat (0: none)")
	window := fs.Duration("settle-window", d.SettleWindow, "the broker's RSS is read once it moved less than 0.5 % over this long")
	settle := fs.Duration("settle-max", d.SettleMax, "longest wait for the broker's RSS to settle before it is read")
	delivery := fs.Duration("delivery-timeout", d.DeliveryTimeout, "longest wait for the commands to arrive")
	idle := fs.Duration("idle", d.Idle, "keep the devices connected this long after their commands and report the highest RSS meanwhile (0: not measured)")
	var extra harness.StringList
	fs.Var(&extra, "luffymq-arg", "extra luffymq flag (repeatable, comma-separated), e.g. --luffymq-arg=--max-pending-writes=8192")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := d
	cfg.Out, cfg.Connections, cfg.Repeat, cfg.Systems, cfg.LuffyMQ = *out, *n, *repeat, harness.SplitList(*systems), *luffymq
	cfg.Dialers, cfg.Churn, cfg.SettleWindow, cfg.SettleMax, cfg.DeliveryTimeout, cfg.LuffyMQArgs = *dialers, *churn, *window, *settle, *delivery, extra
	cfg.Idle, cfg.Progress, cfg.WriteSummary = *idle, stdout, writeSummary
	return RunConnections(ctx, cfg)
}
