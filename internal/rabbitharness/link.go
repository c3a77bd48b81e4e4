package rabbitharness

import (
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// cityDelays holds the one-way delays of scenarios.md §C, in milliseconds.
var cityDelays = map[[2]string]int{
	{"berlin", "tunis"}: 22, {"berlin", "montreal"}: 48, {"berlin", "mexico-city"}: 70, {"berlin", "tokyo"}: 115,
	{"tunis", "montreal"}: 60, {"tunis", "mexico-city"}: 90, {"tunis", "tokyo"}: 120,
	{"montreal", "mexico-city"}: 33, {"montreal", "tokyo"}: 80,
	{"mexico-city", "tokyo"}: 75,
}

// CityDelay returns the one-way delay between two cities of scenarios.md §C
// (Berlin, Tunis, Montréal, Mexico City, Tokyo). Names are matched without
// case or accents, with spaces or '-' ("mexico-city", "Mexico City"); a
// site name may carry a suffix after the city ("berlin-2"). Unknown or equal
// cities give 0.
func CityDelay(a, b string) time.Duration {
	ca, cb := city(a), city(b)
	if ca == "" || cb == "" || ca == cb {
		return 0
	}
	if ms, ok := cityDelays[[2]string{ca, cb}]; ok {
		return time.Duration(ms) * time.Millisecond
	}
	if ms, ok := cityDelays[[2]string{cb, ca}]; ok {
		return time.Duration(ms) * time.Millisecond
	}
	return 0
}

// city normalises a site or city name to a key of cityDelays, or "".
func city(name string) string {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.NewReplacer("é", "e", " ", "-", "_", "-").Replace(n)
	for _, c := range []string{"mexico-city", "berlin", "tunis", "montreal", "tokyo"} {
		if n == c || strings.HasPrefix(n, c+"-") {
			return c
		}
	}
	return ""
}

// Link is a WAN link from one site to another site's node: a TCP proxy that
// delays every byte by a one-way delay in each direction and can be cut.
type Link struct {
	// From and To are the site names.
	From, To string
	// Delay is the one-way delay.
	Delay time.Duration

	mu    sync.Mutex
	proxy *toxiproxy.Proxy
	addr  string
}

// Link returns the link from site from to node to's AMQP port, creating it
// on first use with the harness's delay for the two sites.
func (h *Harness) Link(from, to *Node) (*Link, error) {
	return h.LinkWithDelay(from, to, h.cfg.Delay(from.Site, to.Site))
}

// LinkWithDelay is Link with an explicit one-way delay, used when the link
// is created by this call.
func (h *Harness) LinkWithDelay(from, to *Node, delay time.Duration) (*Link, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key := [2]string{from.Site, to.Site}
	if l, ok := h.links[key]; ok {
		return l, nil
	}
	return h.newLinkLocked(key, "127.0.0.1:0", to, delay)
}

// Expose makes node to's AMQP port reachable at addr (a 127.0.0.1 address)
// through a link without delay, as if a node had appeared there. The link
// is closed with the harness.
func (h *Harness) Expose(addr string, to *Node) (*Link, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.newLinkLocked([2]string{"expose:" + addr, to.Site}, addr, to, 0)
}

func (h *Harness) newLinkLocked(key [2]string, listen string, to *Node, delay time.Duration) (*Link, error) {
	from := key[0]
	if h.proxy == nil {
		h.proxy = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	}
	name := fmt.Sprintf("%s-to-%s", from, to.Site)
	p := toxiproxy.NewProxy(h.proxy, name, listen, to.AMQPAddr())
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rabbitharness: link %s: %w", name, err)
	}
	if delay > 0 {
		for _, stream := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`,
				stream, stream, delay.Milliseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				p.Stop()
				return nil, fmt.Errorf("rabbitharness: link %s: latency: %w", name, err)
			}
		}
	}
	l := &Link{From: from, To: to.Site, Delay: delay, proxy: p, addr: p.Listen}
	h.links[key] = l
	return l, nil
}

// Addr returns the proxy's host:port.
func (l *Link) Addr() string { return l.addr }

// AMQPURL returns the AMQP URI of the remote node reached through the link.
func (l *Link) AMQPURL() string { return "amqp://" + User + ":" + Password + "@" + l.addr + "/%2F" }

// Cut closes every connection through the link and refuses new ones until
// Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.proxy.Stop()
}

// Restore accepts connections again on the same address.
func (l *Link) Restore() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return fmt.Errorf("rabbitharness: restoring link %s->%s on %s: %w", l.From, l.To, l.addr, err)
	}
	return nil
}
