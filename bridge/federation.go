package bridge

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
)

// DefaultPolicyName names the policy that federates pub/sub exchanges.
const DefaultPolicyName = "luffymq-pubsub-federation"

// FederationConfig is the federation set-up of one site's RabbitMQ node.
type FederationConfig struct {
	// ManagementURL is the node's management API (http://host:15672).
	ManagementURL string
	// Username and Password log in to the management API.
	Username, Password string
	// Vhost is the virtual host ("/"; a bridge's work-queue federation
	// takes the one of its AMQP URL).
	Vhost string
	// Upstreams are the sites this site federates from; an empty list
	// removes the federation.
	Upstreams []Upstream
	// Pattern selects the federated exchanges (`^pubsub\.`).
	Pattern string
	// PolicyName names the policy (DefaultPolicyName).
	PolicyName string
	// MaxHops bounds how many federation links a message may cross (1, as
	// in a full mesh; a star through a hub needs 2).
	MaxHops int
	// MessageTTL bounds how long messages wait in an upstream's federation
	// queue while the link is down (1 h).
	MessageTTL time.Duration
	// Expires deletes an upstream's federation queue after the link has
	// been down this long (1 h).
	Expires time.Duration
	// ReconnectDelay is how long a failed link waits before reconnecting
	// (1 s).
	ReconnectDelay time.Duration
	// PrefetchCount bounds unconfirmed messages per link (1000).
	PrefetchCount int
	// Exchanges federates single exchanges from their own upstreams (see
	// ApplyFederation).
	Exchanges []ExchangeFederation
	// DiscardHeldOnMove turns off the conservation of held messages when
	// a configuration message removes a federation link (the site agent's
	// loss-free reconfiguration, see ConserveQueueName): what the removed
	// link left in its queue on the old upstream is then deleted and
	// counted instead of being re-published into the exchange it came
	// from. The zero value conserves.
	DiscardHeldOnMove bool
	// LinkWait bounds how long the site agent waits for the new links of
	// a configuration message to run before it removes the old ones (30 s);
	// until then both run and the message is retried.
	LinkWait time.Duration
	// OldLinkGrace is how long old links keep running once the new ones
	// run, so that messages already on their way through them arrive
	// (1 s).
	OldLinkGrace time.Duration
}

func (c FederationConfig) withDefaults() (FederationConfig, error) {
	if c.ManagementURL == "" {
		return c, fmt.Errorf("%w: federation: management URL is empty", ErrInvalidConfig)
	}
	if c.Vhost == "" {
		c.Vhost = "/"
	}
	if c.Pattern == "" {
		c.Pattern = `^pubsub\.`
	}
	if c.PolicyName == "" {
		c.PolicyName = DefaultPolicyName
	}
	if c.MaxHops <= 0 {
		c.MaxHops = 1
	}
	if c.MessageTTL <= 0 {
		c.MessageTTL = time.Hour
	}
	if c.Expires <= 0 {
		c.Expires = time.Hour
	}
	if c.ReconnectDelay <= 0 {
		c.ReconnectDelay = time.Second
	}
	if c.PrefetchCount <= 0 {
		c.PrefetchCount = 1000
	}
	if c.LinkWait <= 0 {
		c.LinkWait = 30 * time.Second
	}
	if c.OldLinkGrace <= 0 {
		c.OldLinkGrace = time.Second
	}
	seen := map[string]bool{}
	for _, u := range c.Upstreams {
		if !validName(u.Site) {
			return c, fmt.Errorf("%w: federation upstream site %q: use letters, digits, '-' or '_'", ErrInvalidConfig, u.Site)
		}
		if seen[u.Site] {
			return c, fmt.Errorf("%w: federation upstream site %q given twice", ErrInvalidConfig, u.Site)
		}
		seen[u.Site] = true
		if !strings.HasPrefix(u.URI, "amqp://") && !strings.HasPrefix(u.URI, "amqps://") {
			return c, fmt.Errorf("%w: federation upstream %s: URI %q is not amqp:// or amqps://", ErrInvalidConfig, u.Site, redact(u.URI))
		}
	}
	return c, nil
}

// ApplyFederation makes the node's federation match cfg through the
// management API. It manages two independent families:
//
//   - pattern federation (when cfg.Exchanges is nil or cfg.Upstreams is
//     not): one upstream per entry of cfg.Upstreams, an upstream set
//     named cfg.PolicyName listing exactly those, and a policy federating
//     the exchanges that match cfg.Pattern from that set (never "all",
//     which would take in the per-exchange family's upstreams too);
//     upstreams named UpstreamPrefix+<site> that cfg no longer lists are
//     removed, and an empty list removes the policy and the set;
//   - per-exchange federation (when cfg.Exchanges is not nil): for each
//     entry, upstreams "luffymq-x:<exchange>:<site>", an upstream set
//     listing ExchangeUpstreamSlots of them and a policy (priority 2)
//     naming it; upstreams and policies of this family that cfg.Exchanges
//     no longer lists are removed, upstream sets are kept.
//
// It can be applied again at run time; nothing restarts but the links
// whose upstream was added, changed or removed. It changes links at once:
// the site agent moves them without losing messages with the procedure of
// reconfig.go (new links first, old ones later, held messages conserved).
func ApplyFederation(ctx context.Context, cfg FederationConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	for _, x := range cfg.Exchanges {
		if x.Exchange == "" || strings.HasPrefix(x.Exchange, "amq.") {
			return fmt.Errorf("%w: federation: exchange %q cannot be federated", ErrInvalidConfig, x.Exchange)
		}
	}
	rh, err := managementClient(cfg.ManagementURL, cfg.Username, cfg.Password)
	if err != nil {
		return err
	}
	if cfg.Exchanges == nil || cfg.Upstreams != nil {
		if err := applyPatternFederation(ctx, rh, cfg); err != nil {
			return err
		}
	}
	if cfg.Exchanges != nil {
		return applyExchangeFederation(ctx, rh, cfg)
	}
	return nil
}

func (c FederationConfig) definition(uri, exchange string) rabbithole.FederationDefinition {
	return rabbithole.FederationDefinition{
		Uri:            rabbithole.URISet{uri},
		Expires:        int(c.Expires.Milliseconds()),
		MessageTTL:     int32(c.MessageTTL.Milliseconds()),
		MaxHops:        c.MaxHops,
		PrefetchCount:  c.PrefetchCount,
		ReconnectDelay: max(1, int(c.ReconnectDelay.Seconds())),
		AckMode:        "on-confirm",
		TrustUserId:    false,
		Exchange:       exchange,
	}
}

func applyPatternFederation(ctx context.Context, rh *rabbithole.Client, cfg FederationConfig) error {
	want := map[string]bool{}
	for _, u := range cfg.Upstreams {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := UpstreamPrefix + u.Site
		want[name] = true
		if err := checkResponse(rh.PutFederationUpstream(cfg.Vhost, name, cfg.definition(u.URI, ""))); err != nil {
			return fmt.Errorf("federation: setting upstream %s (%s) on %s: %w", name, redact(u.URI), cfg.ManagementURL, err)
		}
	}
	existing, err := rh.ListFederationUpstreamsIn(cfg.Vhost)
	if err != nil {
		return fmt.Errorf("federation: listing upstreams on %s: %w", cfg.ManagementURL, err)
	}
	for _, u := range existing {
		if strings.HasPrefix(u.Name, UpstreamPrefix) && !strings.HasPrefix(u.Name, ExchangeUpstreamPrefix) && !want[u.Name] {
			if err := checkResponse(rh.DeleteFederationUpstream(cfg.Vhost, u.Name)); err != nil {
				return fmt.Errorf("federation: removing upstream %s on %s: %w", u.Name, cfg.ManagementURL, err)
			}
		}
	}
	// The policy names an upstream set of these upstreams only, not
	// "all": on a node that also has the configuration agent's
	// per-exchange upstreams (ExchangeUpstreamPrefix, each reading one
	// named exchange), "all" would federate every exchange of the pattern
	// from each of those too, and their links would share the queues of
	// the per-exchange links on the upstream nodes.
	if len(cfg.Upstreams) == 0 {
		res, err := rh.DeletePolicy(cfg.Vhost, cfg.PolicyName)
		if err != nil && (res == nil || res.StatusCode != http.StatusNotFound) {
			return fmt.Errorf("federation: removing policy %s on %s: %w", cfg.PolicyName, cfg.ManagementURL, err)
		}
		res, err = rh.DeleteRuntimeParameter(upstreamSetComponent, cfg.Vhost, cfg.PolicyName)
		if err != nil && (res == nil || res.StatusCode != http.StatusNotFound) {
			return fmt.Errorf("federation: removing upstream set %s on %s: %w", cfg.PolicyName, cfg.ManagementURL, err)
		}
		return nil
	}
	members := make([]map[string]string, 0, len(want))
	for _, name := range slices.Sorted(maps.Keys(want)) {
		members = append(members, map[string]string{"upstream": name})
	}
	if err := checkResponse(rh.PutRuntimeParameter(upstreamSetComponent, cfg.Vhost, cfg.PolicyName, members)); err != nil {
		return fmt.Errorf("federation: setting upstream set %s on %s: %w", cfg.PolicyName, cfg.ManagementURL, err)
	}
	policy := rabbithole.Policy{
		Pattern:    cfg.Pattern,
		ApplyTo:    "exchanges",
		Priority:   1,
		Definition: rabbithole.PolicyDefinition{"federation-upstream-set": cfg.PolicyName},
	}
	if err := checkResponse(rh.PutPolicy(cfg.Vhost, cfg.PolicyName, policy)); err != nil {
		return fmt.Errorf("federation: setting policy %s (%s) on %s: %w", cfg.PolicyName, cfg.Pattern, cfg.ManagementURL, err)
	}
	return nil
}

const upstreamSetComponent = "federation-upstream-set"

// ExchangeUpstreamSlots is how many upstream names every per-exchange
// upstream set lists ("luffymq-x:<exchange>:0" … ":63"), whether those
// upstreams exist or not. RabbitMQ 3.10 restarts every exchange federation
// link of a node whenever any upstream set is created or changed, and a
// restarted link deletes its queue on the upstream with whatever that
// queue still holds; creating or deleting one upstream starts or stops
// that link alone. So each exchange's set is written once, with all its
// slots, and links come and go as upstreams. (The first configuration
// that federates an exchange on a node creates its set, which restarts
// the node's other links once.)
const ExchangeUpstreamSlots = 64

// exchangeSetMembers lists the upstream set of an exchange: its slots, and
// any upstream named outside them (which changes the set, with the
// restart described at ExchangeUpstreamSlots).
func exchangeSetMembers(setName string, ups []Upstream) []map[string]string {
	members := make([]map[string]string, 0, ExchangeUpstreamSlots)
	listed := map[string]bool{}
	for i := 0; i < ExchangeUpstreamSlots; i++ {
		name := setName + ":" + strconv.Itoa(i)
		listed[name] = true
		members = append(members, map[string]string{"upstream": name})
	}
	for _, u := range ups {
		if name := setName + ":" + u.Site; !listed[name] {
			listed[name] = true
			members = append(members, map[string]string{"upstream": name})
		}
	}
	return members
}

func applyExchangeFederation(ctx context.Context, rh *rabbithole.Client, cfg FederationConfig) error {
	wantUp, wantSet := map[string]bool{}, map[string]bool{}
	for _, x := range cfg.Exchanges {
		if len(x.Upstreams) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		setName := ExchangeUpstreamPrefix + x.Exchange
		// An unchanged set, upstream or policy written again changes
		// nothing in RabbitMQ: no link restarts.
		if err := checkResponse(rh.PutRuntimeParameter(upstreamSetComponent, cfg.Vhost, setName, exchangeSetMembers(setName, x.Upstreams))); err != nil {
			return fmt.Errorf("federation: setting upstream set %s on %s: %w", setName, cfg.ManagementURL, err)
		}
		wantSet[setName] = true
		for _, u := range x.Upstreams {
			if err := ctx.Err(); err != nil {
				return err
			}
			name := setName + ":" + u.Site
			wantUp[name] = true
			def := cfg.definition(u.URI, x.UpstreamExchange)
			if x.MaxHops > 0 {
				def.MaxHops = x.MaxHops
			}
			if err := checkResponse(rh.PutFederationUpstream(cfg.Vhost, name, def)); err != nil {
				return fmt.Errorf("federation: setting upstream %s (%s) on %s: %w", name, redact(u.URI), cfg.ManagementURL, err)
			}
		}
		policy := rabbithole.Policy{
			Pattern:    "^" + regexp.QuoteMeta(x.Exchange) + "$",
			ApplyTo:    "exchanges",
			Priority:   2,
			Definition: rabbithole.PolicyDefinition{"federation-upstream-set": setName},
		}
		if err := checkResponse(rh.PutPolicy(cfg.Vhost, setName, policy)); err != nil {
			return fmt.Errorf("federation: setting policy %s on %s: %w", setName, cfg.ManagementURL, err)
		}
	}
	// Links go one by one, with their upstreams; the upstream sets stay
	// (deleting one would restart every link of the node).
	existing, err := rh.ListFederationUpstreamsIn(cfg.Vhost)
	if err != nil {
		return fmt.Errorf("federation: listing upstreams on %s: %w", cfg.ManagementURL, err)
	}
	for _, u := range existing {
		if strings.HasPrefix(u.Name, ExchangeUpstreamPrefix) && !wantUp[u.Name] {
			if err := checkResponse(rh.DeleteFederationUpstream(cfg.Vhost, u.Name)); err != nil {
				return fmt.Errorf("federation: removing upstream %s on %s: %w", u.Name, cfg.ManagementURL, err)
			}
		}
	}
	policies, err := rh.ListPoliciesIn(cfg.Vhost)
	if err != nil {
		return fmt.Errorf("federation: listing policies on %s: %w", cfg.ManagementURL, err)
	}
	for _, p := range policies {
		if strings.HasPrefix(p.Name, ExchangeUpstreamPrefix) && !wantSet[p.Name] {
			if err := checkResponse(rh.DeletePolicy(cfg.Vhost, p.Name)); err != nil {
				return fmt.Errorf("federation: removing policy %s on %s: %w", p.Name, cfg.ManagementURL, err)
			}
		}
	}
	return nil
}

// FullMesh returns the upstreams of site in a full mesh: every other site,
// reached through uri(site, other). Use MaxHops 1 with it.
func FullMesh(site string, sites []string, uri func(from, to string) string) []Upstream {
	var ups []Upstream
	for _, s := range sites {
		if s != site {
			ups = append(ups, Upstream{Site: s, URI: uri(site, s)})
		}
	}
	return ups
}

// FederationLink is the state of one federation link, as the management
// API reports it.
type FederationLink struct {
	// Upstream is the upstream's name.
	Upstream string
	// Exchange is the federated (downstream) exchange.
	Exchange string
	// Status is "running", "starting", "error" or "shutdown".
	Status string
	// Error is RabbitMQ's reason when Status is "error".
	Error string
}

// FederationLinks lists the node's federation links, sorted by exchange and
// upstream.
func FederationLinks(ctx context.Context, managementURL, username, password string) ([]FederationLink, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rh, err := managementClient(managementURL, username, password)
	if err != nil {
		return nil, err
	}
	raw, err := rh.ListFederationLinks()
	if err != nil {
		return nil, fmt.Errorf("federation: listing links on %s: %w", managementURL, err)
	}
	links := make([]FederationLink, 0, len(raw))
	for _, l := range raw {
		str := func(k string) string { s, _ := l[k].(string); return s }
		links = append(links, FederationLink{
			Upstream: str("upstream"),
			Exchange: str("exchange"),
			Status:   str("status"),
			Error:    str("error"),
		})
	}
	sort.Slice(links, func(i, j int) bool {
		if links[i].Exchange != links[j].Exchange {
			return links[i].Exchange < links[j].Exchange
		}
		return links[i].Upstream < links[j].Upstream
	})
	return links, nil
}

func managementClient(url, user, password string) (*rabbithole.Client, error) {
	rh, err := rabbithole.NewClient(strings.TrimSuffix(url, "/"), user, password)
	if err != nil {
		return nil, fmt.Errorf("%w: management URL %q: %w", ErrInvalidConfig, url, err)
	}
	rh.SetTimeout(managementTimeout)
	return rh, nil
}

// managementTimeout bounds each call to a management API.
const managementTimeout = 10 * time.Second

func checkResponse(res *http.Response, err error) error {
	if err != nil {
		return err
	}
	if res != nil {
		defer res.Body.Close()
		if res.StatusCode >= 300 {
			return fmt.Errorf("management API answered %s", res.Status)
		}
	}
	return nil
}
