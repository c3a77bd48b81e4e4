package bridge

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/bridge/wqroute"
	"github.com/luffymq/luffymq/scoring"
)

// Names of the RabbitMQ entities of a work queue (see the package doc).
const (
	// WorkQueuePolicyPrefix starts the name of the TTL / max-length policy
	// of each work queue; the rest is the queue's name.
	WorkQueuePolicyPrefix = "luffymq-wq:"
	// MessageIDUserProperty carries the AMQP message ID on every MQTT
	// message delivered from a work queue, so members can drop the
	// duplicates that at-least-once delivery may create.
	MessageIDUserProperty = "luffymq-message-id"
	// HeaderTopic carries the MQTT topic of a work-queue message, whose
	// routing key is the queue's name.
	HeaderTopic = "x-mqtt-topic"
)

// Routing keys of the messages on RouteExchangeName besides the work,
// whose key is the site it goes to. Site names have no dot, so these
// never collide with one.
const (
	// WantRoutingKey carries a broker's request for the other sites'
	// group states (wqroute.Want); every broker of every site binds it.
	WantRoutingKey = "luffymq.want"
	// stateKeyPrefix starts the key of a group state addressed to a site.
	stateKeyPrefix = "luffymq.state."
)

// StateRoutingKey returns the routing key of the group states addressed
// to site; its brokers bind it.
func StateRoutingKey(site string) string { return stateKeyPrefix + site }

// isControlKey reports whether a routing key on RouteExchangeName carries
// a state or a request for states rather than work.
func isControlKey(key string) bool { return strings.HasPrefix(key, "luffymq.") }

// Work-queue routing of local publishes (WorkQueueConfig.Route).
const (
	// RouteRing: a publish the local members would not start within the
	// TTL goes to the dead-letter exchange, whose consistent-hash ring
	// picks a site in proportion to eq. 2.13's weights.
	RouteRing = "ring"
	// RouteNearest (the default): each site publishes its group state; a
	// publish goes straight to the site whose members would start it
	// soonest, one-way delay included, when that is not this site; the
	// ring stays for TTL expiries and while no other site's state is
	// fresh. Its mean latency beat RouteRing's in every cell of
	// luffy-bench's sites matrix (bench/results/sites-matrix,
	// docs/sites.md).
	RouteNearest = "nearest"
)

// IntakeQueueName returns the queue holding group g's overflow that this
// site accepted (its own or other sites'): "luffymq.wqin.<g>". It has no
// TTL, so a message is dead-lettered at most once.
func IntakeQueueName(g string) string { return "luffymq.wqin." + g }

// LoadSource gives the local shared groups' load (scoring.Engine).
type LoadSource interface {
	Snapshot() []scoring.GroupSnapshot
}

// Defaults of WorkQueueConfig's eq. 2.12 constants and pull and retune
// rates, the values of luffymq's --wq-* flags when not given.
const (
	// DefaultMaxLengthPerMember is eq. 2.12's C for the max length.
	DefaultMaxLengthPerMember = 3000
	// DefaultTTLPerMember is eq. 2.12's C for the message TTL: how long a
	// message may wait in wq.<g> per available member before it leaves
	// for the dead-letter exchange (and possibly another site).
	DefaultTTLPerMember = 500 * time.Millisecond
	// DefaultUnackedPerMember bounds the messages taken and not yet
	// acknowledged per online member.
	DefaultUnackedPerMember = 2
	// DefaultRetuneInterval is how often the policy and weights are
	// recomputed.
	DefaultRetuneInterval = time.Second
	// MinRetuneInterval is the shortest RetuneInterval accepted: each
	// retune reads the queues' depths and may call the management API.
	MinRetuneInterval = 10 * time.Millisecond
	// DefaultStateInterval is how often at most a broker publishes its
	// group state with RouteNearest.
	DefaultStateInterval = 100 * time.Millisecond
	// MinStateInterval is the shortest StateInterval accepted: every
	// state goes to every other site.
	MinStateInterval = 10 * time.Millisecond
)

// WorkQueueConfig tunes work queues and the site agent. The zero value of
// an optional field takes the default shown; a negative one is refused.
type WorkQueueConfig struct {
	// ManagementURL is the site node's management API
	// (http://127.0.0.1:15672). Required with export groups; when set
	// without them the site agent still runs (configuration queue and
	// queue events).
	ManagementURL string
	// Username and Password log in to the management API (those of
	// AMQPURL).
	Username, Password string
	// Load reports the local members' load. Required with export groups.
	Load LoadSource
	// MaxLengthPerMember is eq. 2.12's C for the queue's max length
	// (3000 messages).
	MaxLengthPerMember int
	// TTLPerMember is eq. 2.12's C for the queue's message TTL (500 ms).
	TTLPerMember time.Duration
	// UnackedPerMember bounds the messages taken from RabbitMQ and not yet
	// acknowledged, per online member (2).
	UnackedPerMember int
	// RetuneInterval is how often TTL, max length and weights are
	// recomputed (1 s).
	RetuneInterval time.Duration
	// DeliveryTimeout requeues a message no member took within this long
	// (10 s).
	DeliveryTimeout time.Duration
	// TTLOverflowOnly keeps the thesis's rule: a local publish always
	// goes to wq.<g> and leaves for the dead-letter exchange only when its
	// TTL expires. By default a publish that the site's members would not
	// start within the TTL goes to the dead-letter exchange at once
	// (overflow at publish, see earlyoverflow.go).
	TTLOverflowOnly bool
	// Route is RouteNearest (the default) or RouteRing. It has no effect
	// with TTLOverflowOnly.
	Route string
	// StateInterval is how often at most a broker publishes its group
	// state with RouteNearest (100 ms); it publishes at least every
	// stateHeartbeatIntervals (5) intervals while nothing changes, and
	// the other sites take a state as stale after stateStaleIntervals
	// (15). Shorter: fresher predictions, more WAN messages.
	StateInterval time.Duration
	// Federation sets the federation links created from configuration
	// messages (ManagementURL and credentials are taken from above).
	Federation FederationConfig
}

func (c WorkQueueConfig) withDefaults(amqpURL string, groups bool) (WorkQueueConfig, error) {
	if groups && c.ManagementURL == "" {
		return c, fmt.Errorf("%w: export-group needs the management URL of the site's RabbitMQ node (--amqp-management-url)", ErrInvalidConfig)
	}
	if groups && c.Load == nil {
		return c, fmt.Errorf("%w: export-group needs a load source (the selection engine)", ErrInvalidConfig)
	}
	if c.ManagementURL != "" {
		u, err := url.Parse(c.ManagementURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("%w: amqp-management-url %q: want http://host:15672", ErrInvalidConfig, redact(c.ManagementURL))
		}
	}
	if c.Federation.Vhost == "" {
		// The management API calls (policies, bindings, federation
		// upstreams) must name the virtual host the AMQP connection uses.
		if uri, err := amqp.ParseURI(amqpURL); err == nil {
			c.Federation.Vhost = uri.Vhost
		}
	}
	if c.Username == "" {
		if u, err := url.Parse(amqpURL); err == nil && u.User != nil {
			c.Username = u.User.Username()
			c.Password, _ = u.User.Password()
		} else {
			c.Username, c.Password = "guest", "guest"
		}
	}
	if err := c.checkTuning(); err != nil {
		return c, err
	}
	if c.MaxLengthPerMember == 0 {
		c.MaxLengthPerMember = DefaultMaxLengthPerMember
	}
	if c.TTLPerMember == 0 {
		c.TTLPerMember = DefaultTTLPerMember
	}
	if c.UnackedPerMember == 0 {
		c.UnackedPerMember = DefaultUnackedPerMember
	}
	if c.RetuneInterval == 0 {
		c.RetuneInterval = DefaultRetuneInterval
	}
	switch c.Route {
	case "":
		c.Route = RouteNearest
	case RouteNearest, RouteRing:
	default:
		return c, fmt.Errorf("%w: wq-route %q: want %s or %s", ErrInvalidConfig, c.Route, RouteNearest, RouteRing)
	}
	if c.StateInterval == 0 {
		c.StateInterval = DefaultStateInterval
	}
	if c.DeliveryTimeout <= 0 {
		c.DeliveryTimeout = 10 * time.Second
	}
	return c, nil
}

// checkTuning refuses negative constants and durations RabbitMQ or the
// retune loop cannot honour, naming luffymq's flags; zero selects the
// default.
func (c WorkQueueConfig) checkTuning() error {
	switch {
	case c.MaxLengthPerMember < 0:
		return fmt.Errorf("%w: wq-max-length-per-member %d is negative", ErrInvalidConfig, c.MaxLengthPerMember)
	case c.TTLPerMember < 0 || (c.TTLPerMember > 0 && c.TTLPerMember < time.Millisecond):
		return fmt.Errorf("%w: wq-ttl-per-member %v: want 1ms or more (RabbitMQ's TTLs are whole milliseconds)", ErrInvalidConfig, c.TTLPerMember)
	case c.UnackedPerMember < 0:
		return fmt.Errorf("%w: wq-unacked-per-member %d is negative", ErrInvalidConfig, c.UnackedPerMember)
	case c.RetuneInterval < 0 || (c.RetuneInterval > 0 && c.RetuneInterval < MinRetuneInterval):
		return fmt.Errorf("%w: wq-retune-interval %v: want %v or more", ErrInvalidConfig, c.RetuneInterval, MinRetuneInterval)
	case c.StateInterval < 0 || (c.StateInterval > 0 && c.StateInterval < MinStateInterval):
		return fmt.Errorf("%w: wq-state-interval %v: want %v or more", ErrInvalidConfig, c.StateInterval, MinStateInterval)
	}
	return nil
}

// workGroup is one exported shared group.
type workGroup struct {
	name   string // <g>
	share  string // $share/<g>/<filter>, the scoring and Mochi group key
	filter string
	view   overflowView // read by overflow at publish
	// router holds the other sites' states (nil unless the routing is
	// RouteNearest).
	router *wqroute.Router
	// idleNudge wakes the state loop when a local member went idle with
	// nothing left to take: the sites routing to this one hear of it at
	// once rather than at the next StateInterval.
	idleNudge chan struct{}
	// wantNudge wakes the state loop when a local publish waits in
	// wq.<g> for the other sites' states, none being fresh: it asks for
	// them at once.
	wantNudge chan struct{}
}

// nudgeWant tells the state loop, without blocking, that a publish waits
// for the other sites' states.
func (g *workGroup) nudgeWant() {
	select {
	case g.wantNudge <- struct{}{}:
	default:
	}
}

// nudgeIdle tells the state loop, without blocking, that a member went
// idle.
func (g *workGroup) nudgeIdle() {
	select {
	case g.idleNudge <- struct{}{}:
	default:
	}
}

func (g *workGroup) queue() string { return WorkQueueName(g.name) }

// parseExportGroup checks $share/<g>/<filter>.
func parseExportGroup(s string) (*workGroup, error) {
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 || parts[0] != "$share" {
		return nil, fmt.Errorf("%w: export-group %q: want $share/<group>/<filter>", ErrInvalidConfig, s)
	}
	if !validName(parts[1]) {
		return nil, fmt.Errorf("%w: export-group %q: group name %q: use letters, digits, '-' or '_'", ErrInvalidConfig, s, parts[1])
	}
	if err := checkExport(parts[2]); err != nil {
		return nil, fmt.Errorf("%w: export-group %q: filter %q is not a valid MQTT filter outside '$' topics", ErrInvalidConfig, s, parts[2])
	}
	return &workGroup{name: parts[1], share: s, filter: parts[2], idleNudge: make(chan struct{}, 1), wantNudge: make(chan struct{}, 1)}, nil
}

// Capacity is a site's capacity for one group, computed from its members'
// load as eq. 2.12–2.14 prescribe.
type Capacity struct {
	// Online counts the group's online members.
	Online int
	// Available is eq. 2.12's ConsumerUtilisation × NumberOfConsumers /
	// 100: the sum over online members of 1/(1+q), q being how many
	// service times of work are queued ahead of a new message
	// (PredictedWait / ServiceEstimate, or in-flight deliveries beyond the
	// first for members that do not report).
	Available float64
	// MaxLength and TTL are eq. 2.12 with Available.
	MaxLength int
	TTL       time.Duration
}

// capacity computes Capacity from a group snapshot.
func (c WorkQueueConfig) capacity(members []scoring.MemberSnapshot) Capacity {
	var out Capacity
	for _, m := range members {
		if !m.Online {
			continue
		}
		out.Online++
		var q float64
		if m.ServiceEstimate > 0 {
			q = float64(m.PredictedWait) / float64(m.ServiceEstimate)
		} else if m.InFlight > 1 {
			q = float64(m.InFlight - 1)
		}
		if q < 0 {
			q = 0
		}
		out.Available += 1 / (1 + q)
	}
	out.MaxLength, out.TTL = c.limits(out.Available)
	return out
}

// limits is eq. 2.12: the work queue's max length and message TTL for an
// availability (Capacity.Available).
func (c WorkQueueConfig) limits(available float64) (maxLength int, ttl time.Duration) {
	return max(int(float64(c.MaxLengthPerMember)*available), 1), max(time.Duration(float64(c.TTLPerMember)*available), time.Millisecond)
}

// hasRoom reports whether some online member can start a message about
// now: it has no delivery waiting behind the one it works on and, if it
// reports, a predicted wait under one service time.
func hasRoom(members []scoring.MemberSnapshot) bool {
	for _, m := range members {
		if !m.Online {
			continue
		}
		slots := max(m.Workers, 1)
		if m.InFlight >= slots {
			continue
		}
		if m.ServiceEstimate > 0 && m.PredictedWait > m.ServiceEstimate {
			continue
		}
		return true
	}
	return false
}

// weight is eq. 2.13.
func weight(maxLength, inQueue int) int { return max(maxLength-inQueue, 1) }
