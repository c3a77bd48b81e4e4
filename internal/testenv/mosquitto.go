// Package testenv starts real servers for tests on free loopback ports.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mosquittoPath is where Debian installs Mosquitto.
const mosquittoPath = "/usr/sbin/mosquitto"

// StartMosquitto starts a Mosquitto broker on a free 127.0.0.1 port with a
// generated configuration (anonymous access, TCP_NODELAY on) and stops it
// when the test ends. It returns the broker's host:port. Without Mosquitto
// installed the test is skipped, or fails when the CI environment variable
// is "true".
func StartMosquitto(t testing.TB) (addr string) {
	t.Helper()
	return startMosquittoRetrying(t, "persistence false\n").Addr
}

// Mosquitto is a running Mosquitto broker that keeps its sessions on disk
// across Restart (StartPersistentMosquitto).
type Mosquitto struct {
	// Addr is the broker's host:port; it stays the same across restarts.
	Addr string

	bin, conf string
	port      int
	stop      func()
}

// StartPersistentMosquitto starts Mosquitto as StartMosquitto does, with
// persistence in a temporary directory and no limit on the messages queued
// for an offline session, so that Restart keeps sessions and their
// messages.
func StartPersistentMosquitto(t testing.TB) *Mosquitto {
	t.Helper()
	dir := t.TempDir()
	return startMosquittoRetrying(t, fmt.Sprintf("persistence true\npersistence_location %s/\nautosave_interval 0\nmax_queued_messages 0\n", dir))
}

// Restart stops Mosquitto (it saves its sessions on SIGTERM) and starts it
// again on the same port.
func (m *Mosquitto) Restart(t testing.TB) {
	t.Helper()
	m.stop()
	var err error
	for range 50 { // the port is ours; wait for the old listener to close
		if err = m.start(t); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("restarting mosquitto: %v", err)
}

func startMosquittoRetrying(t testing.TB, extraConf string) *Mosquitto {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = mosquittoPath
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mosquitto not installed (%v); install the Debian package mosquitto", err)
		}
		t.Skipf("mosquitto not installed (%v); install the Debian package mosquitto", err)
	}
	var lastErr error
	for range 3 { // a free port can be taken by someone else before Mosquitto binds it
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		conf := filepath.Join(t.TempDir(), "mosquitto.conf")
		config := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\nuser root\nlog_dest stderr\n%s", port, extraConf)
		if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
			t.Fatalf("writing %s: %v", conf, err)
		}
		m := &Mosquitto{bin: bin, conf: conf, port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		if lastErr = m.start(t); lastErr == nil {
			t.Cleanup(func() { m.stop() })
			return m
		}
	}
	t.Fatalf("starting mosquitto: %v", lastErr)
	return nil
}

// start runs Mosquitto with m's configuration and waits until it listens.
func (m *Mosquitto) start(t testing.TB) error {
	out := &LockedBuffer{}
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", m.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			if t.Failed() {
				t.Logf("mosquitto log:\n%s", out.String())
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-exited:
			return fmt.Errorf("mosquitto exited at start: %s", out.String())
		default:
		}
		c, err := net.DialTimeout("tcp", m.Addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			m.stop()
			return fmt.Errorf("mosquitto not listening on %s after 10 s: %s", m.Addr, out.String())
		}
		<-poll.C
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	tcp, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("finding a free port: not a TCP address")
	}
	return tcp.Port, nil
}

// LockedBuffer collects output (a process's, a logger's) written from
// several goroutines.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
