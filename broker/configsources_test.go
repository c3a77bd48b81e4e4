package broker

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// writeFile writes content to name in a new temporary directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// printConfig runs LoadConfig with --print-config and returns what it
// printed.
func printConfig(t *testing.T, args, environ []string) string {
	t.Helper()
	var out bytes.Buffer
	_, err := LoadConfig(append(args, "--print-config"), environ, &out, io.Discard)
	require.ErrorIs(t, err, ErrConfigPrinted)
	return out.String()
}

// TestConfigPrecedenceFileEnvironmentFlags: each setting comes from the
// source of highest precedence that sets it (file < LUFFYMQ_ environment
// < command line); a list comes whole from one source; LUFFYMQ_CONFIG
// names the file unless --config does.
func TestConfigPrecedenceFileEnvironmentFlags(t *testing.T) {
	file := writeFile(t, "luffymq.yaml", `
strategy: thesis
report-interval: 500ms
max-packet-size: 2048
max-connections: 7
export: [a/#, b]
amqp-url: amqp://127.0.0.1:5672/
site: from-file
`)
	environ := []string{
		"PATH=/usr/bin",
		"LUFFYMQ_CONFIG=" + file,
		"LUFFYMQ_STRATEGY=random",
		"LUFFYMQ_MAX_PACKET_SIZE=4096",
		"LUFFYMQ_EXPORT=c/#,d",
		"LUFFYMQ_SITE=from-env",
	}
	cfg, err := LoadConfig([]string{"--strategy", "sticky", "--site", "from-flag"}, environ, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "sticky", cfg.Strategy, "flag over environment and file")
	require.Equal(t, "from-flag", cfg.Site, "flag over environment and file")
	require.Equal(t, 4096, cfg.MaxPacketSize, "environment over file")
	require.Equal(t, []string{"c/#", "d"}, cfg.Exports, "the environment's list replaces the file's")
	require.Equal(t, 500*time.Millisecond, cfg.ReportInterval, "file over default")
	require.Equal(t, 7, cfg.MaxConnections, "file over default")
	require.Equal(t, "amqp://127.0.0.1:5672/", cfg.AMQPURL)
	require.Equal(t, 0, cfg.MaxConnectionsPerIP, "default")

	// Repeating a list flag on the command line adds; it replaces the
	// environment's list.
	cfg, err = LoadConfig([]string{"--export", "e", "--export", "f,g"}, environ, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"e", "f", "g"}, cfg.Exports)
	require.Equal(t, "random", cfg.Strategy, "environment over file")

	// --config wins over LUFFYMQ_CONFIG.
	other := writeFile(t, "other.yaml", "report-interval: 250ms\namqp-url: amqp://127.0.0.1:5673/\n")
	cfg, err = LoadConfig([]string{"--config", other}, environ, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, cfg.ReportInterval)
	require.Equal(t, 4096, cfg.MaxPacketSize, "still from the environment")
	require.Zero(t, cfg.MaxConnections, "the other file does not set it")

	// An empty environment value is a value: it disables HTTP.
	cfg, err = LoadConfig(nil, []string{"LUFFYMQ_HTTP="}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Empty(t, cfg.HTTPListen)
}

// TestConfigFromArgsReadsTheProcessEnvironment: the main's entry point
// sees LUFFYMQ_ variables.
func TestConfigFromArgsReadsTheProcessEnvironment(t *testing.T) {
	t.Setenv("LUFFYMQ_REPORT_INTERVAL", "750ms")
	cfg, err := ConfigFromArgs(nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 750*time.Millisecond, cfg.ReportInterval)
}

// TestPrintConfigIsTheConfigFile: --print-config prints every setting
// (the flag names, as the file's keys); the printed file, given back with
// --config or turned into LUFFYMQ_ variables, yields the same settings.
func TestPrintConfigIsTheConfigFile(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	args := []string{
		"--listen", "127.0.0.1:1999", "--ws-listen", "localhost:1882", "--http", "127.0.0.1:9090",
		"--allow-anonymous", "--strategy", "hash_topic", "--report-interval", "250ms", "--stale-after", "2s",
		"--max-packet-size", "2048", "--connect-timeout", "3s", "--max-connections", "10",
		"--max-connections-per-ip", "3", "--redispatch-grace", "1s", "--write-timeout", "10s",
		"--max-queued-bytes", "4096", "--log-level", "warn", "--data-dir", dataDir,
		"--amqp-url", "amqp://127.0.0.1:5672/", "--site", "berlin", "--export", "a/#,b/+",
		"--export-group", "$share/g/jobs", "--amqp-management-url", "http://127.0.0.1:15672",
	}
	printed := printConfig(t, args, nil)
	require.True(t, strings.HasPrefix(printed, "# luffymq effective configuration"), printed)

	var settings map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(printed), &settings))
	require.Equal(t, "127.0.0.1:1999", settings["listen"])
	require.Equal(t, "hash-topic", settings["strategy"], "the EMQX alias as the strategy it names")
	require.Equal(t, "250ms", settings["report-interval"])
	require.Equal(t, 2048, settings["max-packet-size"])
	require.Equal(t, true, settings["allow-anonymous"])
	require.Equal(t, []any{"a/#", "b/+"}, settings["export"])
	require.Equal(t, "", settings["auth-file"])
	require.Equal(t, "", settings["tls-listen"], "unset strings print as empty")
	require.Equal(t, "1s", settings["redispatch-grace"])
	for _, notASetting := range []string{"config", "print-config", "help"} {
		require.NotContains(t, settings, notASetting)
	}
	// Every flag the usage lists is printed.
	var usage bytes.Buffer
	_, err := LoadConfig([]string{"--help"}, nil, &usage, io.Discard)
	require.ErrorIs(t, err, ErrHelp)
	for _, line := range strings.Split(usage.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ = strings.Cut(name, " ")
			if name != "config" && name != "print-config" {
				require.Contains(t, settings, name, "print-config shows every flag")
			}
		}
	}

	// The printed file read back gives the same output.
	file := writeFile(t, "printed.yaml", printed)
	require.Equal(t, printed, printConfig(t, []string{"--config", file}, nil))

	// And so do the same settings as LUFFYMQ_ variables.
	var environ []string
	for key, value := range settings {
		var s string
		switch v := value.(type) {
		case []any:
			var items []string
			for _, item := range v {
				items = append(items, item.(string))
			}
			s = strings.Join(items, ",")
		default:
			b, err := yaml.Marshal(v)
			require.NoError(t, err)
			s = strings.Trim(strings.TrimSpace(string(b)), `"`)
		}
		environ = append(environ, EnvName(key)+"="+s)
	}
	require.Equal(t, printed, printConfig(t, nil, environ))
}

// TestPrintConfigRedactsSecrets: the HTTP token and URL passwords never
// appear in the printed configuration.
func TestPrintConfigRedactsSecrets(t *testing.T) {
	const token = "s3cret-token-0123456789"
	printed := printConfig(t, []string{
		"--amqp-url", "amqp://guest:amqp-pass@127.0.0.1:5672/", "--site", "s",
		"--amqp-management-url", "http://admin:mgmt-pass@127.0.0.1:15672",
	}, []string{"LUFFYMQ_HTTP_TOKEN=" + token})
	for _, secret := range []string{token, "amqp-pass", "mgmt-pass"} {
		require.NotContains(t, printed, secret)
	}
	var settings map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(printed), &settings))
	require.Equal(t, "<redacted>", settings["http-token"])
	require.Equal(t, "amqp://guest:xxxxx@127.0.0.1:5672/", settings["amqp-url"])
	require.Equal(t, "http://admin:xxxxx@127.0.0.1:15672", settings["amqp-management-url"])

	// Without a token there is nothing to redact.
	printed = printConfig(t, nil, nil)
	require.Contains(t, printed, "http-token: \"\"\n")
}

// TestPrintConfigValidatesFirst: a bad setting is an error, not printed.
func TestPrintConfigValidatesFirst(t *testing.T) {
	var out bytes.Buffer
	_, err := LoadConfig([]string{"--print-config", "--listen", "notaport"}, nil, &out, io.Discard)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Zero(t, out.Len())
}

// TestConfigSourceErrorsNameSourceKeyAndValue: a bad value from the file
// or the environment gives one line naming where it came from, the
// setting and the value.
func TestConfigSourceErrorsNameSourceKeyAndValue(t *testing.T) {
	tests := []struct {
		name     string
		file     string // content of the --config file, if any
		environ  []string
		mentions []string
	}{
		{"env bad duration", "", []string{"LUFFYMQ_REPORT_INTERVAL=soon"}, []string{"LUFFYMQ_REPORT_INTERVAL", "report-interval", `"soon"`, "duration"}},
		{"env bad number", "", []string{"LUFFYMQ_MAX_CONNECTIONS=many"}, []string{"LUFFYMQ_MAX_CONNECTIONS", `"many"`, "whole number"}},
		{"env bad bool", "", []string{"LUFFYMQ_ALLOW_ANONYMOUS=yes please"}, []string{"LUFFYMQ_ALLOW_ANONYMOUS", `"yes please"`, "true or false"}},
		{"env unknown variable", "", []string{"LUFFYMQ_LISTN=:1"}, []string{"LUFFYMQ_LISTN", "names no luffymq flag"}},
		{"env lower case", "", []string{"LUFFYMQ_listen=:1"}, []string{"LUFFYMQ_listen"}},
		{"env print-config", "", []string{"LUFFYMQ_PRINT_CONFIG=true"}, []string{"LUFFYMQ_PRINT_CONFIG", "command line"}},
		{"env bad value reaching validation", "", []string{"LUFFYMQ_STRATEGY=fastest"}, []string{"strategy", `"fastest"`}},
		{"env missing config file", "", []string{"LUFFYMQ_CONFIG=/nonexistent/luffymq.yaml"}, []string{"config file", "/nonexistent/luffymq.yaml"}},
		{"file unknown key", "strategy: adaptive\nlisen: :1\n", nil, []string{"config file", "line 2", `"lisen"`}},
		{"file key config", "config: other.yaml\n", nil, []string{`"config"`}},
		{"file key twice", "strategy: thesis\nstrategy: random\n", nil, []string{"line 2", "strategy is set twice"}},
		{"file bad duration", "report-interval: soon\n", nil, []string{"config file", "line 1", "report-interval", `"soon"`}},
		{"file bad number", "max-packet-size: 1e3\n", nil, []string{"max-packet-size", `"1e3"`, "whole number"}},
		{"file list for one value", "listen: [a, b]\n", nil, []string{"listen takes one value"}},
		{"file mapping value", "listen: {a: b}\n", nil, []string{"listen", "not a mapping"}},
		{"file not a mapping", "- listen\n", nil, []string{"mapping of flag names"}},
		{"file two documents", "strategy: thesis\n---\nstrategy: random\n", nil, []string{"more than one YAML document"}},
		{"file syntax", "site: [1, 2\n", nil, []string{"config file", "yaml"}},
		{"file secret not shown", "http-token: [a]\n", nil, []string{"http-token takes one value"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args []string
			if tt.file != "" {
				args = []string{"--config", writeFile(t, "luffymq.yaml", tt.file)}
			}
			_, err := LoadConfig(args, tt.environ, io.Discard, io.Discard)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
			require.NotContains(t, err.Error(), "\n", "one line")
			for _, m := range tt.mentions {
				require.Contains(t, err.Error(), m)
			}
		})
	}
}

// TestConfigFileValues: YAML's own forms are read as YAML means them, and
// an empty file sets nothing.
func TestConfigFileValues(t *testing.T) {
	file := writeFile(t, "luffymq.yaml", "max-packet-size: 0x800\nallow-anonymous: true\nlisten: :1883\nhttp:\nexport-group: &none []\n")
	cfg, err := LoadConfig([]string{"--config", file}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2048, cfg.MaxPacketSize)
	require.True(t, cfg.AllowAnonymous)
	require.Equal(t, ":1883", cfg.MQTTListen)
	require.Empty(t, cfg.HTTPListen, "a null value is empty")

	empty := writeFile(t, "empty.yaml", "# nothing\n")
	cfg, err = LoadConfig([]string{"--config", empty}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultMQTTListen, cfg.MQTTListen)
}
