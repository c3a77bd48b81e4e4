package sites

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/mgmtjson"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/timeutil"
)

// sitesEnv is the machinery of one luffy-bench sites invocation: one real
// RabbitMQ node per site (rabbitharness), the WAN links between them
// (toxiproxy with CityDelay, each behind a byte counter) and the luffymq
// binary.
type sitesEnv struct {
	h       *rabbitharness.Harness
	sites   []string
	luffymq string
	logDir  string
	delay   func(a, b string) time.Duration
	// brokerFlags are given to every luffymq (the run's work-queue
	// constants).
	brokerFlags []string

	mu    sync.Mutex
	links map[[2]string]*harness.TCPRelay
}

// startSitesEnv starts a RabbitMQ node per site.
func startSitesEnv(ctx context.Context, sites []string, luffymq, logDir string, delay func(a, b string) time.Duration) (*sitesEnv, error) {
	h, err := rabbitharness.Start(ctx, rabbitharness.Config{Sites: sites, Delay: delay})
	if err != nil {
		return nil, err
	}
	return &sitesEnv{h: h, sites: sites, luffymq: luffymq, logDir: logDir, delay: delay, links: map[[2]string]*harness.TCPRelay{}}, nil
}

// Close stops the links and the nodes.
func (e *sitesEnv) Close() error {
	e.mu.Lock()
	links := e.links
	e.links = nil
	e.mu.Unlock()
	for _, l := range links {
		l.Close()
	}
	return e.h.Close()
}

// node returns site's RabbitMQ node.
func (e *sitesEnv) node(site string) *rabbitharness.Node { return e.h.Node(site) }

// link returns the WAN link from site from to site to's AMQP port: the
// harness's delay proxy behind a byte counter, created on first use.
func (e *sitesEnv) link(from, to string) (*harness.TCPRelay, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l, ok := e.links[[2]string{from, to}]; ok {
		return l, nil
	}
	wan, err := e.h.Link(e.node(from), e.node(to))
	if err != nil {
		return nil, err
	}
	l, err := harness.NewTCPRelay(wan.Addr())
	if err != nil {
		return nil, fmt.Errorf("link %s→%s: %w", from, to, err)
	}
	e.links[[2]string{from, to}] = l
	return l, nil
}

// amqpURL is the AMQP URI of site to's node as seen from site from: the
// node itself when they are the same site, else through the WAN link.
func (e *sitesEnv) amqpURL(from, to string) (string, error) {
	if from == to {
		return e.node(to).AMQPURL(), nil
	}
	l, err := e.link(from, to)
	if err != nil {
		return "", err
	}
	return "amqp://" + rabbitharness.User + ":" + rabbitharness.Password + "@" + l.Addr() + "/%2F", nil
}

// siteBytes is the WAN traffic of one site in bytes.
type siteBytes struct{ Out, In int64 }

// wanBytes returns, per site, the bytes sent and received over every link
// so far (the client side of a link is the from site).
func (e *sitesEnv) wanBytes() map[string]siteBytes {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]siteBytes{}
	for k, l := range e.links {
		up, down := l.Up.Load(), l.Down.Load()
		a, b := out[k[0]], out[k[1]]
		a.Out += up
		a.In += down
		b.In += up
		b.Out += down
		out[k[0]], out[k[1]] = a, b
	}
	return out
}

// dropWAN closes every connection through every WAN link.
func (e *sitesEnv) dropWAN() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.links {
		l.DropConnections()
	}
}

// mgmt returns a management API client of site's node.
func (e *sitesEnv) mgmt(site string) (*rabbithole.Client, error) {
	rh, err := rabbithole.NewClient(e.node(site).ManagementURL(), rabbitharness.User, rabbitharness.Password)
	if err != nil {
		return nil, err
	}
	rh.SetTimeout(10 * time.Second)
	return rh, nil
}

// reset removes from every node what a run left: policies, federation
// upstreams and upstream sets, queues and exchanges other than the
// defaults. Runs start from empty nodes. Every WAN connection is cut
// first (a federation link stopping cleanly over a delayed link takes
// round trips, one link after the other: tens of seconds), then the
// policies go, on every node at once, and reset waits until no federation
// link is left, so that the rest is deleted on quiet nodes; every deletion
// is retried (a node busy stopping links may answer 500 or time out).
func (e *sitesEnv) reset(ctx context.Context) error {
	type step struct {
		what string
		list func(rh *rabbithole.Client) ([]string, error)
		del  func(rh *rabbithole.Client, name string) (*http.Response, error)
	}
	policies := step{"policy", func(rh *rabbithole.Client) ([]string, error) {
		ps, err := rh.ListPoliciesIn("/")
		return names(ps, func(p rabbithole.Policy) string { return p.Name }), err
	}, func(rh *rabbithole.Client, n string) (*http.Response, error) { return rh.DeletePolicy("/", n) }}
	rest := []step{
		{"upstream set", func(rh *rabbithole.Client) ([]string, error) {
			ps, err := rh.ListRuntimeParametersIn("federation-upstream-set", "/")
			return names(ps, func(p rabbithole.RuntimeParameter) string { return p.Name }), err
		}, func(rh *rabbithole.Client, n string) (*http.Response, error) {
			return rh.DeleteRuntimeParameter("federation-upstream-set", "/", n)
		}},
		{"upstream", func(rh *rabbithole.Client) ([]string, error) {
			us, err := rh.ListFederationUpstreamsIn("/")
			return names(us, func(u rabbithole.FederationUpstream) string { return u.Name }), err
		}, func(rh *rabbithole.Client, n string) (*http.Response, error) {
			return rh.DeleteFederationUpstream("/", n)
		}},
		{"queue", func(rh *rabbithole.Client) ([]string, error) {
			qs, err := rh.ListQueuesIn("/")
			return names(qs, func(q rabbithole.QueueInfo) string { return q.Name }), err
		}, func(rh *rabbithole.Client, n string) (*http.Response, error) { return rh.DeleteQueue("/", n) }},
		{"exchange", func(rh *rabbithole.Client) ([]string, error) {
			xs, err := rh.ListExchangesIn("/")
			var out []string
			for _, x := range xs {
				if x.Name != "" && !strings.HasPrefix(x.Name, "amq.") {
					out = append(out, x.Name)
				}
			}
			return out, err
		}, func(rh *rabbithole.Client, n string) (*http.Response, error) { return rh.DeleteExchange("/", n) }},
	}
	apply := func(site string, st step) error {
		rh, err := e.mgmt(site)
		if err != nil {
			return err
		}
		var last error
		for attempt := 0; attempt < 5; attempt++ {
			if attempt > 0 && !timeutil.Sleep(ctx, time.Second) {
				return ctx.Err()
			}
			items, err := st.list(rh)
			if err != nil {
				last = fmt.Errorf("reset %s: listing %ss: %w", site, st.what, err)
				continue
			}
			last = nil
			for _, n := range items {
				res, err := st.del(rh, n)
				if res != nil {
					_ = res.Body.Close()
					if res.StatusCode == http.StatusNotFound {
						continue
					}
				}
				if err != nil {
					last = fmt.Errorf("reset %s: deleting %s %s: %w", site, st.what, n, err)
				}
			}
			if last == nil {
				return nil
			}
		}
		return last
	}
	// Links cut from their upstreams stop at once; every site's policies
	// go in parallel.
	e.dropWAN()
	errs := make([]error, len(e.sites))
	var wg sync.WaitGroup
	for i, site := range e.sites {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = apply(site, policies)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := waitUntil(ctx, 30*time.Second, "federation links stopping", func() bool {
		_, total, err := e.runningLinks(ctx)
		return err == nil && total == 0
	}); err != nil {
		return err
	}
	for _, st := range rest {
		for _, site := range e.sites {
			if err := apply(site, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// names maps xs to their names.
func names[T any](xs []T, name func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = name(x)
	}
	return out
}

// applyLayout sets every site's per-exchange federation to layout (sites
// it does not name get none), upstreams reached through the WAN links;
// tune adjusts each site's configuration before it is applied.
func (e *sitesEnv) applyLayout(ctx context.Context, layout federationLayout, maxHops int, tune func(*bridge.FederationConfig)) error {
	for _, site := range e.sites {
		xs := []bridge.ExchangeFederation{}
		for _, f := range layout[site] {
			x := bridge.ExchangeFederation{Exchange: f.Exchange}
			for _, up := range f.Upstreams {
				uri, err := e.amqpURL(site, up)
				if err != nil {
					return err
				}
				x.Upstreams = append(x.Upstreams, bridge.Upstream{Site: up, URI: uri})
			}
			xs = append(xs, x)
		}
		fc := bridge.FederationConfig{ManagementURL: e.node(site).ManagementURL(), Username: rabbitharness.User, Password: rabbitharness.Password,
			Exchanges: xs, MaxHops: maxHops}
		if tune != nil {
			tune(&fc)
		}
		if err := bridge.ApplyFederation(ctx, fc); err != nil {
			return fmt.Errorf("federation of %s: %w", site, err)
		}
	}
	return nil
}

// applyQueueMesh federates the queue wq.<group> of every site from every
// other site (RabbitMQ queue federation, full mesh).
func (e *sitesEnv) applyQueueMesh(ctx context.Context, queue string) error {
	for _, site := range e.sites {
		if err := ctx.Err(); err != nil {
			return err
		}
		rh, err := e.mgmt(site)
		if err != nil {
			return err
		}
		for _, other := range e.sites {
			if other == site {
				continue
			}
			uri, err := e.amqpURL(site, other)
			if err != nil {
				return err
			}
			res, err := rh.PutFederationUpstream("/", "qf-"+other, rabbithole.FederationDefinition{
				Uri: rabbithole.URISet{uri}, PrefetchCount: 1000, ReconnectDelay: 1, AckMode: "on-confirm", Queue: queue})
			if err := okResponse(res, err); err != nil {
				return fmt.Errorf("queue federation upstream %s at %s: %w", other, site, err)
			}
		}
		res, err := rh.PutPolicy("/", "qf", rabbithole.Policy{Pattern: "^" + regexp.QuoteMeta(queue) + "$", ApplyTo: "queues", Priority: 1,
			Definition: rabbithole.PolicyDefinition{"federation-upstream-set": "all"}})
		if err := okResponse(res, err); err != nil {
			return fmt.Errorf("queue federation policy at %s: %w", site, err)
		}
	}
	return nil
}

func okResponse(res *http.Response, err error) error {
	if res != nil {
		defer res.Body.Close()
		if err == nil && res.StatusCode >= 300 {
			return fmt.Errorf("management API answered %s", res.Status)
		}
	}
	return err
}

// runningLinks counts the federation links of every node whose status is
// "running", and all of them.
func (e *sitesEnv) runningLinks(ctx context.Context) (running, total int, err error) {
	for _, site := range e.sites {
		n := e.node(site)
		links, err := bridge.FederationLinks(ctx, n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
		if err != nil {
			return 0, 0, err
		}
		for _, l := range links {
			total++
			if l.Status == "running" {
				running++
			}
		}
	}
	return running, total, nil
}

// waitLinks waits until want federation links run on the nodes.
func (e *sitesEnv) waitLinks(ctx context.Context, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		running, total, err := e.runningLinks(ctx)
		if err == nil && running >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d federation links running (%d wanted) after %s (last error: %v)", running, total, want, timeout, err)
		}
		if !timeutil.Sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// federatedBindingCount counts the bindings of exchange x at site whose
// destination is a federation link's exchange.
func (e *sitesEnv) federatedBindingCount(site, x string) int {
	rh, err := e.mgmt(site)
	if err != nil {
		return 0
	}
	bs, err := rh.ListExchangeBindingsWithSource("/", x)
	if err != nil {
		return 0
	}
	n := 0
	for _, b := range bs {
		if b.DestinationType == "exchange" && strings.HasPrefix(b.Destination, "federation:") {
			n++
		}
	}
	return n
}

// overlaySampler reads, every second, how many messages each node has
// delivered over federation links (the channels of connections that
// federation links opened to it), keeping the largest figure seen per
// channel so that links removed during a run still count.
type overlaySampler struct {
	e      *sitesEnv
	mu     sync.Mutex
	counts map[string]map[string]int64 // site -> channel -> deliver_get
	stop   chan struct{}
	done   chan struct{}
}

func (e *sitesEnv) startOverlaySampler(ctx context.Context) *overlaySampler {
	s := &overlaySampler{e: e, counts: map[string]map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, site := range e.sites {
		s.counts[site] = map[string]int64{}
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			s.sample(ctx)
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// statsLag is how long RabbitMQ's management statistics may trail what
// happened (collect_statistics_interval is 1 s on the harness's nodes).
const statsLag = 1500 * time.Millisecond

// Stop takes a last sample once the statistics caught up and returns the
// messages each site sent over federation links.
func (s *overlaySampler) Stop(ctx context.Context) map[string]int64 {
	close(s.stop)
	<-s.done
	timeutil.Sleep(ctx, statsLag)
	s.sample(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for site, chans := range s.counts {
		for _, n := range chans {
			out[site] += n
		}
	}
	return out
}

func (s *overlaySampler) sample(ctx context.Context) {
	for _, site := range s.e.sites {
		got, err := federationDeliveries(ctx, s.e.node(site).ManagementURL())
		if err != nil {
			continue
		}
		s.mu.Lock()
		for ch, n := range got {
			s.counts[site][ch] = max(s.counts[site][ch], n)
		}
		s.mu.Unlock()
	}
}

// federationDeliveries returns deliver_get of every channel of a
// federation link connection on the node at mgmtURL.
func federationDeliveries(ctx context.Context, mgmtURL string) (map[string]int64, error) {
	var conns []struct {
		Name       string `json:"name"`
		ClientProp struct {
			ConnectionName string `json:"connection_name"`
		} `json:"client_properties"`
	}
	if err := mgmtGet(ctx, mgmtURL, "/api/connections?columns=name,client_properties", &conns); err != nil {
		return nil, err
	}
	fed := map[string]bool{}
	for _, c := range conns {
		if strings.HasPrefix(c.ClientProp.ConnectionName, "Federation link") {
			fed[c.Name] = true
		}
	}
	if len(fed) == 0 {
		return map[string]int64{}, nil
	}
	// A channel whose connection is closing has "connection_details": [],
	// and one that delivered nothing "message_stats": [].
	var chans []struct {
		Name    string          `json:"name"`
		Details json.RawMessage `json:"connection_details"`
		Stats   json.RawMessage `json:"message_stats"`
	}
	if err := mgmtGet(ctx, mgmtURL, "/api/channels?columns=name,connection_details,message_stats", &chans); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, c := range chans {
		var conn struct {
			Name string `json:"name"`
		}
		var stats struct {
			DeliverGet int64 `json:"deliver_get"`
		}
		if mgmtjson.DecodeObject(c.Details, &conn) && fed[conn.Name] {
			mgmtjson.DecodeObject(c.Stats, &stats)
			out[c.Name] = stats.DeliverGet
		}
	}
	return out, nil
}

// workQueueBacklog counts the messages (ready and unacknowledged) in the
// work queues' queues of every site's node: wq.*, the intakes
// luffymq.wqin.* and the federation links' queues of their exchanges. A
// node that does not answer counts one, so that the drain waits.
func (e *sitesEnv) workQueueBacklog(ctx context.Context) int {
	n := 0
	for _, site := range e.sites {
		var queues []struct {
			Name     string `json:"name"`
			Messages int    `json:"messages"`
		}
		if err := mgmtGet(ctx, e.node(site).ManagementURL(), "/api/queues?columns=name,messages", &queues); err != nil {
			n++
			continue
		}
		for _, q := range queues {
			if strings.Contains(q.Name, "wq.") || strings.HasPrefix(q.Name, "luffymq.wqin.") {
				n += q.Messages
			}
		}
	}
	return n
}

func mgmtGet(ctx context.Context, base, path string, v any) error {
	return getJSON(ctx, base+path, true, v)
}

// getJSON GETs url (with the nodes' credentials when auth is set) and
// decodes its JSON body into v.
func getJSON(ctx context.Context, url string, auth bool, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if auth {
		req.SetBasicAuth(rabbitharness.User, rabbitharness.Password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// siteBroker is a luffymq process serving one site.
type siteBroker struct {
	*harness.Process
	site string
	// httpAddr serves its /metrics.
	httpAddr string
}

// stateTraffic is what a site's brokers sent of the work-queue state
// exchange (--wq-route nearest): states to other sites, and requests for
// states (each one federated to every other site). StatesTo splits the
// states by the site they went to.
type stateTraffic struct {
	States, Requests int64
	StatesTo         map[string]int64
	// StatesWhy splits the states by why they were sent.
	StatesWhy map[string]int64
}

// stateTraffic reads b's luffymq_bridge_wq_states_sent_total and
// luffymq_bridge_wq_state_requests_sent_total.
func (b *siteBroker) stateTraffic(ctx context.Context) (stateTraffic, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.httpAddr+"/metrics", nil)
	if err != nil {
		return stateTraffic{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return stateTraffic{}, fmt.Errorf("reading %s's metrics: %w", b.site, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return stateTraffic{}, fmt.Errorf("reading %s's metrics: %s", b.site, resp.Status)
	}
	return parseStateTraffic(resp.Body)
}

// toLabel and reasonLabel find a sample's to="..." and reason="..."
// labels.
var (
	toLabel     = regexp.MustCompile(`[{,]to="([^"]*)"`)
	reasonLabel = regexp.MustCompile(`[{,]reason="([^"]*)"`)
)

// parseStateTraffic sums the state counters in Prometheus text.
func parseStateTraffic(r io.Reader) (stateTraffic, error) {
	t := stateTraffic{StatesTo: map[string]int64{}, StatesWhy: map[string]int64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		if name != "luffymq_bridge_wq_states_sent_total" && name != "luffymq_bridge_wq_state_requests_sent_total" && name != "luffymq_bridge_wq_states_sent_by_reason_total" {
			continue
		}
		_, value, ok := strings.Cut(line, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if !ok || err != nil {
			return t, fmt.Errorf("metric line %q: not a sample", line)
		}
		switch name {
		case "luffymq_bridge_wq_state_requests_sent_total":
			t.Requests += int64(v)
		case "luffymq_bridge_wq_states_sent_by_reason_total":
			if m := reasonLabel.FindStringSubmatch(line); m != nil {
				t.StatesWhy[m[1]] += int64(v)
			}
		default:
			t.States += int64(v)
			if m := toLabel.FindStringSubmatch(line); m != nil {
				t.StatesTo[m[1]] += int64(v)
			}
		}
	}
	return t, sc.Err()
}

// stateTrafficOf reads the state traffic of brokers, by the site of each.
func stateTrafficOf(ctx context.Context, brokers []*siteBroker) (map[string]stateTraffic, error) {
	out := map[string]stateTraffic{}
	for _, b := range brokers {
		t, err := b.stateTraffic(ctx)
		if err != nil {
			return nil, err
		}
		out[b.site] = t
	}
	return out, nil
}

// startSiteBroker starts luffymq for site with the bridge on the site's
// node and extra flags.
func (e *sitesEnv) startSiteBroker(ctx context.Context, site, logName string, extra ...string) (*siteBroker, error) {
	n := e.node(site)
	var httpAddr string
	p, err := harness.StartProcess(ctx, e.luffymq, filepath.Join(e.logDir, logName+"."+site+".broker.log"), func(addr string) ([]string, error) {
		var err error
		if httpAddr, err = harness.FreeAddr(); err != nil {
			return nil, err
		}
		args := []string{"--listen", addr, "--http", httpAddr, "--log-level", brokerLogLevel(),
			"--amqp-url", n.AMQPURL(), "--amqp-management-url", n.ManagementURL(), "--site", site}
		args = append(args, e.brokerFlags...)
		return append(args, extra...), nil
	})
	if err != nil {
		return nil, fmt.Errorf("luffymq at %s: %w", site, err)
	}
	return &siteBroker{Process: p, site: site, httpAddr: httpAddr}, nil
}

// brokerLogLevel is the luffymq log level: LUFFY_BENCH_SITES_LOG_LEVEL,
// or warn.
func brokerLogLevel() string {
	if l := os.Getenv("LUFFY_BENCH_SITES_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}
