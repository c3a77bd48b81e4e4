package clientsdk

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// ReportChannel says how a Subscriber sends its load reports to the broker.
type ReportChannel string

const (
	// ReportViaPingreq sends reports as the payload of an extended PINGREQ
	// (the default). Against a broker that closes the connection on such a
	// PINGREQ the Subscriber switches to ReportViaPublish for good.
	ReportViaPingreq ReportChannel = "pingreq"
	// ReportViaPublish sends reports as QoS 0 PUBLISHes to report.LoadTopic,
	// which any MQTT v5 broker accepts.
	ReportViaPublish ReportChannel = "publish"
	// ReportOff sends no reports; keep-alive still runs.
	ReportOff ReportChannel = "off"
)

// ParseReportChannel returns the ReportChannel named s ("pingreq", "publish"
// or "off"; "" means "pingreq").
func ParseReportChannel(s string) (ReportChannel, error) {
	switch c := ReportChannel(strings.ToLower(strings.TrimSpace(s))); c {
	case "":
		return ReportViaPingreq, nil
	case ReportViaPingreq, ReportViaPublish, ReportOff:
		return c, nil
	}
	return "", fmt.Errorf("report channel %q: want pingreq, publish or off", s)
}

// Defaults applied to zero-valued configuration fields.
const (
	DefaultWorkers          = 1
	DefaultQueueCapacity    = 1000
	DefaultReportInterval   = time.Second
	DefaultMaxAttempts      = 3
	DefaultRetryBackoff     = 100 * time.Millisecond
	DefaultMaxRetryBackoff  = 5 * time.Second
	DefaultKeepAlive        = 30 * time.Second
	DefaultConnectTimeout   = 10 * time.Second
	DefaultMaxReconnectWait = 5 * time.Second
	DefaultAckFlushInterval = time.Millisecond
)

// ConnectionConfig holds what both a Subscriber and a Publisher need to reach
// a broker.
type ConnectionConfig struct {
	// Brokers are the broker URLs, tried in order on every (re)connection:
	// mqtt://host:1883, mqtts://host:8883 or ws://host:80/path (also wss://).
	Brokers []string
	// ClientID is the MQTT client identifier; a random "luffy-…" one when
	// empty.
	ClientID string
	// Username and Password authenticate the client when Username is set.
	Username string
	Password string
	// TLS configures mqtts:// and wss:// connections; nil uses Go's
	// defaults.
	TLS *tls.Config
	// KeepAlive is the MQTT keep-alive (whole seconds); DefaultKeepAlive
	// when 0, disabled when negative.
	KeepAlive time.Duration
	// ConnectTimeout bounds one connection attempt; DefaultConnectTimeout
	// when 0.
	ConnectTimeout time.Duration
	// MaxReconnectWait caps the wait between reconnection attempts, which
	// starts at 100 ms and doubles; DefaultMaxReconnectWait when 0.
	MaxReconnectWait time.Duration
	// SessionExpiry is the MQTT v5 Session Expiry Interval: how long the
	// broker keeps the session (and unacknowledged messages) after a
	// disconnection. 0 ends the session with the connection.
	SessionExpiry time.Duration
	// Logger receives the client's logs; slog.Default() when nil.
	Logger *slog.Logger
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// ConnectionConfig says how to reach the broker, unless Autopaho is
	// set.
	ConnectionConfig

	// Autopaho, when set, is the configuration of the Subscriber's
	// connection, as an autopaho application already has it: its server
	// URLs, TLS and WebSocket settings, AttemptConnection, Will message,
	// credentials, keep-alive, session (Session, SessionExpiryInterval,
	// CleanStartOnInitialConnection), publish Queue, reconnection backoff,
	// connection callbacks and OnPublishReceived handlers all keep working.
	// The Subscriber works on a copy: it sets PingHandler (which must be
	// nil) to its load reporter, runs its own OnPublishReceived handler
	// before the application's (they see the groups' messages with
	// AlreadyHandled set), enables manual acknowledgement when a group's QoS
	// is above 0 (acknowledging, after the application's handlers, the
	// messages of no group unless the application acknowledges manually
	// itself), announces at most QueueCapacity as Receive Maximum, and runs
	// its OnConnectionUp, OnConnectionDown and OnConnectError before the
	// application's. When OnConnectionDown returns false the Subscriber
	// stops for good (see Subscriber.Done). ConnectionConfig must then be
	// empty except for ClientID (used when the ClientConfig's is empty),
	// ConnectTimeout, MaxReconnectWait and Logger.
	Autopaho *autopaho.ClientConfig

	// Group is the shared-subscription group name: the Subscriber
	// subscribes to $share/<Group>/<filter> for each of Filters. It may be
	// empty when Groups lists every group.
	Group string
	// Filters are the topic filters to share; at least one.
	Filters []string
	// QoS is the maximum QoS of the subscription (0, 1 or 2).
	QoS byte
	// Handler processes each message; required unless every group has its
	// own.
	Handler Handler
	// Groups are further shared groups joined on the same connection. All
	// groups share the Subscriber's pending queue, workers and load
	// report: the broker knows a member's load per client, not per group.
	// Give groups disjoint filters: a broker that merges a client's
	// overlapping subscriptions (Mochi and LuffyMQ do) delivers a message
	// that matches two groups once, to one of them.
	Groups []GroupSubscription
	// Workers is the number of handlers running at once; DefaultWorkers
	// when 0.
	Workers int
	// QueueCapacity bounds the pending queue (messages received but not yet
	// taken by a worker); DefaultQueueCapacity when 0, at most 65535. It is
	// also announced to the broker as the MQTT v5 Receive Maximum, so the
	// broker never has more unacknowledged QoS 1/2 messages out to this
	// client than that. A full queue stops reading the connection (QoS 0).
	QueueCapacity int

	// ReportVia is the load-report channel; ReportViaPingreq when "".
	ReportVia ReportChannel
	// ReportInterval is the period of load reports. When 0 the Subscriber
	// follows the interval the broker announces in CONNACK
	// (report.ReportIntervalProperty), else DefaultReportInterval.
	ReportInterval time.Duration

	// MaxAttempts is how many times the handler is called for one message
	// before it is dead-lettered; DefaultMaxAttempts when 0.
	MaxAttempts int
	// RetryBackoff is the wait before the second attempt; it doubles for
	// each further attempt, up to MaxRetryBackoff. Defaults:
	// DefaultRetryBackoff, DefaultMaxRetryBackoff.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// DeadLetterTopic receives messages whose every attempt failed, with
	// User Properties AttemptsProperty, ErrorProperty, FirstFailureProperty
	// and OriginalTopicProperty; "dlq/<Group>" when "".
	DeadLetterTopic string

	// AckFlushInterval is how often acknowledgements of finished QoS 1/2
	// messages are sent (they must go out in arrival order);
	// DefaultAckFlushInterval when 0 (or the Autopaho config's
	// SendAcksInterval when set). The broker learns of a completion this
	// late at most.
	AckFlushInterval time.Duration

	// groups are every group, Group's first, with defaults filled in (set
	// by withDefaults).
	groups []GroupSubscription
}

// GroupSubscription is one shared group a Subscriber joins.
type GroupSubscription struct {
	// Group is the shared-subscription group name.
	Group string
	// Filters are the topic filters shared in the group; at least one.
	Filters []string
	// QoS is the maximum QoS of the group's subscriptions (0, 1 or 2).
	QoS byte
	// Handler processes the group's messages; SubscriberConfig.Handler
	// when nil.
	Handler Handler
	// DeadLetterTopic receives the group's messages whose every attempt
	// failed; "dlq/<Group>" when "".
	DeadLetterTopic string
}

// withDefaults validates g (described as name in errors) and returns a copy
// with defaults filled in.
func (g GroupSubscription) withDefaults(name string, handler Handler) (GroupSubscription, error) {
	if g.Group == "" {
		return g, fmt.Errorf("subscriber config: %sGroup is empty; set the shared-subscription group name", name)
	}
	if strings.ContainsAny(g.Group, "/+#") {
		return g, fmt.Errorf("subscriber config: %sGroup %q must not contain '/', '+' or '#'", name, g.Group)
	}
	if len(g.Filters) == 0 {
		return g, fmt.Errorf("subscriber config: %sFilters is empty; give at least one topic filter", name)
	}
	for _, f := range g.Filters {
		if err := validFilter(f); err != nil {
			return g, fmt.Errorf("subscriber config: %sfilter %q: %w", name, f, err)
		}
	}
	if g.QoS > 2 {
		return g, fmt.Errorf("subscriber config: %sQoS %d: want 0, 1 or 2", name, g.QoS)
	}
	if g.Handler == nil {
		g.Handler = handler
	}
	if g.Handler == nil {
		return g, fmt.Errorf("subscriber config: %sHandler is nil", name)
	}
	if g.DeadLetterTopic == "" {
		g.DeadLetterTopic = "dlq/" + g.Group
	}
	if strings.ContainsAny(g.DeadLetterTopic, "+#") {
		return g, fmt.Errorf("subscriber config: %sDeadLetterTopic %q must not contain wildcards", name, g.DeadLetterTopic)
	}
	return g, nil
}

// withGroupDefaults validates the groups and fills in c.groups.
func (c SubscriberConfig) withGroupDefaults() (SubscriberConfig, error) {
	c.groups = nil
	if c.Group != "" || len(c.Groups) == 0 {
		first, err := GroupSubscription{
			Group: c.Group, Filters: c.Filters, QoS: c.QoS, Handler: c.Handler, DeadLetterTopic: c.DeadLetterTopic,
		}.withDefaults("", c.Handler)
		if err != nil {
			return c, err
		}
		c.DeadLetterTopic = first.DeadLetterTopic
		c.groups = append(c.groups, first)
	} else if len(c.Filters) > 0 {
		return c, errors.New("subscriber config: Filters given without Group; name their group")
	}
	seen := map[string]bool{}
	if len(c.groups) > 0 {
		seen[c.Group] = true
	}
	for i, g := range c.Groups {
		g, err := g.withDefaults(fmt.Sprintf("Groups[%d]: ", i), c.Handler)
		if err != nil {
			return c, err
		}
		if seen[g.Group] {
			return c, fmt.Errorf("subscriber config: Groups[%d]: group %q is joined twice; give each group once, with all its filters", i, g.Group)
		}
		seen[g.Group] = true
		c.groups = append(c.groups, g)
	}
	return c, nil
}

// withDefaults validates c and returns a copy with defaults filled in.
func (c SubscriberConfig) withDefaults() (SubscriberConfig, error) {
	var err error
	if c.Autopaho != nil {
		c.ConnectionConfig, err = c.ConnectionConfig.withAutopahoDefaults(c.Autopaho)
	} else {
		c.ConnectionConfig, err = c.ConnectionConfig.withDefaults()
	}
	if err != nil {
		return c, err
	}
	if c, err = c.withGroupDefaults(); err != nil {
		return c, err
	}
	if c.Workers < 0 {
		return c, fmt.Errorf("subscriber config: Workers %d is negative", c.Workers)
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.QueueCapacity < 0 || c.QueueCapacity > math.MaxUint16 {
		return c, fmt.Errorf("subscriber config: QueueCapacity %d: want 1 to %d", c.QueueCapacity, math.MaxUint16)
	}
	if c.QueueCapacity == 0 {
		c.QueueCapacity = DefaultQueueCapacity
	}
	if c.ReportVia, err = ParseReportChannel(string(c.ReportVia)); err != nil {
		return c, fmt.Errorf("subscriber config: %w", err)
	}
	if c.ReportInterval < 0 {
		return c, fmt.Errorf("subscriber config: ReportInterval %s is negative", c.ReportInterval)
	}
	if c.MaxAttempts < 0 {
		return c, fmt.Errorf("subscriber config: MaxAttempts %d is negative", c.MaxAttempts)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryBackoff < 0 || c.MaxRetryBackoff < 0 {
		return c, fmt.Errorf("subscriber config: RetryBackoff %s / MaxRetryBackoff %s must not be negative", c.RetryBackoff, c.MaxRetryBackoff)
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	if c.AckFlushInterval < 0 {
		return c, fmt.Errorf("subscriber config: AckFlushInterval %s is negative", c.AckFlushInterval)
	}
	if c.AckFlushInterval == 0 && c.Autopaho != nil {
		c.AckFlushInterval = c.Autopaho.SendAcksInterval
	}
	if c.AckFlushInterval == 0 {
		c.AckFlushInterval = DefaultAckFlushInterval
	}
	return c, nil
}

// withAutopahoDefaults validates c for a connection configured by ac and
// returns a copy with defaults filled in.
func (c ConnectionConfig) withAutopahoDefaults(ac *autopaho.ClientConfig) (ConnectionConfig, error) {
	if len(c.Brokers) > 0 || c.Username != "" || c.Password != "" || c.TLS != nil || c.KeepAlive != 0 || c.SessionExpiry != 0 {
		return c, errors.New("connection config: with Autopaho set, give the brokers, credentials, TLS, keep-alive and session expiry in the autopaho.ClientConfig, not in ConnectionConfig")
	}
	if len(ac.ServerUrls) == 0 && len(ac.BrokerUrls) == 0 {
		return c, errors.New("connection config: the autopaho.ClientConfig has no ServerUrls")
	}
	if ac.PingHandler != nil {
		return c, errors.New("connection config: the autopaho.ClientConfig has a PingHandler; leave it nil, the Subscriber's load reporter is the PingHandler")
	}
	if ac.Router != nil {
		return c, errors.New("connection config: the autopaho.ClientConfig has a Router (deprecated in paho); use OnPublishReceived")
	}
	switch {
	case c.ClientID != "" && ac.ClientID != "" && c.ClientID != ac.ClientID:
		return c, fmt.Errorf("connection config: ClientID %q differs from the autopaho.ClientConfig's %q; give one", c.ClientID, ac.ClientID)
	case ac.ClientID != "":
		c.ClientID = ac.ClientID
	case c.ClientID == "":
		c.ClientID = randomClientID()
	}
	c.KeepAlive = time.Duration(ac.KeepAlive) * time.Second
	if c.ConnectTimeout < 0 || c.MaxReconnectWait < 0 {
		return c, fmt.Errorf("connection config: ConnectTimeout %s and MaxReconnectWait %s must not be negative", c.ConnectTimeout, c.MaxReconnectWait)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = ac.ConnectTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxReconnectWait == 0 {
		c.MaxReconnectWait = DefaultMaxReconnectWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (c ConnectionConfig) withDefaults() (ConnectionConfig, error) {
	if len(c.Brokers) == 0 {
		return c, errors.New("connection config: Brokers is empty; give at least one URL such as mqtt://127.0.0.1:1883")
	}
	if _, err := parseBrokerURLs(c.Brokers); err != nil {
		return c, err
	}
	if c.ClientID == "" {
		c.ClientID = randomClientID()
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.KeepAlive > math.MaxUint16*time.Second {
		return c, fmt.Errorf("connection config: KeepAlive %s exceeds %d s", c.KeepAlive, math.MaxUint16)
	}
	if c.ConnectTimeout < 0 || c.MaxReconnectWait < 0 || c.SessionExpiry < 0 {
		return c, fmt.Errorf("connection config: ConnectTimeout %s, MaxReconnectWait %s and SessionExpiry %s must not be negative",
			c.ConnectTimeout, c.MaxReconnectWait, c.SessionExpiry)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxReconnectWait == 0 {
		c.MaxReconnectWait = DefaultMaxReconnectWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// keepAliveSeconds returns the keep-alive in whole seconds, rounded up.
func (c ConnectionConfig) keepAliveSeconds() uint16 {
	if c.KeepAlive <= 0 {
		return 0
	}
	return uint16((c.KeepAlive + time.Second - 1) / time.Second)
}

// sessionExpirySeconds returns the session expiry in whole seconds, rounded up.
func (c ConnectionConfig) sessionExpirySeconds() uint32 {
	s := (c.SessionExpiry + time.Second - 1) / time.Second
	if s > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(s)
}

// connectPacketBuilder returns an autopaho CONNECT customisation that
// announces receiveMax (when not nil and lower than a Receive Maximum
// already set) as the Receive Maximum and asks for
// problem information. paho encodes Request Problem Information = 0 whenever
// CONNECT has properties and the flag is unset, and some brokers (Mochi) then
// strip every User Property they send, including the report interval in
// CONNACK and the properties of delivered messages.
func connectPacketBuilder(receiveMax *uint16) func(*paho.Connect, *url.URL) (*paho.Connect, error) {
	return func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
		if cp.Properties == nil {
			cp.Properties = &paho.ConnectProperties{}
		}
		cp.Properties.RequestProblemInfo = true
		if receiveMax != nil && (cp.Properties.ReceiveMaximum == nil || *cp.Properties.ReceiveMaximum > *receiveMax) {
			cp.Properties.ReceiveMaximum = receiveMax
		}
		return cp, nil
	}
}

// parseBrokerURLs parses and checks broker URLs.
func parseBrokerURLs(raw []string) ([]*url.URL, error) {
	urls := make([]*url.URL, 0, len(raw))
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("broker URL %q: %w", r, err)
		}
		switch strings.ToLower(u.Scheme) {
		case "mqtt", "tcp", "mqtts", "tls", "ssl", "ws", "wss":
		default:
			return nil, fmt.Errorf("broker URL %q: scheme %q not supported; use mqtt://, mqtts://, ws:// or wss://", r, u.Scheme)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("broker URL %q: no host; write it like mqtt://127.0.0.1:1883", r)
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// validFilter checks an MQTT topic filter.
func validFilter(f string) error {
	if f == "" {
		return errors.New("empty")
	}
	if strings.HasPrefix(f, "$share/") {
		return errors.New("give the plain filter; the Subscriber adds $share/<group>/")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return errors.New("'#' must be a whole last level")
		}
		if strings.Contains(l, "+") && l != "+" {
			return errors.New("'+' must be a whole level")
		}
	}
	return nil
}

// reconnectBackoff returns the wait before reconnection attempt n (0 for the
// first): 100 ms, doubling, capped at max.
func reconnectBackoff(max time.Duration) func(int) time.Duration {
	return func(attempt int) time.Duration {
		if attempt <= 0 {
			return 0
		}
		return retryDelay(100*time.Millisecond, max, attempt)
	}
}

// retryDelay returns base·2^(n−1) capped at max, for n ≥ 1.
func retryDelay(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n; i++ {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

func randomClientID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "luffy-" + hex.EncodeToString(b[:])
}
