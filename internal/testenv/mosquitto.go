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
		addr, err := startMosquitto(t, bin)
		if err == nil {
			return addr
		}
		lastErr = err
	}
	t.Fatalf("starting mosquitto: %v", lastErr)
	return ""
}

func startMosquitto(t testing.TB, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	config := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\npersistence false\nuser root\nlog_dest stderr\n", port)
	if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", conf, err)
	}
	out := &LockedBuffer{}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("running %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-exited:
			return "", fmt.Errorf("mosquitto exited at start: %s", out.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("mosquitto not listening on %s after 10 s: %s", addr, out.String())
		}
		<-poll.C
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("mosquitto log:\n%s", out.String())
		}
	})
	return addr, nil
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
