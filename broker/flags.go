package broker

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/scoring"
)

// fileConfig is the YAML form of the command-line flags; keys are the flag
// names.
type fileConfig struct {
	Listen          *string  `yaml:"listen"`
	TLSListen       *string  `yaml:"tls-listen"`
	TLSCert         *string  `yaml:"tls-cert"`
	TLSKey          *string  `yaml:"tls-key"`
	WSListen        *string  `yaml:"ws-listen"`
	HTTP            *string  `yaml:"http"`
	Strategy        *string  `yaml:"strategy"`
	ReportInterval  *string  `yaml:"report-interval"`
	StaleAfter      *string  `yaml:"stale-after"`
	AuthFile        *string  `yaml:"auth-file"`
	MaxPacketSize   *int     `yaml:"max-packet-size"`
	RedispatchGrace *string  `yaml:"redispatch-grace"`
	WriteTimeout    *string  `yaml:"write-timeout"`
	MaxQueuedBytes  *int     `yaml:"max-queued-bytes"`
	ConnectTimeout  *string  `yaml:"connect-timeout"`
	MaxConns        *int     `yaml:"max-connections"`
	MaxConnsPerIP   *int     `yaml:"max-connections-per-ip"`
	LogLevel        *string  `yaml:"log-level"`
	AMQPURL         *string  `yaml:"amqp-url"`
	Site            *string  `yaml:"site"`
	Export          []string `yaml:"export"`
	ExportGroup     []string `yaml:"export-group"`
	AMQPManagement  *string  `yaml:"amqp-management-url"`
	DataDir         *string  `yaml:"data-dir"`
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// escapeLineBreaks writes line breaks in user input as \n and \r, so that
// every error stays one line.
var escapeLineBreaks = strings.NewReplacer("\n", `\n`, "\r", `\r`)

// ErrHelp is returned by ConfigFromArgs when -h or --help was given; the
// usage has been written.
var ErrHelp = flag.ErrHelp

// ConfigFromArgs builds a Config from command-line arguments and, with
// --config, a YAML file whose keys are the flag names (flags win). Logs go
// to logOutput. Errors are one line that names the bad input.
func ConfigFromArgs(args []string, usageOutput, logOutput io.Writer) (Config, error) {
	fs := flag.NewFlagSet("luffymq", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		configFile      = fs.String("config", "", "YAML file with any of these flags as keys; flags given on the command line win")
		listen          = fs.String("listen", ":1883", "MQTT over TCP address (empty disables)")
		tlsListen       = fs.String("tls-listen", "", "MQTT over TLS address, e.g. :8883 (needs --tls-cert and --tls-key)")
		tlsCert         = fs.String("tls-cert", "", "PEM certificate file for --tls-listen")
		tlsKey          = fs.String("tls-key", "", "PEM private key file for --tls-listen")
		wsListen        = fs.String("ws-listen", "", "MQTT over WebSocket address, e.g. :1882")
		httpListen      = fs.String("http", "127.0.0.1:8080", "HTTP address for the dashboard (/), /healthz, /api/v1/groups, /api/v1/overview and /metrics (empty disables)")
		strategy        = fs.String("strategy", "adaptive", "shared-subscription strategy: "+strings.Join(scoring.Strategies(), ", "))
		reportInterval  = fs.Duration("report-interval", scoring.DefaultReportInterval, "load-report interval announced to clients in CONNACK")
		staleAfter      = fs.Duration("stale-after", 0, "time without a report after which a member is stale (default 3 report intervals)")
		maxPacketSize   = fs.Int("max-packet-size", DefaultMaxPacketSize, "largest MQTT packet in bytes a client may send; a larger one ends its connection")
		connectTimeout  = fs.Duration("connect-timeout", DefaultConnectTimeout, "time a new connection has to send its whole CONNECT packet before it is closed (0 disables)")
		maxConns        = fs.Int("max-connections", 0, "most connections each MQTT listener holds at once; more are closed when accepted (0: no limit)")
		maxConnsPerIP   = fs.Int("max-connections-per-ip", 0, "most connections one source address holds at once over all MQTT listeners (0: no limit)")
		redispatchGrace = fs.Duration("redispatch-grace", 0, "time a disconnected persistent session of a shared-group member keeps its unacknowledged messages before they go to the rest of the group (0: until the session expires; clean sessions' go at once)")
		writeTimeout    = fs.Duration("write-timeout", pingreq.DefaultWriteTimeout, "time a client may accept no byte of what the broker sends before it is disconnected (negative disables)")
		maxQueuedBytes  = fs.Int("max-queued-bytes", pingreq.DefaultMaxQueuedBytes, "bytes queued for a slow client above which its QoS 0 messages are dropped (twice this disconnects it)")
		authFile        = fs.String("auth-file", "", "Mochi auth/ACL ledger file (YAML or JSON); empty allows anonymous access")
		logLevel        = fs.String("log-level", "info", "log level: debug, info, warn, error")
		amqpURL         = fs.String("amqp-url", "", "this site's RabbitMQ node, e.g. amqp://guest:guest@127.0.0.1:5672/; enables the multi-site bridge")
		amqpMgmt        = fs.String("amqp-management-url", "", "management API of this site's RabbitMQ node, e.g. http://127.0.0.1:15672; runs the site agent; needed by --export-group")
		site            = fs.String("site", "", "name of this site (letters, digits, '-', '_'); required with --amqp-url")
		dataDir         = fs.String("data-dir", "", "directory that keeps sessions, subscriptions, retained and in-flight QoS 1/2 messages across restarts (created if missing; empty keeps them in memory only)")
		exports         listFlag
		exportGroups    listFlag
	)
	fs.Var(&exports, "export", "MQTT filter shared with the other sites through RabbitMQ (repeatable or comma-separated), e.g. sensors/#")
	fs.Var(&exportGroups, "export-group", "shared subscription $share/<group>/<filter> served as a work queue wq.<group> across sites (repeatable; needs --amqp-management-url)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usageOutput)
			fmt.Fprintln(usageOutput, "Usage: luffymq [flags]\n\nLuffyMQ: an MQTT v5 broker whose shared subscriptions pick the member that will start each message soonest.\n\nFlags:")
			fs.PrintDefaults()
			return Config{}, ErrHelp
		}
		// The flag package echoes an unknown flag as given; keep the
		// error on one line whatever it contains.
		return Config{}, fmt.Errorf("%w: %s (run luffymq --help for the flags)", ErrInvalidConfig, escapeLineBreaks.Replace(err.Error()))
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q: luffymq takes only flags", ErrInvalidConfig, fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return Config{}, fmt.Errorf("%w: config file: %s", ErrInvalidConfig, escapeLineBreaks.Replace(err.Error()))
		}
		var fc fileConfig
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
			oneLine := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
			return Config{}, fmt.Errorf("%w: config file %s: %s", ErrInvalidConfig, *configFile, oneLine)
		}
		takeString := func(name string, dst *string, v *string) {
			if v != nil && !set[name] {
				*dst = *v
			}
		}
		takeDuration := func(name string, dst *time.Duration, v *string) error {
			if v == nil || set[name] {
				return nil
			}
			d, err := time.ParseDuration(*v)
			if err != nil {
				return fmt.Errorf("%w: config file %s: %s: %q is not a duration such as 500ms or 2s", ErrInvalidConfig, *configFile, name, *v)
			}
			*dst = d
			return nil
		}
		takeString("listen", listen, fc.Listen)
		takeString("tls-listen", tlsListen, fc.TLSListen)
		takeString("tls-cert", tlsCert, fc.TLSCert)
		takeString("tls-key", tlsKey, fc.TLSKey)
		takeString("ws-listen", wsListen, fc.WSListen)
		takeString("http", httpListen, fc.HTTP)
		takeString("strategy", strategy, fc.Strategy)
		takeString("auth-file", authFile, fc.AuthFile)
		takeString("log-level", logLevel, fc.LogLevel)
		if fc.MaxPacketSize != nil && !set["max-packet-size"] {
			*maxPacketSize = *fc.MaxPacketSize
		}
		if fc.MaxConns != nil && !set["max-connections"] {
			*maxConns = *fc.MaxConns
		}
		if fc.MaxConnsPerIP != nil && !set["max-connections-per-ip"] {
			*maxConnsPerIP = *fc.MaxConnsPerIP
		}
		if err := takeDuration("connect-timeout", connectTimeout, fc.ConnectTimeout); err != nil {
			return Config{}, err
		}
		if err := takeDuration("redispatch-grace", redispatchGrace, fc.RedispatchGrace); err != nil {
			return Config{}, err
		}
		if err := takeDuration("write-timeout", writeTimeout, fc.WriteTimeout); err != nil {
			return Config{}, err
		}
		if fc.MaxQueuedBytes != nil && !set["max-queued-bytes"] {
			*maxQueuedBytes = *fc.MaxQueuedBytes
		}
		takeString("amqp-url", amqpURL, fc.AMQPURL)
		takeString("site", site, fc.Site)
		takeString("amqp-management-url", amqpMgmt, fc.AMQPManagement)
		takeString("data-dir", dataDir, fc.DataDir)
		if fc.Export != nil && !set["export"] {
			exports = fc.Export
		}
		if fc.ExportGroup != nil && !set["export-group"] {
			exportGroups = fc.ExportGroup
		}
		if err := takeDuration("report-interval", reportInterval, fc.ReportInterval); err != nil {
			return Config{}, err
		}
		if err := takeDuration("stale-after", staleAfter, fc.StaleAfter); err != nil {
			return Config{}, err
		}
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return Config{}, fmt.Errorf("%w: log-level %q: choose debug, info, warn or error", ErrInvalidConfig, *logLevel)
	}
	if *reportInterval <= 0 {
		return Config{}, fmt.Errorf("%w: report-interval %v must be positive", ErrInvalidConfig, *reportInterval)
	}
	if *connectTimeout < 0 {
		return Config{}, fmt.Errorf("connect-timeout %v is negative (0 disables it)", *connectTimeout)
	}
	if *connectTimeout == 0 {
		*connectTimeout = -1 // Config's zero value means the default
	}
	cfg := Config{
		MQTTListen:        *listen,
		TLSListen:         *tlsListen,
		TLSCertFile:       *tlsCert,
		TLSKeyFile:        *tlsKey,
		WSListen:          *wsListen,
		HTTPListen:        *httpListen,
		Strategy:          *strategy,
		ReportInterval:    *reportInterval,
		StaleAfter:        *staleAfter,
		AuthFile:          *authFile,
		MaxPacketSize:     *maxPacketSize,
		AMQPURL:           *amqpURL,
		Site:              *site,
		Exports:           exports,
		ExportGroups:      exportGroups,
		AMQPManagementURL: *amqpMgmt,
		DataDir:           *dataDir,
		Logger:            slog.New(slog.NewTextHandler(logOutput, &slog.HandlerOptions{Level: level})),
	}
	cfg.ConnectTimeout, cfg.MaxConnections, cfg.MaxConnectionsPerIP = *connectTimeout, *maxConns, *maxConnsPerIP
	cfg.RedispatchGrace, cfg.WriteTimeout, cfg.MaxQueuedBytes = *redispatchGrace, *writeTimeout, *maxQueuedBytes
	if *writeTimeout == 0 {
		cfg.WriteTimeout = -1 // Config's zero value means the default
	}
	// Validate now so a bad value is reported before anything starts.
	if _, err := cfg.withDefaults(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}
