package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// fuzzArgs splits a fuzz string into an argument list at NUL bytes. It
// reports false for lists that name --config or --data-dir: FuzzConfigFile
// gives the configuration file itself, and a data directory is created
// when the configuration is validated, which a fuzzer must not do with
// arbitrary paths.
func fuzzArgs(argv string) ([]string, bool) {
	if argv == "" {
		return nil, true
	}
	args := strings.Split(argv, "\x00")
	for _, a := range args {
		if strings.Contains(a, "config") || strings.Contains(a, "data-dir") {
			return nil, false
		}
	}
	return args, true
}

// checkConfigResult checks what ConfigFromArgs returned for args: a
// configuration that validates, or a one-line error that is the help
// request or a configuration error (flag syntax errors included).
func checkConfigResult(t *testing.T, args []string, cfg Config, err error) {
	t.Helper()
	if err == nil {
		if _, verr := cfg.withDefaults(); verr != nil {
			t.Fatalf("accepted a configuration that does not validate: %v", verr)
		}
		if cfg.Logger == nil {
			t.Fatal("accepted configuration has no logger")
		}
		return
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\n\r") {
		t.Fatalf("error is not one line: %q", msg)
	}
	if !errors.Is(err, ErrHelp) && !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("error %q does not wrap ErrInvalidConfig", msg)
	}
}

// FuzzConfigFromArgs: any argument list gives either a configuration that
// passes validation, or a one-line error that is the help request, a flag
// syntax error or a configuration error. The same arguments always give
// the same result.
func FuzzConfigFromArgs(f *testing.F) {
	for _, args := range [][]string{
		nil,
		{"--strategy", "thesis", "--report-interval", "500ms"},
		{"-listen=", "--ws-listen", ":1882", "--http", ""},
		{"--tls-listen", ":8883", "--tls-cert", "c.pem"},
		{"--amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "--site", "berlin", "--export", "sensors/#,a/+/b"},
		{"--amqp-url", "amqp://127.0.0.1/", "--site", "x", "--export-group", "$share/g/jobs", "--amqp-management-url", "http://127.0.0.1:15672"},
		{"--max-packet-size", "63"},
		{"--log-level", "loud"},
		{"--report-interval=-1s"},
		{"--stale-after", "-1s", "extra"},
		{"-h"},
		{"--export", "$SYS/#", "--amqp-url", "amqp://h/", "--site", "s"},
	} {
		f.Add(strings.Join(args, "\x00"))
	}
	f.Fuzz(func(t *testing.T, argv string) {
		args, ok := fuzzArgs(argv)
		if !ok {
			return
		}
		var usage bytes.Buffer
		cfg, err := ConfigFromArgs(args, &usage, io.Discard)
		checkConfigResult(t, args, cfg, err)
		if errors.Is(err, ErrHelp) != (usage.Len() > 0) {
			t.Fatalf("usage written (%d bytes) but error %v", usage.Len(), err)
		}
		again, err2 := ConfigFromArgs(args, io.Discard, io.Discard)
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("second parse: %v, first: %v", err2, err)
		}
		cfg.Logger, again.Logger = nil, nil
		if err == nil && !configsEqual(cfg, again) {
			t.Fatalf("second parse gave %+v, first %+v", again, cfg)
		}
	})
}

func configsEqual(a, b Config) bool {
	return strings.Join(a.Exports, "\x00") == strings.Join(b.Exports, "\x00") &&
		strings.Join(a.ExportGroups, "\x00") == strings.Join(b.ExportGroups, "\x00") &&
		a.MQTTListen == b.MQTTListen && a.Strategy == b.Strategy && a.ReportInterval == b.ReportInterval &&
		a.StaleAfter == b.StaleAfter && a.MaxPacketSize == b.MaxPacketSize && a.AMQPURL == b.AMQPURL && a.Site == b.Site
}

// FuzzConfigFile: any YAML file given with --config, with or without
// other flags, gives a configuration that validates or a one-line error;
// without flags, the values the file sets are the configuration's.
func FuzzConfigFile(f *testing.F) {
	f.Add([]byte("strategy: thesis\nreport-interval: 500ms\nhttp: \"\"\nlisten: 127.0.0.1:1999\n"), "")
	f.Add([]byte("strategy: thesis\n"), "--strategy\x00round-robin")
	f.Add([]byte("lisen: :1\n"), "")
	f.Add([]byte("report-interval: soon\n"), "")
	f.Add([]byte("max-packet-size: 1e3\n"), "")
	f.Add([]byte("export: [a/#, b]\namqp-url: amqp://h/\nsite: s\n"), "")
	f.Add([]byte("export: a/#\n"), "")
	f.Add([]byte("site: [1, 2\n"), "")
	f.Add([]byte("a: &a [*a, *a]\n"), "")
	f.Add([]byte("---\nstrategy: thesis\n---\nstrategy: bogus\n"), "")
	// One file, rewritten for every input: a directory per input cost
	// more than the rest of an iteration. Inputs run one at a time in a
	// fuzz worker, and each worker is its own process with its own f.
	path := filepath.Join(f.TempDir(), "luffymq.yaml")
	f.Fuzz(func(t *testing.T, content []byte, argv string) {
		args, ok := fuzzArgs(argv)
		if !ok {
			return
		}
		// The file is decoded as a plain mapping, to skip files that name
		// a data directory (see fuzzArgs) and to compare values.
		var fc map[string]any
		decodeErr := yaml.Unmarshal(content, &fc)
		if _, ok := fc["data-dir"]; decodeErr == nil && ok {
			return
		}
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
		cfg, err := ConfigFromArgs(args, io.Discard, io.Discard)
		checkConfigResult(t, args, cfg, err)
		if err != nil || len(args) > 2 {
			return // refused, or flags that win over the file
		}
		if decodeErr != nil {
			t.Fatalf("accepted a file that does not decode: %v", decodeErr)
		}
		for key, got := range map[string]string{
			"strategy": cfg.Strategy,
			"listen":   cfg.MQTTListen,
			"http":     cfg.HTTPListen,
			"site":     cfg.Site,
			"amqp-url": cfg.AMQPURL,
		} {
			want, isString := fc[key].(string)
			if !isString || want == got {
				continue
			}
			if r, err := resolveStrategy(want); key == "strategy" && err == nil && r == got {
				continue // an EMQX alias
			}
			t.Fatalf("the file's %s is %q, the configuration's %q (file %q)", key, want, got, content)
		}
		if want, isInt := fc["max-packet-size"].(int); isInt && want != cfg.MaxPacketSize {
			t.Fatalf("the file's max-packet-size is %d, the configuration's %d", want, cfg.MaxPacketSize)
		}
		if exports, set := fc["export"].([]any); set {
			var want []string
			for _, e := range exports {
				if s := fmt.Sprint(e); s != "" {
					want = append(want, s)
				}
			}
			if strings.Join(want, "\x00") != strings.Join(cfg.Exports, "\x00") {
				t.Fatalf("the file's export is %q, the configuration's %q", want, cfg.Exports)
			}
		}
	})
}

// FuzzAuthFile: New accepts an auth file exactly when Mochi's ledger
// parser does, and refuses any other with an error wrapping
// ErrInvalidConfig that names the file.
func FuzzAuthFile(f *testing.F) {
	f.Add([]byte("auth:\n  - username: alice\n    password: secret\n    allow: true\nacl:\n  - username: alice\n    filters:\n      'jobs/#': 3\n"))
	f.Add([]byte(`{"auth":[{"username":"bob","password":"pw","allow":true}],"acl":[{"filters":{"#":1}}]}`))
	f.Add([]byte("auth: 3\n"))
	f.Add([]byte(`{"auth": [`))
	f.Add([]byte("acl:\n  - filters:\n      'a/#': 9\n"))
	f.Add([]byte(""))
	// One file, rewritten for every input (see FuzzConfigFile).
	path := filepath.Join(f.TempDir(), "auth.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		ledgerErr := new(auth.Ledger).Unmarshal(bytes.Clone(data))
		b, err := New(Config{MQTTListen: "127.0.0.1:0", AuthFile: path, Logger: discardLogger()})
		if err == nil {
			_ = b.Close()
		}
		switch {
		case ledgerErr == nil && err != nil:
			t.Fatalf("New refused a ledger Mochi parses: %v", err)
		case ledgerErr != nil && err == nil:
			t.Fatalf("New accepted a ledger Mochi refuses (%v)", ledgerErr)
		case err != nil && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), path)):
			t.Fatalf("error %v must wrap ErrInvalidConfig and name %s", err, path)
		}
	})
}

// TestMalformedRemainingLengthEndsConnection is the broker-level check of
// FuzzConnReadMalformedLength's property: a remaining length with a fourth
// continuation byte ends the connection, even one Mochi would read as a
// valid PINGREQ (80 80 80 80 00), and other clients are unaffected.
func TestMalformedRemainingLengthEndsConnection(t *testing.T) {
	b := startBroker(t, nil)
	for _, header := range [][]byte{
		{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00},
		{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01},
	} {
		conn, err := net.Dial("tcp", b.MQTTAddr())
		require.NoError(t, err)
		rc, _ := dialRaw(t, conn, "w1")
		rc.writeBytes(append(header, 0xC0, 0x00))
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		for {
			cp, err := packets.ReadPacket(conn)
			if err != nil {
				var netErr net.Error
				require.False(t, errors.As(err, &netErr) && netErr.Timeout(), "% x: connection closed, not left waiting: %v", header, err)
				break
			}
			require.NotEqual(t, packets.PINGRESP, cp.Type, "% x: the stream after the bad length was read", header)
		}
	}
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "w2")
	rc.writeBytes([]byte{0xC0, 0x00})
	require.Equal(t, packets.PINGRESP, rc.read().Type)
}
