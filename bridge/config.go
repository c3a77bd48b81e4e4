package bridge

import (
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Config describes a site bridge. The zero value of an optional field takes
// the default shown.
type Config struct {
	// Site names this site (letters, digits, '-', '_'). It tags every
	// exported message and, with BrokerID, names the import queue.
	// Required.
	Site string
	// BrokerID names this broker among the brokers of its site (letters,
	// digits, '-', '_'; at most 64). Several brokers of one site share its
	// RabbitMQ node, each with its own import queue
	// ImportQueueName(Site, BrokerID); the ID tags every exported message,
	// so a broker skips only what it published itself. Empty takes
	// DefaultBrokerID(""): the host name and random hex digits, stable for
	// the process.
	BrokerID string
	// AMQPURL is the site's RabbitMQ node (amqp:// or amqps://). Required.
	AMQPURL string
	// Exports are the MQTT filters whose messages are shared with the
	// other sites (see ExchangeName). Filters starting with '$' are refused.
	Exports []string
	// ExportGroups are shared subscriptions ($share/<group>/<filter>) served
	// as work queues across sites (see the package doc). They need
	// WorkQueue.ManagementURL and WorkQueue.Load.
	ExportGroups []string
	// WorkQueue tunes the work queues of ExportGroups and the site agent.
	WorkQueue WorkQueueConfig
	// Logger receives the bridge's logs (slog.Default()).
	Logger *slog.Logger
	// ReconnectMin and ReconnectMax bound the reconnect backoff
	// (200 ms and 15 s).
	ReconnectMin, ReconnectMax time.Duration
	// OutboxSize bounds the messages waiting to be confirmed by RabbitMQ
	// (10000); beyond it the oldest are dropped and counted.
	OutboxSize int
	// Prefetch bounds unacknowledged deliveries from the import queue (256).
	Prefetch int
	// DedupWindow is how many recent message IDs the importer remembers to
	// drop duplicates (65536).
	DedupWindow int
	// QueueMaxLength bounds the import queue (100000 messages, oldest
	// dropped first).
	QueueMaxLength int
	// QueueExpires deletes the import queue after this long without a
	// consumer (1 h).
	QueueExpires time.Duration
	// Heartbeat is the AMQP heartbeat interval (5 s).
	Heartbeat time.Duration
}

// Validate reports the first problem with c, naming the bad input.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	if !validName(c.Site) {
		return c, fmt.Errorf("%w: site %q: use 1-64 letters, digits, '-' or '_'", ErrInvalidConfig, c.Site)
	}
	if c.BrokerID == "" {
		c.BrokerID = DefaultBrokerID("")
	}
	if !validName(c.BrokerID) {
		return c, fmt.Errorf("%w: broker-id %q: use 1-64 letters, digits, '-' or '_'", ErrInvalidConfig, c.BrokerID)
	}
	if c.AMQPURL == "" {
		return c, fmt.Errorf("%w: amqp-url is empty", ErrInvalidConfig)
	}
	u, err := url.Parse(c.AMQPURL)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		return c, fmt.Errorf("%w: amqp-url %q: want amqp://user:password@host:port/vhost", ErrInvalidConfig, redact(c.AMQPURL))
	}
	for _, f := range c.Exports {
		if err := checkExport(f); err != nil {
			return c, err
		}
	}
	seenGroups := map[string]bool{}
	for _, g := range c.ExportGroups {
		wg, err := parseExportGroup(g)
		if err != nil {
			return c, err
		}
		if seenGroups[wg.name] {
			return c, fmt.Errorf("%w: export-group %q: group %q is exported twice", ErrInvalidConfig, g, wg.name)
		}
		seenGroups[wg.name] = true
	}
	if c.WorkQueue, err = c.WorkQueue.withDefaults(c.AMQPURL, len(c.ExportGroups) > 0); err != nil {
		return c, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 200 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 15 * time.Second
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = c.ReconnectMin
	}
	if c.OutboxSize <= 0 {
		c.OutboxSize = 10000
	}
	if c.Prefetch <= 0 {
		c.Prefetch = 256
	}
	if c.DedupWindow <= 0 {
		c.DedupWindow = 65536
	}
	if c.QueueMaxLength <= 0 {
		c.QueueMaxLength = 100000
	}
	if c.QueueExpires <= 0 {
		c.QueueExpires = time.Hour
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 5 * time.Second
	}
	return c, nil
}

func checkExport(f string) error {
	switch {
	case f == "":
		return fmt.Errorf("%w: export filter is empty", ErrInvalidConfig)
	case strings.HasPrefix(f, "$"):
		return fmt.Errorf("%w: export %q: filters starting with '$' (system topics, shared subscriptions) cannot be exported; use --export-group for $share", ErrInvalidConfig, f)
	case !validFilter(f):
		return fmt.Errorf("%w: export %q is not a valid MQTT topic filter", ErrInvalidConfig, f)
	case len(ExchangeName(f)) > MaxAMQPNameLength:
		return fmt.Errorf("%w: export %q: its exchange name %s… is longer than RabbitMQ's %d bytes; shorten the first level", ErrInvalidConfig, f, ExchangeName(f)[:32], MaxAMQPNameLength)
	}
	return nil
}

// ExchangePrefix starts the name of every pub/sub exchange; only exchanges
// with this prefix are federated.
const ExchangePrefix = "pubsub."

// ExchangeName returns the RabbitMQ topic exchange that carries messages
// exported by filter f: "pubsub." followed by f's first level, with every
// byte other than ASCII letters, digits, '-' and '_' percent-encoded
// ("sensors/+/temp" -> "pubsub.sensors", "café/#" -> "pubsub.caf%C3%A9"),
// or "pubsub.all" when the first level is a wildcard ("#", "+/status"). An
// empty first level ("/a") gives "pubsub.".
// Filters with the same first level share one exchange, so sites agree on
// the name whatever else they export.
func ExchangeName(f string) string {
	first, _, _ := strings.Cut(f, "/")
	if first == "+" || first == "#" {
		return ExchangePrefix + "all"
	}
	var b strings.Builder
	b.WriteString(ExchangePrefix)
	for i := 0; i < len(first); i++ {
		c := first[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// exchange is one pub/sub exchange and the export filters it carries.
type exchange struct {
	name    string
	filters []string
}

// groupExports gathers export filters by exchange, sorted by name, without
// duplicate filters.
func groupExports(exports []string) []exchange {
	byName := map[string]map[string]bool{}
	for _, f := range exports {
		n := ExchangeName(f)
		if byName[n] == nil {
			byName[n] = map[string]bool{}
		}
		byName[n][f] = true
	}
	out := make([]exchange, 0, len(byName))
	for n, fs := range byName {
		x := exchange{name: n}
		for f := range fs {
			x.filters = append(x.filters, f)
		}
		sort.Strings(x.filters)
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
