package broker

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// DefaultMaxSessionMessages is Mochi's own bound on a session's QoS≥1
// messages (8192).
const DefaultMaxSessionMessages = 8192

// MaxSessionMessagesLimit bounds --max-session-messages: Mochi numbers a
// session's messages with MQTT's 16-bit packet identifiers when it queues
// them.
const MaxSessionMessagesLimit = 65535

// MaxPendingWritesLimit bounds --max-pending-writes: Mochi makes each
// client's queue (8 bytes a slot) when the client connects.
const MaxPendingWritesLimit = 1 << 20

// The read buffer of every client (ReadBufferBytes), by default Mochi's
// own 2 KiB. 512 bytes saved 1.4 KiB of RSS per idle device at 10 000
// connections; whether it slows thesis-2's SDK members is not settled
// (docs/operating.md), so the default is Mochi's.
const (
	DefaultReadBufferBytes = 2048
	MinReadBufferBytes     = 64
	MaxReadBufferBytes     = 1 << 20
)

// Mochi's write queue, when MaxPendingWrites is 0, has a slot for every
// pendingWriteSlotBytes of the outbox (MaxQueuedBytes), within
// [minPendingWrites, Mochi's default]: 512 for the default 8 MiB
// (256 dropped 21 and 164 of the 150 000 messages of luffy-bench
// reliability's QoS 0 burst in 2 of 3 runs; 512 none in 3).
//
// The queue only hands packets to the client's write loop, which moves
// each one into the connection's outbox at once (pingreq.Conn's Write
// never blocks); the outbox bounds the bytes a client may have waiting. So
// the queue fills only while the write loop waits for a CPU, and
// publisher pacing holds publishers at 3/4 of it. Mochi makes the queue
// (8 bytes a slot) for every client when it connects: its default, 8192,
// reserved 64 KiB per client, touched whenever the memory had been used
// before (reconnecting clients).
const (
	pendingWriteSlotBytes = 16 << 10
	minPendingWrites      = 64
)

// PendingWritesFor returns the size of Mochi's per-client write queue for
// an outbox of maxQueuedBytes, when --max-pending-writes is 0.
func PendingWritesFor(maxQueuedBytes int) int {
	if maxQueuedBytes <= 0 {
		maxQueuedBytes = pingreq.DefaultMaxQueuedBytes
	}
	return min(max(maxQueuedBytes/pendingWriteSlotBytes, minPendingWrites), int(mqtt.NewDefaultServerCapabilities().MaximumClientWritesPending))
}

// Config describes a broker to build. The zero value of an optional field
// takes the default shown.
type Config struct {
	// MQTTListen is the plain TCP MQTT address ("127.0.0.1:1883"; empty
	// disables). Without AuthFile or AllowAnonymous every MQTT listener
	// must be on a loopback address (see checkListenersAndAccess).
	MQTTListen string
	// TLSListen is the MQTT-over-TLS address (empty disables); it needs
	// TLSCertFile and TLSKeyFile (PEM).
	TLSListen   string
	TLSCertFile string
	TLSKeyFile  string
	// WSListen is the MQTT-over-WebSocket address (empty disables).
	WSListen string
	// HTTPListen serves the dashboard (/), /healthz, /api/v1/groups,
	// /api/v1/overview and /metrics (empty disables).
	HTTPListen string
	// Strategy is the shared-subscription strategy ("adaptive").
	Strategy string
	// ReportInterval is the load-report interval announced to clients (1 s).
	ReportInterval time.Duration
	// StaleAfter is how long without a report makes a member stale
	// (3 report intervals).
	StaleAfter time.Duration
	// MaxPacketSize is the largest MQTT packet in bytes a client may send
	// (1 MiB); a larger one ends its connection before it is read.
	MaxPacketSize int
	// ConnectTimeout is how long a new connection has to send its whole
	// CONNECT packet before it is closed (5 s); negative disables it.
	ConnectTimeout time.Duration
	// MaxConnections is the most connections each MQTT listener holds at
	// once; more are closed when accepted (0: no limit).
	MaxConnections int
	// MaxConnectionsPerIP is the most connections one source address holds
	// at once over all MQTT listeners; more are closed when accepted (0: no
	// limit).
	MaxConnectionsPerIP int
	// RedispatchGrace is how long a disconnected persistent session of a
	// shared-group member keeps its unacknowledged messages before they go
	// to the rest of the group (0: until the session expires). Clean
	// sessions' messages go at once.
	RedispatchGrace time.Duration
	// AckTimeout, positive, is how long a connected shared-group member
	// may hold a QoS 1/2 delivery unacknowledged (no PUBACK, no PUBREC)
	// before it goes to another member of the group (see
	// hooks.AckTimeoutHook). 0, the default, never takes it away.
	AckTimeout time.Duration
	// WriteTimeout: a client that accepts no byte for this long is
	// disconnected (30 s; negative disables).
	WriteTimeout time.Duration
	// MaxQueuedBytes is the per-client outbox above which QoS 0 publishes
	// to it are dropped and counted (8 MiB); above twice this, the client
	// is disconnected, its session keeping its QoS≥1 messages.
	MaxQueuedBytes int
	// MemoryTrimStep: once this many connections arrived, or the number
	// connected moved by this many, and no connection arrived for a
	// second, the broker returns the memory it freed to the OS (see
	// memtrim.go). 0 selects DefaultMemoryTrimStep; negative never trims.
	MemoryTrimStep int
	// MaxPendingWrites is Mochi's per-client queue of packets waiting for
	// the client's write loop (Capabilities.MaximumClientWritesPending);
	// a publish to a client whose queue is full is dropped and counted
	// (messages_dropped). 0 sizes it from MaxQueuedBytes (see
	// PendingWritesFor: 512 for the default 8 MiB).
	MaxPendingWrites int
	// ReadBufferBytes sizes the buffer Mochi reads each client's packets
	// through (Options.ClientNetReadBufferSize), allocated when the
	// client connects and kept while it stays. 0 selects
	// DefaultReadBufferBytes; from MinReadBufferBytes to
	// MaxReadBufferBytes.
	ReadBufferBytes int
	// MaxSessionMessages is the most QoS≥1 messages one session holds
	// unacknowledged or waiting, its client connected or not (Mochi's
	// Capabilities.MaximumInflight); a delivery past it is dropped and
	// counted (luffymq_inflight_dropped_total), its publisher still
	// acknowledged. 0 selects DefaultMaxSessionMessages; at most
	// MaxSessionMessagesLimit.
	MaxSessionMessages int
	// PublisherPacingMaxWait is the longest a publisher waits, per
	// delivery, for a client whose write queue (MaxPendingWrites) is 3/4
	// full while the client drains it (see hooks.PacingHook): waiting
	// slows the publisher through TCP instead of dropping the client's
	// messages. 5 ms when zero; negative turns publisher pacing off.
	PublisherPacingMaxWait time.Duration
	// AuthFile is a Mochi auth/ACL ledger (YAML or JSON). Empty allows
	// anonymous access, with a warning, on loopback listeners only unless
	// AllowAnonymous is set.
	AuthFile string
	// AllowAnonymous lets clients connect without credentials on
	// listeners bound to non-loopback addresses too (no AuthFile). Without
	// it, such a listener is refused, as Mosquitto 2 does.
	AllowAnonymous bool
	// HTTPToken, set, is required on every HTTP request but GET /healthz,
	// as "Authorization: Bearer <token>" (or as the password of HTTP Basic
	// authentication, so a browser can open the dashboard). It is required
	// when HTTPListen is not a loopback address.
	HTTPToken string
	// HTTPTLSCertFile and HTTPTLSKeyFile (PEM), both set, serve the HTTP
	// API and dashboard over TLS.
	HTTPTLSCertFile string
	HTTPTLSKeyFile  string
	// HoldLead turns on late binding for the adaptive strategy (see
	// scoring.Config.HoldLead and hooks/latebinding.go): while every member
	// of a group is predicted busy for longer than HoldLead, messages wait
	// at the broker. 0 turns it off; it is off with DataDir, because held
	// messages are not stored.
	HoldLead time.Duration
	// MetricsMaxMembers is the most shared-group members (group and
	// client pairs) given Prometheus series of their own (1000); the others
	// are summed per group under client_id="_other".
	MetricsMaxMembers int
	// Pprof serves Go's runtime profiles under /debug/pprof/ on the HTTP
	// listener, behind the same access rule as the API (HTTPToken beyond
	// loopback). Off by default.
	Pprof bool
	// GCPercent is the Go garbage collector's target (GOGC) that
	// ApplyRuntimeSettings sets: 0 leaves the runtime's own (the GOGC
	// environment variable, or 100). The command's default is
	// DefaultGCPercent.
	GCPercent int
	// Logger receives the broker's logs (slog.Default()).
	Logger *slog.Logger
	// Clock drives the selection engine (the system clock).
	Clock scoring.Clock
	// AMQPURL is this site's RabbitMQ node; set, it enables the site
	// bridge (see package bridge). Empty runs a stand-alone broker.
	AMQPURL string
	// Site names this site for the bridge; required with AMQPURL.
	Site string
	// BrokerID names this broker among the brokers of its site that share
	// the site's RabbitMQ node (see bridge.Config.BrokerID). Empty derives
	// it once at start: bridge.DefaultBrokerID of the first MQTT listener
	// (host name and port, or random hex digits for port 0).
	BrokerID string
	// Exports are the MQTT filters shared with the other sites.
	Exports []string
	// ExportGroups are shared subscriptions ($share/<g>/<filter>) served
	// as work queues across sites; they need AMQPManagementURL.
	ExportGroups []string
	// AMQPManagementURL is the management API of the site's RabbitMQ node
	// (http://127.0.0.1:15672). Set, it runs the site agent (configuration
	// queue, queue events, work-queue policies).
	AMQPManagementURL string
	// WorkQueue tunes the work queues (eq. 2.12 constants, retune
	// interval: --wq-ttl-per-member, --wq-max-length-per-member,
	// --wq-unacked-per-member, --wq-retune-interval); its ManagementURL and
	// Load are set from AMQPManagementURL and the selection engine.
	// WorkQueue.Federation sets the links the site agent creates,
	// DiscardHeldOnMove from --federation-discard-held.
	WorkQueue bridge.WorkQueueConfig
	// DataDir, set, keeps sessions, subscriptions, retained messages and
	// in-flight QoS 1/2 messages in this directory across restarts (see
	// persist.go); it is created if missing. Empty keeps everything in
	// memory.
	DataDir string
	// Fsync, with DataDir, makes every accepted QoS 1/2 publish and every
	// stored record reach the disk (fsync) before the publisher's PUBACK,
	// so a power cut loses nothing acknowledged. Without it a killed
	// process loses nothing (the data is in the page cache) but a power
	// cut can lose the last writes. It costs throughput: see docs/reliability.md.
	Fsync bool
}

// DefaultConnectTimeout is the default time a new connection has to send
// its CONNECT packet.
const DefaultConnectTimeout = 5 * time.Second

// DefaultMaxPacketSize is the default limit on an inbound MQTT packet.
const DefaultMaxPacketSize = 1 << 20

// maxMQTTPacketSize is the protocol's limit: a 268435455-byte remaining
// length plus a 5-byte fixed header.
const maxMQTTPacketSize = 268435460

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid configuration")

// withDefaults returns c with defaults filled in, or an error naming the bad
// field.
func (c Config) withDefaults() (Config, error) {
	if c.Strategy == "" {
		c.Strategy = "adaptive"
	}
	strategy, err := resolveStrategy(c.Strategy)
	if err != nil {
		return c, fmt.Errorf("%w: strategy: %w", ErrInvalidConfig, err)
	}
	c.Strategy = strategy
	if c.ReportInterval == 0 {
		c.ReportInterval = scoring.DefaultReportInterval
	}
	if c.ReportInterval < time.Millisecond {
		return c, fmt.Errorf("%w: report interval %v is below 1ms", ErrInvalidConfig, c.ReportInterval)
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = 3 * c.ReportInterval
	}
	if c.StaleAfter < 0 {
		return c, fmt.Errorf("%w: stale-after %v is negative", ErrInvalidConfig, c.StaleAfter)
	}
	if c.MaxPacketSize == 0 {
		c.MaxPacketSize = DefaultMaxPacketSize
	}
	if c.MaxPacketSize < 64 || c.MaxPacketSize > maxMQTTPacketSize {
		return c, fmt.Errorf("%w: max-packet-size %d must be from 64 to %d bytes", ErrInvalidConfig, c.MaxPacketSize, maxMQTTPacketSize)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxConnections < 0 {
		return c, fmt.Errorf("%w: max-connections %d is negative (0 means no limit)", ErrInvalidConfig, c.MaxConnections)
	}
	if c.MaxConnectionsPerIP < 0 {
		return c, fmt.Errorf("%w: max-connections-per-ip %d is negative (0 means no limit)", ErrInvalidConfig, c.MaxConnectionsPerIP)
	}
	if c.AckTimeout < 0 {
		return c, fmt.Errorf("%w: ack-timeout %v is negative (0 disables it)", ErrInvalidConfig, c.AckTimeout)
	}
	if c.RedispatchGrace < 0 {
		return c, fmt.Errorf("%w: redispatch-grace %v is negative (0 waits for the session to expire)", ErrInvalidConfig, c.RedispatchGrace)
	}
	if c.HoldLead < 0 {
		return c, fmt.Errorf("%w: hold-lead %v is negative (0 turns late binding off)", ErrInvalidConfig, c.HoldLead)
	}
	if c.MetricsMaxMembers == 0 {
		c.MetricsMaxMembers = hooks.DefaultMetricsMaxMembers
	}
	if c.MetricsMaxMembers < 0 {
		return c, fmt.Errorf("%w: metrics-max-members %d is negative", ErrInvalidConfig, c.MetricsMaxMembers)
	}
	if c.GCPercent != 0 && (c.GCPercent < MinGCPercent || c.GCPercent > MaxGCPercent) {
		return c, fmt.Errorf("%w: gc-percent %d must be 0 (Go's own setting) or from %d to %d", ErrInvalidConfig, c.GCPercent, MinGCPercent, MaxGCPercent)
	}
	if c.MaxSessionMessages == 0 {
		c.MaxSessionMessages = DefaultMaxSessionMessages
	}
	if c.MaxSessionMessages < 0 || c.MaxSessionMessages > MaxSessionMessagesLimit {
		return c, fmt.Errorf("%w: max-session-messages %d must be from 1 to %d (0: %d)", ErrInvalidConfig, c.MaxSessionMessages, MaxSessionMessagesLimit, DefaultMaxSessionMessages)
	}
	if c.MaxPendingWrites < 0 || c.MaxPendingWrites > MaxPendingWritesLimit {
		return c, fmt.Errorf("%w: max-pending-writes %d must be from 0 (sized from max-queued-bytes) to %d", ErrInvalidConfig, c.MaxPendingWrites, MaxPendingWritesLimit)
	}
	if c.ReadBufferBytes == 0 {
		c.ReadBufferBytes = DefaultReadBufferBytes
	}
	if c.ReadBufferBytes < MinReadBufferBytes || c.ReadBufferBytes > MaxReadBufferBytes {
		return c, fmt.Errorf("%w: read-buffer-bytes %d must be from %d to %d (0: %d)", ErrInvalidConfig, c.ReadBufferBytes, MinReadBufferBytes, MaxReadBufferBytes, DefaultReadBufferBytes)
	}
	if c.PublisherPacingMaxWait == 0 {
		c.PublisherPacingMaxWait = hooks.DefaultPacingMaxWait
	}
	if c.PublisherPacingMaxWait > hooks.MaxPacingMaxWait {
		return c, fmt.Errorf("%w: publisher-pacing-max-wait %v is above %v", ErrInvalidConfig, c.PublisherPacingMaxWait, hooks.MaxPacingMaxWait)
	}
	if c.MemoryTrimStep == 0 {
		c.MemoryTrimStep = DefaultMemoryTrimStep
	}
	if c.MaxQueuedBytes < 0 {
		return c, fmt.Errorf("%w: max-queued-bytes %d is negative (0 selects %d)", ErrInvalidConfig, c.MaxQueuedBytes, pingreq.DefaultMaxQueuedBytes)
	}
	if c.MQTTListen == "" && c.TLSListen == "" && c.WSListen == "" {
		return c, fmt.Errorf("%w: no MQTT listener: set at least one of listen, tls-listen, ws-listen", ErrInvalidConfig)
	}
	if c.TLSListen != "" && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		return c, fmt.Errorf("%w: tls-listen %s needs both tls-cert and tls-key", ErrInvalidConfig, c.TLSListen)
	}
	if err := c.checkListenersAndAccess(); err != nil {
		return c, err
	}
	if c.AMQPURL == "" && (c.Site != "" || len(c.Exports) > 0 || len(c.ExportGroups) > 0 || c.AMQPManagementURL != "") {
		return c, fmt.Errorf("%w: site, export, export-group and amqp-management-url need amqp-url (the site's RabbitMQ node)", ErrInvalidConfig)
	}
	if c.AMQPURL != "" && c.Site == "" {
		return c, fmt.Errorf("%w: amqp-url needs site (a name for this site, e.g. --site berlin)", ErrInvalidConfig)
	}
	if c.AMQPURL == "" && c.BrokerID != "" {
		return c, fmt.Errorf("%w: broker-id needs amqp-url (the site's RabbitMQ node)", ErrInvalidConfig)
	}
	if c.AMQPURL != "" && c.BrokerID == "" {
		c.BrokerID = bridge.DefaultBrokerID(cmp.Or(c.MQTTListen, c.TLSListen, c.WSListen))
	}
	if c.AMQPURL != "" {
		wq := c.WorkQueue // its --wq-* constants are checked too
		wq.ManagementURL, wq.Load = c.AMQPManagementURL, noLoad{}
		bc := bridge.Config{Site: c.Site, BrokerID: c.BrokerID, AMQPURL: c.AMQPURL, Exports: c.Exports, ExportGroups: c.ExportGroups,
			WorkQueue: wq}
		if err := bc.Validate(); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.Fsync && c.DataDir == "" {
		return c, fmt.Errorf("%w: fsync needs data-dir (nothing is written to disk without it)", ErrInvalidConfig)
	}
	if c.DataDir != "" {
		if err := prepareDataDir(c.DataDir); err != nil {
			return c, err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = scoring.SystemClock{}
	}
	return c, nil
}

// noLoad stands in for the selection engine while validating.
type noLoad struct{}

func (noLoad) Snapshot() []scoring.GroupSnapshot { return nil }

// DefaultHoldLead is --hold-lead's default: late binding is off until it
// is shown to help on real connections (see docs/selection.md); 5ms suits
// loopback and LAN members.
const DefaultHoldLead = 0
