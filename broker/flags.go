package broker

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

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

// Get returns the values (flag.Getter).
func (l *listFlag) Get() any { return []string(*l) }

// reset empties the list: a value from a source of higher precedence
// replaces the list, where repeating the flag on the command line adds.
func (l *listFlag) reset() { *l = nil }

// escapeLineBreaks writes line breaks in user input as \n and \r, so that
// every error stays one line.
var escapeLineBreaks = strings.NewReplacer("\n", `\n`, "\r", `\r`)

// ErrHelp is returned by ConfigFromArgs when -h or --help was given; the
// usage has been written.
var ErrHelp = flag.ErrHelp

// ConfigFromArgs builds a Config from command-line arguments, the
// process's LUFFYMQ_… environment variables and, with --config (or
// LUFFYMQ_CONFIG), a YAML file whose keys are the flag names: see
// LoadConfig.
func ConfigFromArgs(args []string, usageOutput, logOutput io.Writer) (Config, error) {
	return LoadConfig(args, os.Environ(), usageOutput, logOutput)
}

// LoadConfig builds a Config from three sources, each flag taking its
// value from the one of highest precedence that sets it: the YAML file
// named by --config or LUFFYMQ_CONFIG (keys are the flag names), then the
// environment variables LUFFYMQ_<FLAG> (upper case, '-' as '_', e.g.
// LUFFYMQ_REPORT_INTERVAL) among environ ("NAME=value" entries, as
// os.Environ gives), then the command line. A list flag (--export) takes
// its whole list from one source.
//
// Every value is validated, and the files the configuration names are
// read, before it returns: an error is one line naming the setting, its
// source and the value (a secret's value is never shown). With -h or
// --help it writes the usage to usageOutput and returns ErrHelp; with
// --print-config it writes the effective configuration as YAML (the
// file's keys, secrets redacted) to usageOutput and returns
// ErrConfigPrinted. The Config's logger writes to logOutput.
func LoadConfig(args, environ []string, usageOutput, logOutput io.Writer) (Config, error) {
	fs := flag.NewFlagSet("luffymq", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		configFile      = fs.String(configFlag, "", "YAML file with any of these flags as keys; LUFFYMQ_<FLAG> environment variables win over it, and flags on the command line over both")
		printConfig     = fs.Bool(printConfigFlag, false, "print the effective configuration as YAML (secrets redacted) and exit")
		listen          = fs.String("listen", DefaultMQTTListen, "MQTT over TCP address (empty disables); a non-loopback address such as :1883 needs --auth-file or --allow-anonymous")
		allowAnonymous  = fs.Bool("allow-anonymous", false, "accept clients without credentials on listeners other hosts can reach (without --auth-file, anonymous clients are accepted on loopback listeners only)")
		httpToken       = fs.String("http-token", "", "bearer token required on every HTTP request but /healthz (at least 16 characters; required when --http is not a loopback address; prefer LUFFYMQ_HTTP_TOKEN, which ps does not show)")
		httpTLSCert     = fs.String("http-tls-cert", "", "PEM certificate file: serve HTTP over TLS (needs --http-tls-key)")
		httpTLSKey      = fs.String("http-tls-key", "", "PEM private key file for --http-tls-cert")
		tlsListen       = fs.String("tls-listen", "", "MQTT over TLS address, e.g. :8883 (needs --tls-cert and --tls-key)")
		tlsCert         = fs.String("tls-cert", "", "PEM certificate file for --tls-listen")
		tlsKey          = fs.String("tls-key", "", "PEM private key file for --tls-listen")
		wsListen        = fs.String("ws-listen", "", "MQTT over WebSocket address, e.g. :1882")
		httpListen      = fs.String("http", "127.0.0.1:8080", "HTTP address for the dashboard (/), /healthz, /api/v1/groups, /api/v1/overview and /metrics (empty disables)")
		strategy        = fs.String("strategy", "adaptive", "shared-subscription strategy: "+strings.Join(scoring.Strategies(), ", ")+" (EMQX names such as round_robin and hash_clientid are accepted too)")
		reportInterval  = fs.Duration("report-interval", scoring.DefaultReportInterval, "load-report interval announced to clients in CONNACK")
		staleAfter      = fs.Duration("stale-after", 0, "time without a report after which a member is stale (default 3 report intervals)")
		maxPacketSize   = fs.Int("max-packet-size", DefaultMaxPacketSize, "largest MQTT packet in bytes a client may send; a larger one ends its connection")
		connectTimeout  = fs.Duration("connect-timeout", DefaultConnectTimeout, "time a new connection has to send its whole CONNECT packet before it is closed (0 disables)")
		maxConns        = fs.Int("max-connections", 0, "most connections each MQTT listener holds at once; more are closed when accepted (0: no limit)")
		maxConnsPerIP   = fs.Int("max-connections-per-ip", 0, "most connections one source address holds at once over all MQTT listeners (0: no limit)")
		redispatchGrace = fs.Duration("redispatch-grace", 0, "time a disconnected persistent session of a shared-group member keeps its unacknowledged messages before they go to the rest of the group (0: until the session expires; clean sessions' go at once)")
		writeTimeout    = fs.Duration("write-timeout", pingreq.DefaultWriteTimeout, "time a client may accept no byte of what the broker sends before it is disconnected (negative disables)")
		maxQueuedBytes  = fs.Int("max-queued-bytes", pingreq.DefaultMaxQueuedBytes, "bytes queued for a slow client above which its QoS 0 messages are dropped (twice this disconnects it)")
		authFile        = fs.String("auth-file", "", "Mochi auth/ACL ledger file (YAML or JSON); without it anonymous access is allowed on loopback listeners only (see --allow-anonymous)")
		logLevel        = fs.String("log-level", "info", "log level: debug, info, warn, error")
		amqpURL         = fs.String("amqp-url", "", "this site's RabbitMQ node, e.g. amqp://guest:guest@127.0.0.1:5672/; enables the multi-site bridge")
		amqpMgmt        = fs.String("amqp-management-url", "", "management API of this site's RabbitMQ node, e.g. http://127.0.0.1:15672; runs the site agent; needed by --export-group")
		site            = fs.String("site", "", "name of this site (letters, digits, '-', '_'); required with --amqp-url")
		brokerID        = fs.String("broker-id", "", "name of this broker among the brokers of its site sharing its RabbitMQ node (letters, digits, '-', '_'); default: host name and MQTT port (random hex digits for port 0)")
		dataDir         = fs.String("data-dir", "", "directory that keeps sessions, subscriptions, retained and in-flight QoS 1/2 messages across restarts (created if missing; empty keeps them in memory only)")
		exports         listFlag
		exportGroups    listFlag
	)
	ackTimeout := fs.Duration("ack-timeout", 0, "time a connected shared-group member may hold a QoS 1/2 message unacknowledged before it goes to another member of the group (0: never)")
	memoryTrimStep := fs.Int("memory-trim-connections", DefaultMemoryTrimStep, "after this many connections arrived, or the number connected moved by this many, and none arrived for a second, return the memory the broker freed to the OS (one garbage collection per connection storm); and while the broker allocates lightly, collect its garbage once it exceeds a quarter of the live heap and stacks. Negative: neither")
	maxPendingWrites := fs.Int("max-pending-writes", 0, "packets Mochi queues per client for its write loop before it drops publishes to that client (0: one per 16 KiB of --max-queued-bytes, 64 to 8192: 512 by default)")
	readBufferBytes := fs.Int("read-buffer-bytes", DefaultReadBufferBytes, fmt.Sprintf("bytes of the buffer each client's packets are read through, held for as long as the client is connected: smaller saves memory per idle device, larger saves system calls for a client that publishes fast (%d to %d)", MinReadBufferBytes, MaxReadBufferBytes))
	maxSessionMessages := fs.Int("max-session-messages", DefaultMaxSessionMessages, "most QoS 1/2 messages one session holds unacknowledged or waiting, its client connected or not; past it a delivery to the session is dropped and counted (luffymq_inflight_dropped_total), at most 65535")
	publisherPacing := fs.Bool("publisher-pacing", true, "make a publisher wait (at most --publisher-pacing-max-wait per delivery) before it hands a message to a client whose write queue is 3/4 full while that client drains it, so TCP slows the publisher instead of the client's messages being dropped; a client that reads nothing never makes anyone wait")
	publisherPacingMaxWait := fs.Duration("publisher-pacing-max-wait", hooks.DefaultPacingMaxWait, "with --publisher-pacing: the longest a publisher waits for one delivery (at most 1s)")
	holdLead := fs.Duration("hold-lead", DefaultHoldLead, "experimental late binding (adaptive strategy), e.g. 5ms: while every member of a group is predicted busy for longer than this, messages wait at the broker and go to whoever is then predicted to start them soonest; should exceed the members' one-way network delay (0: off, the default; always off with --data-dir)")
	metricsMaxMembers := fs.Int("metrics-max-members", hooks.DefaultMetricsMaxMembers, "most shared-group members (group and client pairs) with Prometheus series of their own; the others are summed per group under client_id=\"_other\"")
	fsync := fs.Bool("fsync", false, "with --data-dir: write each accepted QoS 1/2 publish to disk (fsync) before acknowledging it, so a power cut loses nothing acknowledged (slower; without it a killed broker loses nothing, a power cut may lose the last writes)")
	gcPercent := fs.Int("gc-percent", defaultGCPercent(environ), "the Go garbage collector's target the broker sets at start (GOGC): a higher value trades memory for throughput; 0 leaves Go's own setting; the default is 200, or 0 when the GOGC environment variable is set. For a ceiling on memory, set GOMEMLIMIT as well")
	pprofOn := fs.Bool("pprof", false, "serve Go runtime profiles (heap, CPU, goroutines) under /debug/pprof/ on --http, behind the same access rule as the API")
	discardHeld := fs.Bool("federation-discard-held", false, "when a configuration message removes a federation link (its exchange's sync site moved), delete the messages the old link still holds on its upstream instead of conserving them; by default the upstream's site agent re-publishes them into their exchange so they follow the new links (no loss, a short delay for those messages); discarding is the thesis's setting without conservation: no delay, but those messages are lost")
	federationMaxHops := fs.Int("federation-max-hops", 2, "federation links the site agent creates from configuration messages let a message cross this many links: luffy-controller's plans send a message from its site to the exchange's sync site and on to the others, two links")
	wqTTL := fs.Duration("wq-ttl-per-member", bridge.DefaultTTLPerMember, "with --export-group: eq. 2.12's C for the work queue's message TTL, per available member; a message waits in wq.<group> at most about this times the site's available members before it overflows to the dead-letter exchange (and possibly another site)")
	wqMaxLength := fs.Int("wq-max-length-per-member", bridge.DefaultMaxLengthPerMember, "with --export-group: eq. 2.12's C for the work queue's max length, in messages per available member (also the scale of the site's overflow weight, eq. 2.13)")
	wqTTLOnly := fs.Bool("wq-ttl-overflow-only", false, "with --export-group: keep the thesis's rule, a local publish always waits in wq.<group> until its TTL expires before it overflows; by default a publish that the local members would not start within the TTL overflows at once")
	wqRoute := fs.String("wq-route", bridge.RouteNearest, "with --export-group: where a local publish that leaves the site goes: nearest (each site publishes its group state about every 100 ms over federation while another site asks for it, and a publish goes straight to the site whose members would start it soonest, one-way delay included, or waits in the work queue (TTL 10 s) until another site's state shows members that would start it sooner; the ring stays for TTL expiries and while no state is fresh) or ring (the thesis's routing: the dead-letter exchange's consistent-hash ring, by eq. 2.13's weights, once the local members would not start it within the TTL); no effect with --wq-ttl-overflow-only")
	wqUnacked := fs.Int("wq-unacked-per-member", bridge.DefaultUnackedPerMember, "with --export-group: most work-queue messages taken from RabbitMQ and not yet acknowledged, per online member")
	wqStateInterval := fs.Duration("wq-state-interval", bridge.DefaultStateInterval, "with --export-group and --wq-route nearest: how often at most a broker publishes its group state to the other sites while it changes (every 5 intervals while it does not, 10 to other sites; a state older than 25 intervals is stale); shorter gives fresher predictions for more WAN messages (10ms or more)")
	wqRetune := fs.Duration("wq-retune-interval", bridge.DefaultRetuneInterval, "with --export-group: how often the work queue's TTL, max length and overflow weights are recomputed from the members' load (10ms or more)")
	fs.Var(&exports, "export", "MQTT filter shared with the other sites through RabbitMQ (repeatable or comma-separated), e.g. sensors/#")
	fs.Var(&exportGroups, "export-group", "shared subscription $share/<group>/<filter> served as a work queue wq.<group> across sites (repeatable; needs --amqp-management-url)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usageOutput)
			fmt.Fprintln(usageOutput, "Usage: luffymq [flags]\n\nLuffyMQ: an MQTT v5 broker whose shared subscriptions pick the member that will start each message soonest.\n\nEvery flag but --print-config can also be set in the --config YAML file (key: the flag name)\nand, but --config, by the environment variable LUFFYMQ_<FLAG> (e.g. LUFFYMQ_REPORT_INTERVAL=500ms);\nthe environment wins over the file, the command line over both.\n\nFlags:")
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
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })

	fromEnv, err := environmentSettings(fs, environ)
	if err != nil {
		return Config{}, err
	}
	if v, ok := fromEnv[configFlag]; ok && !onCommandLine[configFlag] {
		*configFile = v.value
	}
	if *configFile != "" {
		if err := applyConfigFile(fs, *configFile, onCommandLine); err != nil {
			return Config{}, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(fromEnv)) {
		if name == configFlag || onCommandLine[name] {
			continue
		}
		v := fromEnv[name]
		if err := setFromSource(fs, name, v.value, "environment variable "+v.variable); err != nil {
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
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"wq-ttl-per-member", *wqTTL}, {"wq-retune-interval", *wqRetune}, {"wq-state-interval", *wqStateInterval}} {
		if d.value <= 0 {
			return Config{}, fmt.Errorf("%w: %s %v must be positive", ErrInvalidConfig, d.name, d.value)
		}
	}
	for _, n := range []struct {
		name  string
		value int
	}{{"wq-max-length-per-member", *wqMaxLength}, {"wq-unacked-per-member", *wqUnacked}} {
		if n.value <= 0 {
			return Config{}, fmt.Errorf("%w: %s %d must be positive", ErrInvalidConfig, n.name, n.value)
		}
	}
	if *connectTimeout < 0 {
		return Config{}, fmt.Errorf("%w: connect-timeout %v is negative (0 disables it)", ErrInvalidConfig, *connectTimeout)
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
		AllowAnonymous:    *allowAnonymous,
		HTTPToken:         *httpToken,
		HTTPTLSCertFile:   *httpTLSCert,
		HTTPTLSKeyFile:    *httpTLSKey,
		MaxPacketSize:     *maxPacketSize,
		AMQPURL:           *amqpURL,
		Site:              *site,
		BrokerID:          *brokerID,
		Exports:           exports,
		ExportGroups:      exportGroups,
		AMQPManagementURL: *amqpMgmt,
		DataDir:           *dataDir,
		Logger:            slog.New(slog.NewTextHandler(logOutput, &slog.HandlerOptions{Level: level})),
	}
	cfg.ConnectTimeout, cfg.MaxConnections, cfg.MaxConnectionsPerIP = *connectTimeout, *maxConns, *maxConnsPerIP
	cfg.RedispatchGrace, cfg.WriteTimeout, cfg.MaxQueuedBytes = *redispatchGrace, *writeTimeout, *maxQueuedBytes
	cfg.MemoryTrimStep = *memoryTrimStep
	cfg.MetricsMaxMembers = *metricsMaxMembers
	cfg.Pprof = *pprofOn
	cfg.GCPercent = *gcPercent
	cfg.WorkQueue.Federation.DiscardHeldOnMove = *discardHeld
	cfg.WorkQueue.Federation.MaxHops = *federationMaxHops
	cfg.WorkQueue.TTLPerMember, cfg.WorkQueue.MaxLengthPerMember = *wqTTL, *wqMaxLength
	cfg.WorkQueue.UnackedPerMember, cfg.WorkQueue.RetuneInterval = *wqUnacked, *wqRetune
	cfg.WorkQueue.TTLOverflowOnly = *wqTTLOnly
	cfg.WorkQueue.Route, cfg.WorkQueue.StateInterval = *wqRoute, *wqStateInterval
	cfg.Fsync = *fsync
	cfg.HoldLead = *holdLead
	cfg.AckTimeout = *ackTimeout
	cfg.MaxPendingWrites = *maxPendingWrites
	cfg.MaxSessionMessages = *maxSessionMessages
	cfg.ReadBufferBytes = *readBufferBytes
	if *publisherPacingMaxWait <= 0 {
		return Config{}, fmt.Errorf("%w: publisher-pacing-max-wait %v must be positive (--publisher-pacing=false turns pacing off)", ErrInvalidConfig, *publisherPacingMaxWait)
	}
	cfg.PublisherPacingMaxWait = *publisherPacingMaxWait
	if !*publisherPacing {
		cfg.PublisherPacingMaxWait = -1 // Config's zero value means the default
	}
	if *writeTimeout == 0 {
		cfg.WriteTimeout = -1 // Config's zero value means the default
	}
	// Validate now, files included, so a bad value is reported before
	// anything starts.
	effective, err := cfg.withDefaults()
	if err != nil {
		return Config{}, err
	}
	if err := cfg.checkFiles(); err != nil {
		return Config{}, err
	}
	if *printConfig {
		_ = fs.Set("strategy", effective.Strategy) // an EMQX alias, as the strategy it names
		if err := writeEffectiveConfig(usageOutput, fs); err != nil {
			return Config{}, fmt.Errorf("print-config: %w", err)
		}
		return Config{}, ErrConfigPrinted
	}
	return cfg, nil
}
