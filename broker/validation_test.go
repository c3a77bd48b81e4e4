package broker

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// validAuthFile is an auth ledger Mochi accepts.
const validAuthFile = "auth:\n  - username: worker\n    password: secret\n    allow: true\n"

// TestEveryBadValueIsOneLineNamingIt: every bad setting is refused before
// anything starts, with one line that names the setting and the value
// (never a secret's value).
func TestEveryBadValueIsOneLineNamingIt(t *testing.T) {
	cert, key := writeSelfSignedCert(t)
	authFile := writeFile(t, "auth.yaml", validAuthFile)
	// Mochi's YAML errors span lines: "yaml: unmarshal errors:\n  line 1: …".
	twoLineAuth := writeFile(t, "auth2.yaml", "auth: 3\n")
	brokenAuth := writeFile(t, "auth3.yaml", "auth: [not: {valid")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	const token = "0123456789abcdef-token"
	tests := []struct {
		name     string
		args     []string
		mentions []string
	}{
		// Listen addresses (the first was logged in three lines, exit 1).
		{"listen not an address", []string{"--listen", "notaport"}, []string{"listen", `"notaport"`, "host:port"}},
		{"listen port too large", []string{"--listen", "127.0.0.1:65536"}, []string{"listen", `"65536"`}},
		{"listen port name", []string{"--listen", "127.0.0.1:mqtt"}, []string{"listen", `"mqtt"`}},
		{"listen bad host", []string{"--listen", "bad host!:1883"}, []string{"listen", `"bad host!"`}},
		{"ws-listen not an address", []string{"--ws-listen", "1882"}, []string{"ws-listen", `"1882"`}},
		{"tls-listen not an address", []string{"--tls-listen", "x", "--tls-cert", cert, "--tls-key", key}, []string{"tls-listen", `"x"`}},
		{"http not an address", []string{"--http", "nope"}, []string{"http", `"nope"`}},
		{"no listener", []string{"--listen", ""}, []string{"no MQTT listener"}},
		// TLS for MQTT (the first was ignored in silence).
		{"tls-cert without tls-listen", []string{"--tls-cert", cert}, []string{"tls-cert", cert, "without tls-listen"}},
		{"tls-key without tls-listen", []string{"--tls-key", key}, []string{"tls-key", key, "without tls-listen"}},
		{"tls-listen without cert", []string{"--tls-listen", "127.0.0.1:8883"}, []string{"tls-listen", "tls-cert"}},
		{"tls-cert unreadable", []string{"--tls-listen", "127.0.0.1:8883", "--tls-cert", missing, "--tls-key", key}, []string{"tls-cert", missing}},
		// Auth file (the first printed a two-line YAML error).
		{"auth-file two-line YAML error", []string{"--auth-file", twoLineAuth}, []string{"auth-file", twoLineAuth, "line 1"}},
		{"auth-file syntax error", []string{"--auth-file", brokenAuth}, []string{"auth-file", brokenAuth}},
		{"auth-file missing", []string{"--auth-file", missing}, []string{"auth-file", missing}},
		{"auth-file with allow-anonymous", []string{"--auth-file", authFile, "--allow-anonymous"}, []string{"allow-anonymous", "auth-file", authFile}},
		// Anonymous access beyond loopback.
		{"listen on every address", []string{"--listen", ":1883"}, []string{"listen", `":1883"`, "auth-file", "allow-anonymous"}},
		{"listen on 0.0.0.0", []string{"--listen", "0.0.0.0:1883"}, []string{"listen", `"0.0.0.0:1883"`, "loopback"}},
		{"listen on a host name", []string{"--listen", "broker.example:1883"}, []string{"listen", `"broker.example:1883"`}},
		{"ws-listen on every address", []string{"--ws-listen", ":1882"}, []string{"ws-listen", `":1882"`, "allow-anonymous"}},
		{"tls-listen on every address", []string{"--tls-listen", ":8883", "--tls-cert", cert, "--tls-key", key}, []string{"tls-listen", `":8883"`}},
		// HTTP.
		{"http beyond loopback without token", []string{"--http", "0.0.0.0:8080"}, []string{"http", `"0.0.0.0:8080"`, "http-token"}},
		{"http on every address without token", []string{"--http", ":8080"}, []string{"http", `":8080"`, "http-token"}},
		{"http-token too short", []string{"--http-token", "short-secret"}, []string{"http-token", "12 characters", "16"}},
		{"http-token with a space", []string{"--http-token", "0123456789 abcdefgh"}, []string{"http-token", "space"}},
		{"http-token without http", []string{"--http", "", "--http-token", token}, []string{"http-token", "need http"}},
		{"http-tls-cert without key", []string{"--http-tls-cert", cert}, []string{"http-tls-cert", cert, "http-tls-key"}},
		{"http-tls-key unreadable", []string{"--http-tls-cert", cert, "--http-tls-key", missing}, []string{"http-tls-key", missing}},
		// Strategies.
		{"unknown strategy", []string{"--strategy", "fastest"}, []string{"strategy", `"fastest"`, "adaptive", "round_robin"}},
		{"EMQX strategy without equivalent", []string{"--strategy", "local"}, []string{"strategy", `"local"`, "no LuffyMQ equivalent", "random", "hash_clientid"}},
		// Numbers and durations.
		{"bad duration", []string{"--report-interval", "1x"}, []string{"report-interval", `"1x"`}},
		{"zero interval", []string{"--report-interval", "0s"}, []string{"report-interval", "0s"}},
		{"negative stale-after", []string{"--stale-after", "-1s"}, []string{"stale-after", "-1s"}},
		{"tiny packet limit", []string{"--max-packet-size", "10"}, []string{"max-packet-size", "10"}},
		{"negative connect-timeout", []string{"--connect-timeout", "-1s"}, []string{"connect-timeout", "-1s"}},
		{"negative max-connections", []string{"--max-connections", "-1"}, []string{"max-connections", "-1"}},
		{"negative max-connections-per-ip", []string{"--max-connections-per-ip", "-2"}, []string{"max-connections-per-ip", "-2"}},
		{"negative redispatch-grace", []string{"--redispatch-grace", "-1s"}, []string{"redispatch-grace", "-1s"}},
		{"negative max-queued-bytes", []string{"--max-queued-bytes", "-1"}, []string{"max-queued-bytes", "-1"}},
		{"bad bool", []string{"--allow-anonymous=maybe"}, []string{"allow-anonymous", `"maybe"`}},
		{"bad log level", []string{"--log-level", "loud"}, []string{"log-level", `"loud"`}},
		// Bridge.
		{"site without amqp-url", []string{"--site", "berlin"}, []string{"site", "amqp-url"}},
		{"amqp-url without site", []string{"--amqp-url", "amqp://127.0.0.1/"}, []string{"amqp-url", "site"}},
		// Command line.
		{"unknown flag", []string{"--colour", "blue"}, []string{"colour"}},
		{"stray argument", []string{"extra"}, []string{"unexpected argument", `"extra"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadConfig(tt.args, nil, io.Discard, io.Discard)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalidConfig)
			msg := err.Error()
			require.NotContains(t, msg, "\n", "one line")
			require.NotContains(t, msg, token, "the token is never shown")
			for _, m := range tt.mentions {
				require.Contains(t, msg, m)
			}
		})
	}
}

// TestSecureDefaultsAccept: what the secure defaults still accept — the
// defaults themselves (MQTT and HTTP on loopback, anonymous), a listener
// on every address with an auth file or --allow-anonymous, HTTP beyond
// loopback with a token, and EMQX strategy names.
func TestSecureDefaultsAccept(t *testing.T) {
	cert, key := writeSelfSignedCert(t)
	authFile := writeFile(t, "auth.yaml", validAuthFile)
	const token = "0123456789abcdef-token"
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, cfg Config)
	}{
		{"defaults", nil, func(t *testing.T, cfg Config) {
			require.Equal(t, "127.0.0.1:1883", cfg.MQTTListen)
			require.Equal(t, "127.0.0.1:8080", cfg.HTTPListen)
			require.False(t, cfg.AllowAnonymous)
			require.Empty(t, cfg.AuthFile)
		}},
		{"localhost and IPv6 loopback", []string{"--listen", "localhost:1883", "--ws-listen", "[::1]:1882", "--http", "localhost:8080"}, nil},
		{"every address with an auth file", []string{"--listen", ":1883", "--auth-file", authFile}, nil},
		{"every address with allow-anonymous", []string{"--listen", ":1883", "--ws-listen", "0.0.0.0:1882", "--allow-anonymous"}, func(t *testing.T, cfg Config) {
			require.True(t, cfg.AllowAnonymous)
		}},
		{"TLS on every address with an auth file", []string{"--tls-listen", ":8883", "--tls-cert", cert, "--tls-key", key, "--auth-file", authFile}, nil},
		{"HTTP beyond loopback with a token", []string{"--http", ":8080", "--http-token", token}, func(t *testing.T, cfg Config) {
			require.Equal(t, token, cfg.HTTPToken)
		}},
		{"HTTPS", []string{"--http-tls-cert", cert, "--http-tls-key", key}, func(t *testing.T, cfg Config) {
			require.Equal(t, cert, cfg.HTTPTLSCertFile)
			require.Equal(t, key, cfg.HTTPTLSKeyFile)
		}},
	}
	for emqx, ours := range EMQXStrategyAliases {
		tests = append(tests, struct {
			name  string
			args  []string
			check func(t *testing.T, cfg Config)
		}{"EMQX strategy " + emqx, []string{"--strategy", emqx}, func(t *testing.T, cfg Config) {
			full, err := cfg.withDefaults()
			require.NoError(t, err)
			require.Equal(t, ours, full.Strategy)
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadConfig(tt.args, nil, io.Discard, io.Discard)
			require.NoError(t, err)
			if tt.check != nil {
				tt.check(t, cfg)
			}
		})
	}
}

// TestEMQXStrategyAliasReachesTheEngine: a broker configured with an EMQX
// name runs the LuffyMQ strategy it stands for.
func TestEMQXStrategyAliasReachesTheEngine(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.Strategy = "round_robin" })
	require.Equal(t, "round-robin", b.Engine().StrategyName())
	require.Equal(t, "round-robin", b.Overview().Strategy)
}

// TestStartWarnsAboutAnonymousAccess: without an auth file the broker
// says, in one warning, that anonymous clients are accepted and where.
func TestStartWarnsAboutAnonymousAccess(t *testing.T) {
	for _, allow := range []bool{false, true} {
		logs := new(testenv.LockedBuffer)
		b := startBroker(t, func(c *Config) {
			c.AllowAnonymous = allow
			c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		})
		require.NoError(t, b.Close())
		var warnings []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") {
				warnings = append(warnings, line)
			}
		}
		require.Len(t, warnings, 1, logs.String())
		if allow {
			require.Contains(t, warnings[0], "every listener")
		} else {
			require.Contains(t, warnings[0], "loopback listeners only")
		}
	}
}
