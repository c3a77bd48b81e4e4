// Package rabbitharness starts real RabbitMQ nodes for tests, one per site,
// and joins them through userspace latency proxies that emulate WAN links.
//
// Each node is the Debian package's /usr/lib/rabbitmq/bin/rabbitmq-server
// started with its own node name (site-<name>-<random>@localhost), free
// 127.0.0.1 ports (AMQP, management, Erlang distribution), data and log
// directories, rabbitmq.conf, enabled-plugins file (management, federation,
// federation management, consistent-hash exchange, event exchange),
// feature-flags file, and HOME (hence Erlang cookie) in a fresh temporary
// directory. All nodes of a harness share one epmd on a private port
// (ERL_EPMD_PORT), bound to 127.0.0.1. Nodes start in parallel; Start
// returns once every management API answers and every AMQP port accepts
// connections (about 15 s on a 2-core machine). Memory is kept small
// (vm_memory_high_watermark.absolute, disk_free_limit.absolute = 50MB, one
// Erlang scheduler).
//
// Close kills every process the harness started: each node's process
// group, then any leftover process (epmd, erl_child_setup, inet_gethost,
// which detach into their own sessions) carrying the harness's marker
// environment variable. Processes left behind by a test binary that died
// before cleaning up are reaped by the next Start.
//
// KillNode crashes one node (SIGKILL of its Erlang VM), StopNode stops it
// cleanly, and RestartNode starts it again, on the same name, ports and
// data directory: durable queues and persistent messages survive.
//
// Link(from, to) returns a connection to node `to` as seen from site `from`:
// an AMQP URI through a toxiproxy latency proxy with the one-way delay of
// CityDelay (scenarios.md §C), which can be cut and restored.
//
// Tests call StartT, which skips the test when RabbitMQ is not installed
// (or fails it when the environment variable CI is "true") and closes the
// harness when the test ends. TestMain users call Start and Close.
package rabbitharness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ServerPath is where the Debian package installs the RabbitMQ start script.
const ServerPath = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Default credentials of every node (loopback_users = none lets them log in
// over 127.0.0.1 and through the proxies).
const (
	User     = "guest"
	Password = "guest"
)

// markerEnv is set in every node's environment; its value is
// "<owner pid>-<harness id>" so leftover processes can be found and reaped.
const markerEnv = "LUFFYMQ_RABBITHARNESS"

// ErrNotInstalled is returned by Start when rabbitmq-server is missing.
var ErrNotInstalled = errors.New("rabbitmq-server not installed; install the Debian package rabbitmq-server (make deps does)")

// Plugins are enabled on every node.
var Plugins = []string{
	"rabbitmq_management",
	"rabbitmq_federation",
	"rabbitmq_federation_management",
	"rabbitmq_consistent_hash_exchange",
	"rabbitmq_event_exchange",
}

// Config describes the nodes to start.
type Config struct {
	// Sites names one node per site (lower-case letters, digits, '-').
	Sites []string
	// StartTimeout bounds the wait for every node to answer (90 s).
	StartTimeout time.Duration
	// MemoryHighWatermark is vm_memory_high_watermark.absolute ("512MB").
	MemoryHighWatermark string
	// Delay gives the one-way delay of a link from site a to site b
	// (CityDelay).
	Delay func(a, b string) time.Duration
	// Dir is the parent of the nodes' directories (os.MkdirTemp("")).
	Dir string
}

// Harness is a set of running RabbitMQ nodes and the links between them.
type Harness struct {
	cfg      Config
	id       string
	marker   string
	dir      string
	ownDir   bool
	epmdPort int
	nodes    []*Node
	bySite   map[string]*Node

	mu     sync.Mutex
	links  map[[2]string]*Link
	proxy  *toxiproxy.ApiServer
	resets int // successful Reset calls
}

// Node is one running RabbitMQ node.
type Node struct {
	// Name is the Erlang node name, site-<site>-<random>@localhost.
	Name string
	// Site is the site this node serves.
	Site string

	amqpPort, mgmtPort, distPort int
	dir                          string
	marker                       string // markerEnv's value in its processes
	// logFrom is the main log's size when the node was last started:
	// logErrors reads from there, so a restart's errors are not hidden
	// behind those of an earlier run (the log is appended to).
	logFrom int64
	// reserved holds the sockets that keep the node's ports while it is
	// down (between KillNode or StopNode and RestartNode's end).
	reserved []int

	mu     sync.Mutex // guards cmd, exited, closedLog and reserved
	cmd    *exec.Cmd
	exited chan struct{}
	// closedLog is the log tail kept when Close removed the node's
	// directory, so a test that fails after closing can still show it.
	closedLog string
}

// Available reports whether rabbitmq-server is installed.
func Available() error {
	if _, err := os.Stat(ServerPath); err != nil {
		return fmt.Errorf("%w (%v)", ErrNotInstalled, err)
	}
	return nil
}

// StartT starts a harness for cfg and closes it when t ends. Without
// RabbitMQ installed it skips t, or fails it when CI is "true".
func StartT(t testing.TB, cfg Config) *Harness {
	t.Helper()
	SkipIfUnavailable(t)
	h, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("starting RabbitMQ nodes: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range h.nodes {
				t.Logf("log tail of %s:\n%s", n.Name, n.LogTail(4000))
			}
		}
		if err := h.Close(); err != nil {
			t.Errorf("stopping RabbitMQ nodes: %v", err)
		}
	})
	return h
}

// SkipIfUnavailable skips t when RabbitMQ is not installed, or fails it when
// the environment variable CI is "true".
func SkipIfUnavailable(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// Start starts one node per site in parallel and waits until all answer.
// On error every node already started is stopped.
func Start(ctx context.Context, cfg Config) (*Harness, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if len(cfg.Sites) == 0 {
		return nil, errors.New("rabbitharness: no sites given")
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 90 * time.Second
	}
	if cfg.MemoryHighWatermark == "" {
		cfg.MemoryHighWatermark = "512MB"
	}
	if cfg.Delay == nil {
		cfg.Delay = CityDelay
	}
	seen := map[string]bool{}
	for _, s := range cfg.Sites {
		if !validSite(s) {
			return nil, fmt.Errorf("rabbitharness: site name %q: use lower-case letters, digits and '-'", s)
		}
		if seen[s] {
			return nil, fmt.Errorf("rabbitharness: site %q given twice", s)
		}
		seen[s] = true
	}
	reapOrphans()

	h := &Harness{cfg: cfg, id: randomHex(4), bySite: map[string]*Node{}, links: map[[2]string]*Link{}}
	h.marker = strconv.Itoa(os.Getpid()) + "-" + h.id
	if cfg.Dir != "" {
		h.dir = cfg.Dir
	} else {
		dir, err := os.MkdirTemp("", "rabbitharness-")
		if err != nil {
			return nil, fmt.Errorf("rabbitharness: temp dir: %w", err)
		}
		h.dir, h.ownDir = dir, true
	}
	var err error
	if h.epmdPort, err = freePort(); err != nil {
		h.cleanupDir()
		return nil, err
	}
	for _, site := range cfg.Sites {
		n := &Node{Site: site, marker: h.marker + "-" + site}
		if err := n.choosePorts(); err != nil {
			h.cleanupDir()
			return nil, err
		}
		h.nodes = append(h.nodes, n)
		h.bySite[site] = n
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	errs := make([]error, len(h.nodes))
	var wg sync.WaitGroup
	for i, n := range h.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A node that exits during start gets new ports, name and
			// directory once: another process may have bound one of its
			// ports after freePort chose it.
			for attempt := 1; ; attempt++ {
				errs[i] = h.startNode(ctx, n)
				if attempt == 2 || !errors.Is(errs[i], errExitedDuringStart) || ctx.Err() != nil {
					return
				}
				if err := n.choosePorts(); err != nil {
					errs[i] = errors.Join(errs[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = h.Close()
		return nil, err
	}
	return h, nil
}

func validSite(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// choosePorts gives n a new name and free ports.
func (n *Node) choosePorts() error {
	n.Name = "site-" + n.Site + "-" + randomHex(3) + "@localhost"
	for _, p := range []*int{&n.amqpPort, &n.mgmtPort, &n.distPort} {
		var err error
		if *p, err = freePort(); err != nil {
			return err
		}
	}
	return nil
}

func (h *Harness) startNode(ctx context.Context, n *Node) error {
	n.dir = filepath.Join(h.dir, strings.TrimSuffix(n.Name, "@localhost"))
	home := filepath.Join(n.dir, "home")
	for _, d := range []string{home, filepath.Join(n.dir, "mnesia"), filepath.Join(n.dir, "log")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	conf := fmt.Sprintf(`listeners.tcp.default = 127.0.0.1:%d
management.tcp.port = %d
management.tcp.ip = 127.0.0.1
loopback_users = none
vm_memory_high_watermark.absolute = %s
disk_free_limit.absolute = 50MB
log.console = false
log.file.level = info
collect_statistics_interval = 1000
`, n.amqpPort, n.mgmtPort, h.cfg.MemoryHighWatermark)
	confPath := filepath.Join(n.dir, "rabbitmq.conf")
	pluginsPath := filepath.Join(n.dir, "enabled_plugins")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(pluginsPath, []byte("["+strings.Join(Plugins, ",")+"].\n"), 0o600); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	out, err := os.Create(filepath.Join(n.dir, "stdout.log"))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	defer out.Close()
	n.logFrom = 0
	if st, err := os.Stat(n.mainLogPath()); err == nil {
		n.logFrom = st.Size()
	}

	cmd := exec.Command(ServerPath)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(filteredEnv(),
		"HOME="+home,
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+pluginsPath,
		"RABBITMQ_CONFIG_FILE="+confPath,
		"RABBITMQ_FEATURE_FLAGS_FILE="+filepath.Join(n.dir, "feature_flags"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_PORT="+strconv.Itoa(h.epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		markerEnv+"="+n.marker,
	)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node %s: running %s: %w", n.Name, ServerPath, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	return n.waitReady(ctx, exited)
}

// waitReady polls the management API and an AMQP login until both succeed.
func (n *Node) waitReady(ctx context.Context, exited <-chan struct{}) error {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if n.ready(ctx, client) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("node %s %w; errors in its log:\n%s\nlog tail:\n%s", n.Name, errExitedDuringStart, n.logErrors(2000), n.LogTail(1500))
		case <-ctx.Done():
			return fmt.Errorf("node %s not answering on management port %d: %w; log tail:\n%s", n.Name, n.mgmtPort, ctx.Err(), n.LogTail(3000))
		case <-tick.C:
		}
	}
}

func (n *Node) ready(ctx context.Context, client *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.ManagementURL()+"/api/overview", nil)
	if err != nil {
		return false
	}
	req.SetBasicAuth(User, Password)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	// A listening port is not enough: a node can accept TCP and still drop
	// its first logins (one CI run got EOF from the first amqp.Dial after
	// the management API answered). Ready means an AMQP login succeeds.
	conn, err := amqp.DialConfig(n.AMQPURL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// AMQPAddr returns the node's AMQP host:port.
func (n *Node) AMQPAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.amqpPort)) }

// AMQPURL returns the node's AMQP URI (default vhost, guest user). The
// vhost "/" is spelled %2F: RabbitMQ's own clients (federation) read a
// bare trailing "/" as the empty vhost and fail with not_allowed.
func (n *Node) AMQPURL() string {
	return "amqp://" + User + ":" + Password + "@" + n.AMQPAddr() + "/%2F"
}

// ManagementURL returns the base URL of the node's management API.
func (n *Node) ManagementURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.mgmtPort))
}

// errExitedDuringStart says a node's VM stopped before it was ready: a
// port taken between freePort and the node's bind is the usual cause.
var errExitedDuringStart = errors.New("exited during start")

// mainLogPath is the node's RabbitMQ log file.
func (n *Node) mainLogPath() string { return filepath.Join(n.dir, "log", n.Name+".log") }

// logErrors returns the lines of the node's logs (main log since its last
// start, and stdout) that report an error, at most max bytes of the first
// ones.
func (n *Node) logErrors(max int) string {
	var b strings.Builder
	for i, f := range []string{n.mainLogPath(), filepath.Join(n.dir, "stdout.log")} {
		data, _ := os.ReadFile(f)
		if i == 0 && int64(len(data)) >= n.logFrom {
			data = data[n.logFrom:]
		}
		for _, line := range strings.Split(string(data), "\n") {
			l := strings.ToLower(line)
			if (strings.Contains(l, "[error]") || strings.Contains(l, "eaddrinuse") || strings.Contains(l, "error:") || strings.Contains(l, "failed")) && b.Len() < max {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
	}
	return b.String()
}

// keptLogTail is how much of each node's log Close keeps for LogTail.
const keptLogTail = 8000

// LogTail returns the last max bytes of the node's main log (after Close,
// of what Close kept).
func (n *Node) LogTail(max int) string {
	data, err := os.ReadFile(n.mainLogPath())
	if err != nil {
		data, err = os.ReadFile(filepath.Join(n.dir, "stdout.log"))
	}
	if err != nil {
		n.mu.Lock()
		data = []byte(n.closedLog)
		n.mu.Unlock()
	}
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return string(data)
}

// Node returns the node of site, or nil.
func (h *Harness) Node(site string) *Node { return h.bySite[site] }

// Nodes returns the nodes in the order of Config.Sites.
func (h *Harness) Nodes() []*Node { return append([]*Node(nil), h.nodes...) }

// Close stops the links, kills every process of the harness and removes
// its directories.
func (h *Harness) Close() error {
	h.mu.Lock()
	links := h.links
	h.links = map[[2]string]*Link{}
	h.mu.Unlock()
	for _, l := range links {
		l.Cut()
	}
	for _, n := range h.nodes {
		cmd, _ := n.process()
		if cmd != nil && cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		n.releasePorts()
	}
	for _, n := range h.nodes {
		if _, exited := n.process(); exited != nil {
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
			}
		}
	}
	err := killMarked(func(v string) bool { return v == h.marker || strings.HasPrefix(v, h.marker+"-") })
	if h.ownDir {
		for _, n := range h.nodes {
			tail := n.LogTail(keptLogTail)
			n.mu.Lock()
			n.closedLog = tail
			n.mu.Unlock()
		}
	}
	h.cleanupDir()
	return err
}

func (h *Harness) cleanupDir() {
	if h.ownDir {
		_ = os.RemoveAll(h.dir)
	}
}

// filteredEnv is the test's environment without variables that would
// redirect RabbitMQ or Erlang.
func filteredEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "ERL_") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, markerEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// killMarked kills, by pid, every process whose marker value satisfies
// match, and waits (up to 5 s) until none is left alive. (Killed
// descendants that detached from the node are reaped by init.)
func killMarked(match func(marker string) bool) error {
	return killAll(func() []int { return markedPIDs(match) })
}

// killAll kills, by pid, every process that list returns, until it
// returns none (up to 5 s).
func killAll(list func() []int) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := list()
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rabbitharness: processes %v survive SIGKILL", pids)
		}
		t := time.NewTimer(50 * time.Millisecond)
		<-t.C
	}
}

// markedPIDs lists live processes carrying the marker variable whose value
// satisfies match (zombies excluded).
func markedPIDs(match func(string) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := []byte(markerEnv + "=")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.HasPrefix(kv, prefix) && match(string(kv[len(prefix):])) {
				if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !isZombie(stat) {
					pids = append(pids, pid)
				}
				break
			}
		}
	}
	return pids
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// reapOrphans kills processes left by harnesses whose owning process is gone.
func reapOrphans() {
	_ = killMarked(func(v string) bool {
		owner, _, ok := strings.Cut(v, "-")
		if !ok {
			return false
		}
		pid, err := strconv.Atoi(owner)
		if err != nil || pid == os.Getpid() {
			return false
		}
		return syscall.Kill(pid, 0) != nil
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("rabbitharness: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
