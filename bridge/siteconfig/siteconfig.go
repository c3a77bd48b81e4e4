// Package siteconfig is the configuration a controller sends to a LuffyMQ
// site (algorithms.md §2.6), how the site agent checks it, and the
// RabbitMQ names it refers to. It needs nothing beyond the standard
// library, so luffy-controller links no broker; package bridge applies it.
package siteconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("bridge")

// MaxAMQPNameLength is the longest exchange or queue name AMQP 0-9-1
// carries (a short string).
const MaxAMQPNameLength = 255

// ValidName reports whether s is a valid site, broker or group name:
// 1 to 64 letters, digits, '-' or '_'.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Redact hides the password of an AMQP URL for logs and errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		return u.Redacted()
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		return "xxxxx@" + raw[i+1:] // unparsable, but may hold a password
	}
	if err != nil {
		return "<unparsable URL>"
	}
	return raw
}

// UpstreamPrefix starts the name of every federation upstream the bridge
// manages; ApplyFederation removes those that are no longer wanted and
// leaves others alone.
const UpstreamPrefix = "luffymq-"

// Upstream is a site this site's pub/sub exchanges receive messages from.
type Upstream struct {
	// Site names the upstream site; the upstream is called
	// UpstreamPrefix+Site.
	Site string
	// URI is the upstream node's AMQP URI as reachable from this site.
	URI string
}

// ExchangeUpstreamPrefix starts the names of the upstreams, upstream sets
// and policies that federate single exchanges (FederationConfig.Exchanges):
// "luffymq-x:<exchange>[:<upstream>]".
const ExchangeUpstreamPrefix = UpstreamPrefix + "x:"

// ExchangeFederation federates one exchange from its own set of upstreams,
// as a configuration message (algorithms.md §2.6) asks.
type ExchangeFederation struct {
	// Exchange is the local (downstream) exchange.
	Exchange string
	// UpstreamExchange is the exchange read at the upstreams (Exchange).
	UpstreamExchange string
	// Upstreams are the nodes Exchange receives from; Upstream.Site only
	// names the upstream ("luffymq-x:<exchange>:<site>").
	Upstreams []Upstream
	// MaxHops overrides FederationConfig.MaxHops for these links (0: the
	// config's).
	MaxHops int
}

// WorkQueuePrefix starts the name of every work queue.
const WorkQueuePrefix = "wq."

// WorkQueueName returns the durable queue of shared group g: "wq.<g>".
func WorkQueueName(g string) string { return WorkQueuePrefix + g }

// DeadLetterExchangeName returns the consistent-hash exchange into which
// wq.<g> dead-letters what it cannot keep: "wq.<g>.dlx".
func DeadLetterExchangeName(g string) string { return WorkQueuePrefix + g + ".dlx" }

// IntakeExchangeName returns the exchange through which other sites'
// overflow of group g arrives: "wq.<g>.in", federated from their
// "wq.<g>.dlx".
func IntakeExchangeName(g string) string { return WorkQueuePrefix + g + ".in" }

// RouteExchangeName returns the direct exchange through which a site
// sends a message straight to the site chosen for it, with that site's
// name as routing key, and publishes its group state (StateRoutingKey):
// "wq.<g>.to", federated from every other site's own.
func RouteExchangeName(g string) string { return WorkQueuePrefix + g + ".to" }

// ConfigQueueName returns the site's configuration queue.
func ConfigQueueName(site string) string { return "luffymq.config." + site }

// Message is algorithms.md §2.6's configuration message: global
// entity -> upstreams of this site for it.
type Message map[string][]struct {
	URI string `json:"uri"`
}

// FederationFor turns a configuration message into per-exchange
// federations: a "pubsub*" exchange is federated as itself; "wq.<g>"
// federates wq.<g>.in from the upstreams' wq.<g>.dlx, and wq.<g>.to from
// theirs (states and messages routed to this site, see wqrouting.go).
func FederationFor(m Message) ([]ExchangeFederation, error) {
	out := []ExchangeFederation{}
	for name, ups := range m {
		x := ExchangeFederation{Exchange: name}
		if g, ok := strings.CutPrefix(name, WorkQueuePrefix); ok {
			if !ValidName(g) {
				return nil, fmt.Errorf("%w: configuration entry %q: work queue group %q: use letters, digits, '-' or '_'", ErrInvalidConfig, name, g)
			}
			x = ExchangeFederation{Exchange: IntakeExchangeName(g), UpstreamExchange: DeadLetterExchangeName(g)}
		} else if !strings.HasPrefix(name, "pubsub") {
			return nil, fmt.Errorf("%w: configuration entry %q: only pubsub* exchanges and wq.* queues are global", ErrInvalidConfig, name)
		} else if len(name) > MaxAMQPNameLength {
			return nil, fmt.Errorf("%w: configuration entry %.32q…: longer than RabbitMQ's %d-byte names", ErrInvalidConfig, name, MaxAMQPNameLength)
		}
		for i, u := range ups {
			if !strings.HasPrefix(u.URI, "amqp://") && !strings.HasPrefix(u.URI, "amqps://") {
				return nil, fmt.Errorf("%w: configuration entry %q: uri %q is not amqp:// or amqps://", ErrInvalidConfig, name, Redact(u.URI))
			}
			x.Upstreams = append(x.Upstreams, Upstream{Site: strconv.Itoa(i), URI: u.URI})
		}
		out = append(out, x)
		if g, ok := strings.CutPrefix(name, WorkQueuePrefix); ok {
			// One hop: wq.<g>.to is federated as itself, so with more a
			// state or message would come back through third sites, late
			// and duplicated.
			out = append(out, ExchangeFederation{Exchange: RouteExchangeName(g), Upstreams: x.Upstreams, MaxHops: 1})
		}
	}
	return out, nil
}

// SiteConfig is the content of one configuration message (algorithms.md
// §2.6) in a form a controller can build and compare: each global entity
// (a pubsub* exchange or a wq.<g> work queue) mapped to the AMQP URIs of
// the upstreams this site federates it from. Marshal writes the exact JSON
// the site agent's configuration loop reads from ConfigQueueName(site);
// ParseSiteConfig reads it back.
type SiteConfig map[string][]string

// Marshal validates c as the site agent would and returns the
// configuration message: {"<entity>": [{"uri": "..."}, ...], ...}. Keys
// are written in sorted order and each entity's URIs in the order given,
// so equal configurations give equal bytes.
func (c SiteConfig) Marshal() ([]byte, error) {
	m := c.message()
	if _, err := FederationFor(m); err != nil {
		return nil, err
	}
	return json.Marshal(m) // encoding/json sorts map keys
}

// Validate reports what the site agent would refuse in c, wrapping
// ErrInvalidConfig.
func (c SiteConfig) Validate() error {
	_, err := FederationFor(c.message())
	return err
}

func (c SiteConfig) message() Message {
	m := make(Message, len(c))
	for name, uris := range c {
		ups := make([]struct {
			URI string `json:"uri"`
		}, len(uris))
		for i, u := range uris {
			ups[i].URI = u
		}
		m[name] = ups
	}
	return m
}

// Equal reports whether c and o federate the same entities from the same
// upstreams (the order of an entity's upstreams does not matter; an entity
// listed with no upstream equals an absent one, as the site agent treats
// both alike).
func (c SiteConfig) Equal(o SiteConfig) bool {
	norm := func(s SiteConfig) map[string]string {
		out := map[string]string{}
		for name, uris := range s {
			if len(uris) == 0 {
				continue
			}
			sorted := append([]string(nil), uris...)
			sort.Strings(sorted)
			out[name] = strings.Join(sorted, "\x00")
		}
		return out
	}
	a, b := norm(c), norm(o)
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ParseSiteConfig decodes a configuration message and validates it as the
// site agent does.
func ParseSiteConfig(body []byte) (SiteConfig, error) {
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: configuration message: %w", ErrInvalidConfig, err)
	}
	if _, err := FederationFor(m); err != nil {
		return nil, err
	}
	c := make(SiteConfig, len(m))
	for name, ups := range m {
		uris := make([]string, 0, len(ups))
		for _, u := range ups {
			uris = append(uris, u.URI)
		}
		c[name] = uris
	}
	return c, nil
}

// SiteConfigEntity returns the configuration entity that federation of
// the local exchange x belongs to: x itself for a pubsub* exchange, wq.<g>
// for wq.<g>'s intake exchange (see IntakeExchangeName); ok is false for
// any other exchange.
func SiteConfigEntity(x string) (entity string, ok bool) {
	if strings.HasPrefix(x, "pubsub") {
		return x, true
	}
	if g, found := strings.CutSuffix(strings.TrimPrefix(x, WorkQueuePrefix), ".in"); found && ValidName(g) && IntakeExchangeName(g) == x {
		return WorkQueueName(g), true
	}
	return "", false
}
