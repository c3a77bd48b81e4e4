package broker

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/clientsdk/report"
)

func TestConfigFromArgsDefaults(t *testing.T) {
	cfg, err := ConfigFromArgs(nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1883", cfg.MQTTListen)
	require.Equal(t, "127.0.0.1:8080", cfg.HTTPListen)
	require.Equal(t, "adaptive", cfg.Strategy)
	require.Equal(t, time.Second, cfg.ReportInterval)
	require.Empty(t, cfg.AuthFile)
}

func TestConfigFromArgsRejectsBadInputInOneLine(t *testing.T) {
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(badYAML, []byte("strategy: adaptive\nlisen: :1\n"), 0o600))
	badDuration := filepath.Join(dir, "dur.yaml")
	require.NoError(t, os.WriteFile(badDuration, []byte("report-interval: soon\n"), 0o600))
	bridged := []string{"--amqp-url", "amqp://127.0.0.1:1/", "--site", "berlin"}
	tests := []struct {
		name     string
		args     []string
		mentions string
	}{
		{"unknown strategy", []string{"--strategy", "fastest"}, `unknown strategy "fastest"`},
		{"bad duration", []string{"--report-interval", "1x"}, "report-interval"},
		{"zero interval", []string{"--report-interval", "0s"}, "report-interval"},
		{"unknown flag", []string{"--colour", "blue"}, "colour"},
		{"stray argument", []string{"extra"}, "unexpected argument"},
		{"tls without cert", []string{"--tls-listen", ":8883"}, "tls-cert"},
		{"no listener", []string{"--listen", ""}, "no MQTT listener"},
		{"bad log level", []string{"--log-level", "loud"}, "log-level"},
		{"tiny packet limit", []string{"--max-packet-size", "10"}, "max-packet-size"},
		{"missing config file", []string{"--config", filepath.Join(dir, "none.yaml")}, "config file"},
		{"unknown config key", []string{"--config", badYAML}, "lisen"},
		{"bad config duration", []string{"--config", badDuration}, "report-interval"},
		{"zero wq ttl", []string{"--wq-ttl-per-member", "0s"}, "wq-ttl-per-member 0s must be positive"},
		{"negative wq ttl", []string{"--wq-ttl-per-member", "-5ms"}, "wq-ttl-per-member -5ms must be positive"},
		{"sub-millisecond wq ttl", append(bridged, "--wq-ttl-per-member", "500us"), "wq-ttl-per-member 500µs: want 1ms or more"},
		{"zero wq max length", []string{"--wq-max-length-per-member", "0"}, "wq-max-length-per-member 0 must be positive"},
		{"wq max length not a number", []string{"--wq-max-length-per-member", "lots"}, "wq-max-length-per-member"},
		{"negative wq unacked", []string{"--wq-unacked-per-member", "-1"}, "wq-unacked-per-member -1 must be positive"},
		{"zero wq retune", []string{"--wq-retune-interval", "0s"}, "wq-retune-interval 0s must be positive"},
		{"tiny wq retune", append(bridged, "--wq-retune-interval", "1ms"), "wq-retune-interval 1ms: want 10ms or more"},
		{"zero wq state interval", []string{"--wq-state-interval", "0s"}, "wq-state-interval 0s must be positive"},
		{"tiny wq state interval", append(bridged, "--wq-state-interval", "5ms"), "wq-state-interval 5ms: want 10ms or more"},
		{"negative gc percent", []string{"--gc-percent", "-1"}, "gc-percent -1 must be 0 (Go's own setting) or from 10 to 10000"},
		{"huge gc percent", []string{"--gc-percent", "20000"}, "gc-percent 20000 must be 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ConfigFromArgs(tt.args, io.Discard, io.Discard)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.mentions)
			require.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

// TestConfigWorkQueueFlags: the --wq-* flags default to the bridge's
// defaults and reach Config.WorkQueue from the command line, the
// environment and the YAML file.
func TestConfigWorkQueueFlags(t *testing.T) {
	cfg, err := ConfigFromArgs(nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, bridge.DefaultTTLPerMember, cfg.WorkQueue.TTLPerMember)
	require.Equal(t, 500*time.Millisecond, cfg.WorkQueue.TTLPerMember, "today's value")
	require.Equal(t, 3000, cfg.WorkQueue.MaxLengthPerMember)
	require.Equal(t, 2, cfg.WorkQueue.UnackedPerMember)
	require.Equal(t, time.Second, cfg.WorkQueue.RetuneInterval)
	require.Equal(t, 100*time.Millisecond, cfg.WorkQueue.StateInterval)

	cfg, err = ConfigFromArgs([]string{"--wq-ttl-per-member", "50ms", "--wq-max-length-per-member", "300",
		"--wq-unacked-per-member", "1", "--wq-retune-interval", "100ms", "--wq-state-interval", "250ms"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 50*time.Millisecond, cfg.WorkQueue.TTLPerMember)
	require.Equal(t, 300, cfg.WorkQueue.MaxLengthPerMember)
	require.Equal(t, 1, cfg.WorkQueue.UnackedPerMember)
	require.Equal(t, 100*time.Millisecond, cfg.WorkQueue.RetuneInterval)
	require.Equal(t, 250*time.Millisecond, cfg.WorkQueue.StateInterval)

	file := filepath.Join(t.TempDir(), "luffymq.yaml")
	require.NoError(t, os.WriteFile(file, []byte("wq-ttl-per-member: 20ms\nwq-unacked-per-member: 4\n"), 0o600))
	cfg, err = LoadConfig([]string{"--config", file, "--wq-unacked-per-member", "3"}, []string{"LUFFYMQ_WQ_TTL_PER_MEMBER=30ms", "LUFFYMQ_WQ_RETUNE_INTERVAL=250ms"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 30*time.Millisecond, cfg.WorkQueue.TTLPerMember, "the environment wins over the file")
	require.Equal(t, 3, cfg.WorkQueue.UnackedPerMember, "the command line wins over the file")
	require.Equal(t, 250*time.Millisecond, cfg.WorkQueue.RetuneInterval)
	require.Equal(t, 3000, cfg.WorkQueue.MaxLengthPerMember)

	// A program that builds its Config itself gets the same checks.
	_, err = New(Config{MQTTListen: "127.0.0.1:0", AMQPURL: "amqp://127.0.0.1:1/", Site: "berlin", Logger: discardLogger(),
		WorkQueue: bridge.WorkQueueConfig{UnackedPerMember: -2}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "wq-unacked-per-member -2 is negative")
}

func TestConfigFileWithFlagsWinning(t *testing.T) {
	file := filepath.Join(t.TempDir(), "luffymq.yaml")
	require.NoError(t, os.WriteFile(file, []byte("strategy: thesis\nreport-interval: 500ms\nhttp: \"\"\nlisten: 127.0.0.1:1999\n"), 0o600))
	cfg, err := ConfigFromArgs([]string{"--config", file, "--strategy", "round-robin"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "round-robin", cfg.Strategy, "the flag wins")
	require.Equal(t, 500*time.Millisecond, cfg.ReportInterval, "from the file")
	require.Empty(t, cfg.HTTPListen, "the file can disable HTTP")
	require.Equal(t, "127.0.0.1:1999", cfg.MQTTListen)
}

func TestHelpIsNotAnError(t *testing.T) {
	var out bytes.Buffer
	_, err := ConfigFromArgs([]string{"--help"}, &out, io.Discard)
	require.True(t, errors.Is(err, ErrHelp))
	require.Contains(t, out.String(), "-report-interval duration")
	require.Contains(t, out.String(), "-strategy string")
}

func TestNewRejectsUnreadableFiles(t *testing.T) {
	_, err := New(Config{MQTTListen: "127.0.0.1:0", TLSListen: "127.0.0.1:0", TLSCertFile: "/nonexistent/cert.pem", TLSKeyFile: "/nonexistent/key.pem"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "/nonexistent/cert.pem")

	_, err = New(Config{MQTTListen: "127.0.0.1:0", AuthFile: "/nonexistent/auth.yaml"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "auth-file")

	bad := filepath.Join(t.TempDir(), "auth.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("auth: [not: {valid"), 0o600))
	_, err = New(Config{MQTTListen: "127.0.0.1:0", AuthFile: bad})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "not a valid auth ledger")
}

func TestStartReportsBusyAddress(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	b, err := New(Config{MQTTListen: taken.Addr().String(), Logger: discardLogger()})
	require.NoError(t, err)
	err = b.Start()
	require.Error(t, err)
	require.Contains(t, err.Error(), taken.Addr().String())
	require.NoError(t, b.Close())
}

func TestAuthFileRequiresCredentials(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`auth:
  - username: worker
    password: secret
    allow: true
acl:
  - username: worker
    filters:
      "$share/g/#": 1
`), 0o600))
	b := startBroker(t, func(c *Config) { c.AuthFile = file })

	// Anonymous: refused.
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc := &rawConn{t: t, conn: conn}
	rc.write(connectPacket("anon", "", ""))
	ack := rc.read()
	require.Equal(t, packets.CONNACK, ack.Type)
	require.Equal(t, byte(0x86), ack.Content.(*packets.Connack).ReasonCode, "bad user name or password")

	// With credentials: accepted, and the worker may report its load even
	// though the ACL does not list $luffy/load.
	conn, err = net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc = &rawConn{t: t, conn: conn}
	rc.write(connectPacket("w1", "worker", "secret"))
	ack = rc.read()
	require.Equal(t, byte(0), ack.Content.(*packets.Connack).ReasonCode)
	rc.subscribe("$share/g/jobs", 0)
	pub := packets.NewControlPacket(packets.PUBLISH)
	p := pub.Content.(*packets.Publish)
	p.Topic, p.QoS, p.PacketID, p.Payload = report.LoadTopic, 1, 7, []byte(`{"msgsInQueue": 5}`)
	rc.write(pub)
	puback := rc.read()
	require.Equal(t, packets.PUBACK, puback.Type)
	require.Equal(t, byte(0), puback.Content.(*packets.Puback).ReasonCode)
	m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
	require.True(t, ok)
	require.Equal(t, 5, m.ReportedPending)
}
