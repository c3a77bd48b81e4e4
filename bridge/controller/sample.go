package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/luffymq/luffymq/bridge/siteconfig"
	"github.com/luffymq/luffymq/broker/api"
	"github.com/luffymq/luffymq/internal/mgmtjson"
)

// counter is a cumulative RabbitMQ counter: rates are its differences
// between two reads of a site, so that every rate of a site covers the
// same interval.
type counter float64

func (c *counter) add(count int64) { *c += counter(count) }

// exchangeSample is what one read of the management API says about one
// pubsub* exchange at one site.
type exchangeSample struct {
	// publishIn counts messages published into the exchange: by local
	// clients and by the federation links that bring other sites'
	// messages (overlayIn).
	publishIn counter
	// publishOut counts messages the exchange routed to queues: local
	// queues and the federation queues of its downstreams
	// (overlayEnqueued).
	publishOut counter
	// overlayIn counts messages this site's federation links published
	// into the exchange (the links' local channels).
	overlayIn counter
	// overlayOut counts messages delivered from this exchange's federation
	// queues to downstream sites.
	overlayOut counter
	// overlayEnqueued counts messages routed into those queues.
	overlayEnqueued counter
	// backlogMessages and backlogBytes are held in those queues now.
	backlogMessages, backlogBytes int64
}

// siteSample is one read of a site's RabbitMQ node.
type siteSample struct {
	at        time.Time
	exchanges map[string]*exchangeSample
	// workQueues are the wq.<g> queues of the node, by name.
	workQueues []string
	// meanMessageSize is bytes received over the vhost's network
	// connections that published, over the messages they published (0 if
	// none did).
	meanMessageSize float64
	// observed is the federation the site agent applied, as a
	// configuration: entity -> upstream URIs, from the node's federation
	// links of the per-exchange family (siteconfig.ExchangeUpstreamPrefix).
	observed siteconfig.SiteConfig
	// links counts, per pubsub* exchange, the node's federation links of
	// that family.
	links map[string]int
}

// managementReader reads one site's management API.
type managementReader struct {
	site    Site
	rh      *rabbithole.Client
	http    *http.Client
	timeout time.Duration
}

func newManagementReader(s Site, timeout time.Duration) (*managementReader, error) {
	rh, err := rabbithole.NewClient(strings.TrimSuffix(s.ManagementURL, "/"), s.ManagementUser, s.ManagementPassword)
	if err != nil {
		return nil, fmt.Errorf("management_url %q: %w", redactURL(s.ManagementURL), err)
	}
	rh.SetTimeout(timeout)
	return &managementReader{site: s, rh: rh, http: &http.Client{Timeout: timeout}, timeout: timeout}, nil
}

// read takes one sample of the site's node.
func (r *managementReader) read(ctx context.Context) (*siteSample, error) {
	vhost := r.site.Vhost
	s := &siteSample{at: time.Now(), exchanges: map[string]*exchangeSample{}, links: map[string]int{}}
	exchanges, err := r.rh.ListExchangesIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing exchanges: %w", err)
	}
	for _, x := range exchanges {
		if !strings.HasPrefix(x.Name, "pubsub") || x.Internal {
			continue
		}
		e := &exchangeSample{}
		if st := x.MessageStats; st != nil {
			e.publishIn.add(int64(st.PublishIn))
			e.publishOut.add(int64(st.PublishOut))
		}
		s.exchanges[x.Name] = e
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	queues, err := r.rh.ListQueuesIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	for _, q := range queues {
		if x, ok := federatedExchange(q, s.exchanges); ok {
			e := s.exchanges[x]
			if st := q.MessageStats; st != nil {
				e.overlayOut.add(st.DeliverGet)
				e.overlayEnqueued.add(st.Publish)
			}
			e.backlogMessages += int64(q.Messages)
			e.backlogBytes += q.MessagesBytes
			continue
		}
		if g, ok := strings.CutPrefix(q.Name, siteconfig.WorkQueuePrefix); ok && siteconfig.WorkQueueName(g) == q.Name &&
			(siteconfig.SiteConfig{q.Name: nil}).Validate() == nil {
			s.workQueues = append(s.workQueues, q.Name)
		}
	}
	sort.Strings(s.workQueues)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	upstreams, err := r.rh.ListFederationUpstreamsIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing federation upstreams (is rabbitmq_federation enabled?): %w", err)
	}
	uris := map[string]string{}
	for _, u := range upstreams {
		if len(u.Definition.Uri) > 0 {
			uris[u.Name] = u.Definition.Uri[0]
		}
	}
	links, err := r.rh.ListFederationLinksIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing federation links (is rabbitmq_federation_management enabled?): %w", err)
	}
	s.observed = siteconfig.SiteConfig{}
	for _, l := range links {
		link := parseLink(l)
		if link.Type != "" && link.Type != "exchange" {
			continue
		}
		if e := s.exchanges[link.Exchange]; e != nil {
			e.overlayIn.add(link.published)
		}
		if !strings.HasPrefix(link.Upstream, siteconfig.ExchangeUpstreamPrefix) {
			continue
		}
		entity, ok := siteconfig.SiteConfigEntity(link.Exchange)
		if !ok {
			continue
		}
		if uri, ok := uris[link.Upstream]; ok {
			s.observed[entity] = append(s.observed[entity], uri)
		}
		if strings.HasPrefix(entity, "pubsub") {
			s.links[entity]++
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.meanMessageSize, err = r.meanMessageSize(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// federatedExchange returns the exchange whose federation queue q is:
// RabbitMQ names it "federation: <exchange> -> <downstream>" and marks it
// x-internal-purpose=federation.
func federatedExchange(q rabbithole.QueueInfo, exchanges map[string]*exchangeSample) (string, bool) {
	if purpose, _ := q.Arguments["x-internal-purpose"].(string); purpose != "federation" {
		return "", false
	}
	rest, ok := strings.CutPrefix(q.Name, "federation: ")
	if !ok {
		return "", false
	}
	best := ""
	for x := range exchanges {
		if strings.HasPrefix(rest, x+" -> ") && len(x) > len(best) {
			best = x
		}
	}
	return best, best != ""
}

// federationLink is the part of a management API federation link the
// controller reads.
type federationLink struct {
	Type, Exchange, Upstream string
	// published counts the messages the link published into the local
	// exchange (its local channel's publishes).
	published int64
}

func parseLink(l map[string]any) federationLink {
	str := func(k string) string { s, _ := l[k].(string); return s }
	link := federationLink{Type: str("type"), Exchange: str("exchange"), Upstream: str("upstream")}
	ch, _ := l["local_channel"].(map[string]any)
	st, _ := ch["message_stats"].(map[string]any) // [] when empty
	if n, ok := st["publish"].(float64); ok {
		link.published = int64(n)
	}
	return link
}

// channelPublishes is the part of a management API channel the controller
// reads (rabbit-hole's ChannelInfo has no message statistics). RabbitMQ
// writes empty statistics as [] rather than {}, and so the connection
// details of a channel whose connection is closing.
type channelPublishes struct {
	ConnectionDetails json.RawMessage `json:"connection_details"`
	MessageStats      json.RawMessage `json:"message_stats"`
}

// connection returns the name of the channel's connection ("" when
// RabbitMQ gave none).
func (c channelPublishes) connection() string {
	var d struct {
		Name string `json:"name"`
	}
	mgmtjson.DecodeObject(c.ConnectionDetails, &d)
	return d.Name
}

// published returns the channel's publish counter (0 when it has none).
func (c channelPublishes) published() int64 {
	var st struct {
		Publish int64 `json:"publish"`
	}
	mgmtjson.DecodeObject(c.MessageStats, &st)
	return st.Publish
}

// meanMessageSize is the thesis's mean message size: bytes received over
// the connections that publish, over the messages they published (their
// whole lifetime, AMQP framing included).
func (r *managementReader) meanMessageSize(ctx context.Context) (float64, error) {
	conns, err := r.rh.ListConnections()
	if err != nil {
		return 0, fmt.Errorf("listing connections: %w", err)
	}
	recv := map[string]uint64{}
	for _, c := range conns {
		if c.Vhost == r.site.Vhost && c.Type == "network" {
			recv[c.Name] = c.RecvOct
		}
	}
	endpoint := strings.TrimSuffix(r.site.ManagementURL, "/") + "/api/vhosts/" + url.PathEscape(r.site.Vhost) +
		"/channels?columns=connection_details.name,message_stats.publish"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return 0, err
	}
	req.SetBasicAuth(r.site.ManagementUser, r.site.ManagementPassword)
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("listing channels: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("listing channels: management API answered %s", resp.Status)
	}
	var channels []channelPublishes
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&channels); err != nil {
		return 0, fmt.Errorf("listing channels: %w", err)
	}
	published := map[string]int64{}
	for _, ch := range channels {
		published[ch.connection()] += ch.published()
	}
	var bytes, messages float64
	for name, n := range published {
		if b, ok := recv[name]; ok && n > 0 {
			bytes += float64(b)
			messages += float64(n)
		}
	}
	if messages == 0 {
		return 0, nil
	}
	return bytes / messages, nil
}

// GroupCapacity is one work-queue group's capacity at a site, as its
// luffymq status API reports it.
type GroupCapacity struct {
	// Group is <g> of wq.<g>.
	Group string `json:"group"`
	// OnlineMembers counts the group's online members at the site.
	OnlineMembers int `json:"online_members"`
	// MaxLength is the queue length the site allows (eq. 2.12), Weight
	// its overflow weight (eq. 2.13), Depth the messages it holds.
	MaxLength int `json:"max_length"`
	Weight    int `json:"weight"`
	Depth     int `json:"depth"`
}

// luffyStatus is what a site's luffymq status API says.
type luffyStatus struct {
	connected bool
	groups    []GroupCapacity
	// at is when it was read; fromSite counts, by origin site, the
	// messages of other sites' overflow the site's members took, over
	// every group (BridgeWorkQueue.FromSite: overflow through the intake
	// and messages routed here).
	at       time.Time
	fromSite map[string]uint64
}

// readLuffyMQ reads the site's luffymq status API: the bridge (work
// queues) and the shared groups (online members).
func readLuffyMQ(ctx context.Context, client *http.Client, s Site) (*luffyStatus, error) {
	var br api.BridgeResponse
	if err := getJSON(ctx, client, s, "/api/v1/bridge", &br); err != nil {
		return nil, err
	}
	var gr api.GroupsResponse
	if err := getJSON(ctx, client, s, "/api/v1/groups", &gr); err != nil {
		return nil, err
	}
	st := &luffyStatus{at: time.Now(), fromSite: map[string]uint64{}}
	if br.Bridge == nil {
		return st, nil
	}
	st.connected = br.Bridge.Connected
	for _, wq := range br.Bridge.WorkQueues {
		c := GroupCapacity{Group: wq.Group, MaxLength: wq.MaxLength, Weight: wq.Weight, Depth: wq.Depth}
		for origin, n := range wq.FromSite {
			st.fromSite[origin] += n
		}
		for _, g := range gr.Groups {
			if !strings.HasPrefix(g.Filter, "$share/"+wq.Group+"/") {
				continue
			}
			for _, m := range g.Members {
				if m.Online {
					c.OnlineMembers++
				}
			}
		}
		st.groups = append(st.groups, c)
	}
	return st, nil
}

func getJSON(ctx context.Context, client *http.Client, s Site, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(s.LuffyMQURL, "/")+path, nil)
	if err != nil {
		return err
	}
	if s.LuffyMQToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.LuffyMQToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: luffymq answered %s", path, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}
