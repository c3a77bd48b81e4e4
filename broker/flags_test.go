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
