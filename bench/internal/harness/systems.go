// Package harness is what the bench packages share: starting the brokers
// (luffymq, Mosquitto, vanilla Mochi) as processes of their own, free
// ports, MQTT clients and payloads, latency statistics, plots, report and
// flag helpers.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RunningBroker is a broker started for one run.
type RunningBroker interface {
	// Addr is the broker's host:port on loopback.
	Addr() string
	// Close stops the broker.
	Close() error
}

// BrokerStarter starts the broker of a system for one run.
type BrokerStarter struct {
	// LuffyMQ is the luffymq binary.
	LuffyMQ string
	// Mosquitto is the mosquitto binary ("" when not found).
	Mosquitto string
	// Self is the luffy-bench executable, started with the
	// "mochi-server" subcommand to run vanilla Mochi as a process of its
	// own (a test binary does the same through TestMain).
	Self string
	// LogDir receives broker logs.
	LogDir string
	// LiveOracle starts the live oracle in this process, or with informed
	// the informed live oracle (set by the runs that have them among their
	// systems).
	LiveOracle func(logPath string, informed bool) (RunningBroker, error)
}

// NewBrokerStarter prepares the brokers of systems for a run writing into
// out: it finds Mosquitto, makes out/logs, builds luffymq when luffymq is
// "" (cleanup removes it) and locates this executable for vanilla Mochi.
func NewBrokerStarter(ctx context.Context, out string, systems []string, luffymq string, progress io.Writer) (b BrokerStarter, cleanup func(), err error) {
	cleanup = func() {}
	b.Mosquitto = FindMosquitto()
	if slices.Contains(systems, SystemMosquitto) && b.Mosquitto == "" {
		return b, cleanup, ErrMosquittoMissing
	}
	b.LogDir = filepath.Join(out, "logs")
	if err := os.MkdirAll(b.LogDir, 0o755); err != nil {
		return b, cleanup, fmt.Errorf("output directory: %w", err)
	}
	b.LuffyMQ = luffymq
	if slices.ContainsFunc(systems, func(s string) bool { return strings.HasPrefix(s, "luffymq-") }) {
		if b.LuffyMQ, cleanup, err = LuffyMQBinary(ctx, luffymq, progress); err != nil {
			return b, func() {}, err
		}
	}
	if b.Self, err = os.Executable(); err != nil && slices.Contains(systems, SystemMochi) {
		cleanup()
		return b, func() {}, fmt.Errorf("mochi runs as `luffy-bench %s`, but this executable's path is unknown: %w", MochiServerCommand, err)
	}
	return b, cleanup, nil
}

// Start starts the broker for system (not the oracle) with the given report
// interval; logName names its log file.
func (b BrokerStarter) Start(ctx context.Context, system string, reportInterval time.Duration, logName string) (RunningBroker, error) {
	switch {
	case strings.HasPrefix(system, "luffymq-"):
		return StartProcess(ctx, b.LuffyMQ, filepath.Join(b.LogDir, logName+".broker.log"), func(addr string) ([]string, error) {
			return append([]string{"--listen", addr, "--http", "",
				"--report-interval", reportInterval.String(), "--log-level", "warn"}, LuffyMQSelectionArgs(system)...), nil
		})
	case system == SystemMosquitto:
		if b.Mosquitto == "" {
			return nil, ErrMosquittoMissing
		}
		dir, err := os.MkdirTemp("", "luffy-bench-mosquitto-")
		if err != nil {
			return nil, fmt.Errorf("mosquitto config dir: %w", err)
		}
		p, err := StartProcess(ctx, b.Mosquitto, filepath.Join(b.LogDir, logName+".broker.log"), func(addr string) ([]string, error) {
			host, port, _ := net.SplitHostPort(addr)
			conf := filepath.Join(dir, "mosquitto.conf")
			config := fmt.Sprintf("listener %s %s\nallow_anonymous true\nset_tcp_nodelay true\npersistence false\nlog_dest stderr\n", port, host)
			if os.Geteuid() == 0 {
				config += "user root\n"
			}
			if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
				return nil, fmt.Errorf("writing %s: %w", conf, err)
			}
			return []string{"-c", conf}, nil
		})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		p.Cleanup = func() { _ = os.RemoveAll(dir) }
		return p, nil
	case system == SystemLiveOracle || system == SystemLiveInformedOracle:
		if b.LiveOracle == nil {
			return nil, errors.New(system + ": not available in this run")
		}
		return b.LiveOracle(filepath.Join(b.LogDir, logName+".broker.log"), system == SystemLiveInformedOracle)
	case system == SystemMochi:
		if b.Self == "" {
			return nil, errors.New("mochi: the path of the luffy-bench executable is unknown")
		}
		return StartProcess(ctx, b.Self, filepath.Join(b.LogDir, logName+".broker.log"), func(addr string) ([]string, error) {
			return []string{MochiServerCommand, "--listen", addr}, nil
		})
	}
	return nil, fmt.Errorf("no broker for system %q", system)
}

var ErrMosquittoMissing = errors.New("mosquitto not found: install the Debian package mosquitto (apt-get install mosquitto) or leave it out of --systems")

// FindMosquitto returns the mosquitto binary, or "".
func FindMosquitto() string {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/mosquitto"); err == nil {
		return "/usr/sbin/mosquitto"
	}
	return ""
}

// mosquittoVersion returns Mosquitto's version line, or "".
func mosquittoVersion(bin string) string {
	if bin == "" {
		return ""
	}
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "version") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// Process is a broker running as a child process.
type Process struct {
	addr    string
	Cmd     *exec.Cmd
	exited  chan struct{}
	log     *os.File
	Cleanup func()
	once    sync.Once
}

func (p *Process) Addr() string { return p.addr }

func (p *Process) Close() error {
	p.once.Do(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = p.Cmd.Process.Kill()
			<-p.exited
		}
		_ = p.log.Close()
		if p.Cleanup != nil {
			p.Cleanup()
		}
	})
	return nil
}

// StartProcess runs bin with the arguments args returns for a free loopback
// address and waits until it accepts connections. It retries on another
// port if the first is taken meanwhile.
func StartProcess(ctx context.Context, bin, logPath string, args func(addr string) ([]string, error)) (*Process, error) {
	var lastErr error
	for range 3 {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		a, err := args(addr)
		if err != nil {
			return nil, err
		}
		logf, err := os.Create(logPath)
		if err != nil {
			return nil, fmt.Errorf("broker log: %w", err)
		}
		cmd := exec.Command(bin, a...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			_ = logf.Close()
			return nil, fmt.Errorf("starting %s: %w", bin, err)
		}
		p := &Process{addr: addr, Cmd: cmd, exited: make(chan struct{}), log: logf}
		go func() {
			_ = cmd.Wait()
			close(p.exited)
		}()
		if err := waitListening(ctx, addr, p.exited); err != nil {
			_ = p.Close()
			out, _ := os.ReadFile(logPath)
			lastErr = fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(a, " "), err, LastLine(out))
			continue
		}
		return p, nil
	}
	return nil, lastErr
}

func LastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// waitListening polls addr until it accepts a connection, the process
// exits, or 10 s pass.
func waitListening(ctx context.Context, addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return errors.New("exited at start")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after 10 s", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreeAddr returns a free 127.0.0.1 address.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// buildLuffyMQ builds ./cmd/luffymq of the module containing the working
// directory into dir and returns the binary's path.
// LuffyMQBinary returns path when it is set; otherwise it builds luffymq
// into a temporary directory (saying so on progress) and returns the
// binary and a cleanup that removes the directory.
func LuffyMQBinary(ctx context.Context, path string, progress io.Writer) (bin string, cleanup func(), err error) {
	if path != "" {
		return path, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", "luffy-bench-bin-")
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintln(progress, "building luffymq …")
	if bin, err = buildLuffyMQ(ctx, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", nil, err
	}
	return bin, func() { _ = os.RemoveAll(tmp) }, nil
}

func buildLuffyMQ(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", errors.New("cannot build luffymq: run luffy-bench inside the luffymq module, or pass --luffymq PATH")
	}
	root := filepath.Dir(gomod)
	bin := filepath.Join(dir, "luffymq")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/luffymq")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building luffymq in %s: %w: %s (or pass --luffymq PATH)", root, err, LastLine(stderr.Bytes()))
	}
	return bin, nil
}

// SystemLiveOracle is vanilla Mochi MQTT in luffy-bench's own process with
// a selection hook that sees the members' true state: each message goes
// to the member that will start it first, from the member's real schedule
// (the emulator's end of its last service) plus the exact work of what was
// sent to it and not yet started. Unlike the replayed oracle it routes
// through a real broker and pays the run's delivery delays, acks and
// reports included; it is the reference a live policy can be held to. Like
// the replayed oracle it is greedy (earliest start for each message in
// turn), not a proven lower bound: at 100 % utilisation on a loaded
// machine adaptive has beaten it (thesis-2, thesis-format reporters:
// 35.9 ms against 42.0 ms, medians of 2 runs).
const SystemLiveOracle = "live-oracle"

// SystemLiveInformedOracle is the live oracle that knows what a broker
// could at best know: each member's exact queue (the message it runs,
// those sent to it and not started) and its true mean service time, but
// not the size of any message, whose remaining it expects from the
// scenario's noise (a whole mean for exponential work, however long the
// message has run). With noisy service times it is the reference a live
// policy can be held to; without noise it is the live oracle.
const SystemLiveInformedOracle = "live-informed-oracle"

// System names accepted by --systems.
const (
	SystemMosquitto = "mosquitto"
	SystemMochi     = "mochi"
	SystemOracle    = "oracle"
)

// LuffyStrategies are the luffymq strategies benchmarked, in report order.
var LuffyStrategies = []string{"adaptive", "adaptive-hold", "thesis", "round-robin", "random", "sticky", "jsq", "power-of-two", "hash-clientid", "hash-topic"}

// SystemAdaptiveHold is adaptive with late binding: it holds messages at
// the broker on purpose.
const SystemAdaptiveHold = "luffymq-adaptive-hold"

// BenchHoldLead is the --hold-lead of the luffymq-adaptive-hold system:
// adaptive with late binding, the lead suited to loopback members.
const BenchHoldLead = 5 * time.Millisecond

// LuffyMQSelectionArgs returns the luffymq flags that select system's
// strategy: "luffymq-<strategy>", or luffymq-adaptive-hold (adaptive with
// --hold-lead BenchHoldLead).
func LuffyMQSelectionArgs(system string) []string {
	strategy := strings.TrimPrefix(system, "luffymq-")
	if strategy == "adaptive-hold" {
		return []string{"--strategy", "adaptive", "--hold-lead", BenchHoldLead.String()}
	}
	return []string{"--strategy", strategy}
}

// AllSystems returns every system name in report order.
func AllSystems() []string {
	var out []string
	for _, s := range LuffyStrategies {
		out = append(out, "luffymq-"+s)
	}
	return append(out, SystemMosquitto, SystemMochi, SystemLiveOracle, SystemLiveInformedOracle, SystemOracle)
}

// ParseSystems turns a comma-separated list (strategy names may omit the
// "luffymq-" prefix; "all" means every system) into system names in report
// order.
func ParseSystems(list string) ([]string, error) {
	all := AllSystems()
	if strings.TrimSpace(list) == "" || list == "all" {
		return all, nil
	}
	want := map[string]bool{}
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name := f
		for _, s := range LuffyStrategies {
			if f == s {
				name = "luffymq-" + s
			}
		}
		ok := false
		for _, a := range all {
			ok = ok || a == name
		}
		if !ok {
			return nil, fmt.Errorf("unknown system %q; choose from %s (strategy names may omit luffymq-)", f, strings.Join(all, ", "))
		}
		want[name] = true
	}
	var out []string
	for _, a := range all {
		if want[a] {
			out = append(out, a)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return SystemOrder(out[i]) < SystemOrder(out[j]) })
	return out, nil
}

func SystemOrder(name string) int {
	for i, a := range AllSystems() {
		if a == name {
			return i
		}
	}
	return len(AllSystems())
}
