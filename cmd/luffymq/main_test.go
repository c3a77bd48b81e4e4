package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/luffymq/luffymq/internal/testenv"
)

// TestBadSettingsExitTwoWithOneLine: a bad setting, from the command
// line, the environment or the file, ends luffymq with status 2 and
// exactly one line on stderr naming it — including the cases that used to
// log three lines and exit 1 (--listen notaport), be ignored
// (--tls-cert without --tls-listen) or print a two-line YAML error (a bad
// auth file).
func TestBadSettingsExitTwoWithOneLine(t *testing.T) {
	dir := t.TempDir()
	badAuth := filepath.Join(dir, "auth.yaml")
	require.NoError(t, os.WriteFile(badAuth, []byte("auth: 3\n"), 0o600))
	badConfig := filepath.Join(dir, "luffymq.yaml")
	require.NoError(t, os.WriteFile(badConfig, []byte("report-interval: soon\n"), 0o600))
	tests := []struct {
		name     string
		args     []string
		environ  []string
		mentions []string
	}{
		{"listen not an address", []string{"--listen", "notaport"}, nil, []string{"listen", "notaport"}},
		{"tls-cert without tls-listen", []string{"--tls-cert", "cert.pem"}, nil, []string{"tls-cert", "cert.pem", "tls-listen"}},
		{"auth file YAML error", []string{"--auth-file", badAuth}, nil, []string{"auth-file", badAuth}},
		{"anonymous on every address", []string{"--listen", ":1883"}, nil, []string{"listen", ":1883", "auth-file"}},
		{"http beyond loopback", []string{"--http", "0.0.0.0:8080"}, nil, []string{"http", "0.0.0.0:8080", "http-token"}},
		{"environment", nil, []string{"LUFFYMQ_MAX_CONNECTIONS=many"}, []string{"LUFFYMQ_MAX_CONNECTIONS", "many"}},
		{"config file", []string{"--config", badConfig}, nil, []string{badConfig, "report-interval", "soon"}},
		{"EMQX strategy without equivalent", []string{"--strategy", "local"}, nil, []string{"strategy", "local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, tt.environ, &stdout, &stderr, nil)
			require.Equal(t, 2, code, stderr.String())
			require.Zero(t, stdout.Len())
			msg := stderr.String()
			require.True(t, strings.HasPrefix(msg, "luffymq: "), msg)
			require.Equal(t, 1, strings.Count(msg, "\n"), "exactly one line: %q", msg)
			require.True(t, strings.HasSuffix(msg, "\n"))
			for _, m := range tt.mentions {
				require.Contains(t, msg, m)
			}
		})
	}
}

// TestPrintConfigExitsZero: --print-config prints the effective settings
// as YAML on stdout, nothing on stderr, and exits 0 without starting.
func TestPrintConfigExitsZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"--print-config", "--strategy", "thesis"}, []string{"LUFFYMQ_REPORT_INTERVAL=2s", "LUFFYMQ_HTTP_TOKEN=secret-token-0123456789"}, &stdout, &stderr, nil)
	require.Equal(t, 0, code)
	require.Empty(t, stderr.String())
	var settings map[string]any
	require.NoError(t, yaml.Unmarshal(stdout.Bytes(), &settings))
	require.Equal(t, "thesis", settings["strategy"])
	require.Equal(t, "2s", settings["report-interval"])
	require.Equal(t, "127.0.0.1:1883", settings["listen"])
	require.NotContains(t, stdout.String(), "secret-token")
}

// TestRunServesUntilStopped: a good configuration starts the broker,
// which logs that it started and stops with status 0.
func TestRunServesUntilStopped(t *testing.T) {
	logs := new(testenv.LockedBuffer)
	stop := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "info"}, nil, new(bytes.Buffer), logs, stop)
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "luffymq started") }, 10*time.Second, 10*time.Millisecond, "%s", logs.String())
	require.Contains(t, logs.String(), "loopback listeners only", "the anonymous-access warning")
	close(stop)
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after stop")
	}
}
