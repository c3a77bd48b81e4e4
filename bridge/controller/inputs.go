package controller

import (
	"sort"

	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/bridge/siteconfig"
)

// InstanceRates is what one site's instance of a pubsub* exchange carried
// over the last period, in messages per second (placement.Instance), with
// the figures they come from.
type InstanceRates struct {
	// Site holds the instance.
	Site string `json:"site"`
	// LocalPublished is P^in: publishes into the exchange minus those of
	// the federation links.
	LocalPublished float64 `json:"local_published_per_s"`
	// LocalConsumed is P^out: messages routed to the site's own queues
	// (routed in total minus routed into federation queues).
	LocalConsumed float64 `json:"local_consumed_per_s"`
	// OverlayIn is T^in: messages the site's federation links published
	// into the exchange.
	OverlayIn float64 `json:"overlay_in_per_s"`
	// OverlayOut is T^out: messages delivered from the exchange's
	// federation queues to other sites.
	OverlayOut float64 `json:"overlay_out_per_s"`
	// Backlog is what the exchange's federation queues hold now.
	BacklogMessages int64 `json:"backlog_messages"`
	BacklogBytes    int64 `json:"backlog_bytes"`
}

// siteRates are the rates computed from one site's last two samples.
type siteRates struct {
	// periodSeconds is the time between the two samples.
	periodSeconds   float64
	exchanges       map[string]InstanceRates
	meanMessageSize float64
}

// ratesBetween computes a site's rates over the interval between two of
// its samples: counter differences over the time between them. An
// exchange or counter that is new or was reset since counts from zero.
func ratesBetween(site string, prev, cur *siteSample) siteRates {
	r := siteRates{exchanges: map[string]InstanceRates{}, meanMessageSize: cur.meanMessageSize}
	dt := cur.at.Sub(prev.at).Seconds()
	if dt > 0 {
		r.periodSeconds = dt
	}
	for name, x := range cur.exchanges {
		before := prev.exchanges[name]
		rate := func(get func(*exchangeSample) counter) float64 {
			if dt <= 0 {
				return 0
			}
			c := get(x)
			if before != nil {
				if b := get(before); c >= b {
					return float64(c-b) / dt
				}
			}
			return float64(c) / dt // new or reset: counted from zero
		}
		in := rate(func(e *exchangeSample) counter { return e.publishIn })
		out := rate(func(e *exchangeSample) counter { return e.publishOut })
		ovIn := rate(func(e *exchangeSample) counter { return e.overlayIn })
		ovOut := rate(func(e *exchangeSample) counter { return e.overlayOut })
		enq := rate(func(e *exchangeSample) counter { return e.overlayEnqueued })
		r.exchanges[name] = InstanceRates{
			Site:            site,
			LocalPublished:  max(0, in-ovIn),
			LocalConsumed:   max(0, out-enq),
			OverlayIn:       ovIn,
			OverlayOut:      ovOut,
			BacklogMessages: x.backlogMessages,
			BacklogBytes:    x.backlogBytes,
		}
	}
	return r
}

// ExchangeInput is one global exchange as the controller fed it to
// placement.
type ExchangeInput struct {
	Name string `json:"name"`
	// MeanMessageSize is D(E_i) in bytes: the instances' sites' mean
	// message sizes weighted by their local publishes.
	MeanMessageSize float64         `json:"mean_message_size"`
	Instances       []InstanceRates `json:"instances"`
}

// buildInput assembles placement's input from every known site's rates:
// the global exchanges are the pubsub* exchanges present at two sites or
// more.
func buildInput(sites *Sites, rates map[string]*siteRates, previous map[string]string, lambda float64, seed uint64) (placement.Input, []ExchangeInput) {
	in := placement.Input{Delays: sites.Delays, Lambda: lambda, Seed: seed, Previous: placement.Plan{}}
	for _, s := range sites.Sites {
		in.Sites = append(in.Sites, placement.Site{Name: s.Name, InboundBandwidth: float64(s.InboundBandwidth), OutboundBandwidth: float64(s.OutboundBandwidth)})
	}
	holders := map[string][]string{}
	for _, s := range sites.Sites {
		r := rates[s.Name]
		if r == nil {
			continue
		}
		for x := range r.exchanges {
			holders[x] = append(holders[x], s.Name)
		}
	}
	names := make([]string, 0, len(holders))
	for x, hs := range holders {
		if len(hs) >= 2 {
			names = append(names, x)
		}
	}
	sort.Strings(names)
	var summary []ExchangeInput
	for _, x := range names {
		e := placement.Exchange{Name: x}
		ei := ExchangeInput{Name: x}
		var weighted, weight, plain float64
		var sized int
		for _, site := range holders[x] {
			r := rates[site]
			ir := r.exchanges[x]
			e.Instances = append(e.Instances, placement.Instance{
				Site: site, LocalPublished: ir.LocalPublished, LocalConsumed: ir.LocalConsumed,
				OverlayIn: ir.OverlayIn, OverlayOut: ir.OverlayOut,
			})
			ei.Instances = append(ei.Instances, ir)
			if r.meanMessageSize > 0 {
				weighted += ir.LocalPublished * r.meanMessageSize
				weight += ir.LocalPublished
				plain += r.meanMessageSize
				sized++
			}
		}
		switch {
		case weight > 0:
			e.MeanMessageSize = weighted / weight
		case sized > 0:
			e.MeanMessageSize = plain / float64(sized)
		}
		ei.MeanMessageSize = e.MeanMessageSize
		if p, ok := previous[x]; ok {
			in.Previous[x] = p
		}
		in.Exchanges = append(in.Exchanges, e)
		summary = append(summary, ei)
	}
	return in, summary
}

// recoverPrevious guesses, for global exchanges the controller has not
// placed yet (after a restart), the synchronisation site the sites' links
// show: the one instance that federates the exchange from more than one
// upstream. Exchanges with two instances (both federate from the other)
// or no such site are left out.
func recoverPrevious(in placement.Input, samples map[string]*siteSample, known map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range known {
		out[k] = v
	}
	for _, x := range in.Exchanges {
		if _, ok := out[x.Name]; ok {
			continue
		}
		best, bestLinks, tie := "", 0, false
		for _, inst := range x.Instances {
			s := samples[inst.Site]
			if s == nil {
				continue
			}
			switch n := s.links[x.Name]; {
			case n > bestLinks:
				best, bestLinks, tie = inst.Site, n, false
			case n == bestLinks:
				tie = true
			}
		}
		if best != "" && bestLinks > 1 && !tie {
			out[x.Name] = best
		}
	}
	return out
}

// desiredConfigs translates a plan into each site's configuration (§2.6):
// for every global exchange, its synchronisation site federates it from
// every other instance and every other instance from the synchronisation
// site (2·(N_i−1) links instead of the full mesh's N_i·(N_i−1)); every
// work queue wq.<g> present at two sites or more is federated between all
// of them (each site's intake from the others' dead-letter exchanges, as
// the thesis's consistent-hash overflow needs). Upstream URIs follow the
// order of the sites file.
func desiredConfigs(sites *Sites, in placement.Input, plan placement.Plan, workQueues map[string][]string) map[string]siteconfig.SiteConfig {
	out := map[string]siteconfig.SiteConfig{}
	for _, s := range sites.Sites {
		out[s.Name] = siteconfig.SiteConfig{}
	}
	order := map[string]int{}
	for i, s := range sites.Sites {
		order[s.Name] = i
	}
	byOrder := func(names []string) []string {
		sorted := append([]string(nil), names...)
		sort.Slice(sorted, func(i, j int) bool { return order[sorted[i]] < order[sorted[j]] })
		return sorted
	}
	uri := func(from, to string) string {
		f, _ := sites.Site(from)
		t, _ := sites.Site(to)
		return t.UpstreamURL(f)
	}
	for _, x := range in.Exchanges {
		sync := plan[x.Name]
		var holders []string
		for _, inst := range x.Instances {
			holders = append(holders, inst.Site)
		}
		holders = byOrder(holders)
		for _, h := range holders {
			if h == sync {
				for _, other := range holders {
					if other != sync {
						out[sync][x.Name] = append(out[sync][x.Name], uri(sync, other))
					}
				}
			} else {
				out[h][x.Name] = []string{uri(h, sync)}
			}
		}
	}
	for q, holders := range workQueues {
		if len(holders) < 2 {
			continue
		}
		holders = byOrder(holders)
		for _, h := range holders {
			for _, other := range holders {
				if other != h {
					out[h][q] = append(out[h][q], uri(h, other))
				}
			}
		}
	}
	return out
}

// workQueueHolders maps each wq.<g> queue to the sites holding it.
func workQueueHolders(sites *Sites, samples map[string]*siteSample) map[string][]string {
	out := map[string][]string{}
	for _, s := range sites.Sites {
		sample := samples[s.Name]
		if sample == nil {
			continue
		}
		for _, q := range sample.workQueues {
			out[q] = append(out[q], s.Name)
		}
	}
	return out
}

// WorkQueueTraffic is the work-queue overflow a site receives from and sends to
// the other sites over the overlay, in bytes per second.
type WorkQueueTraffic struct {
	In  float64 `json:"inbound_bytes_per_s"`
	Out float64 `json:"outbound_bytes_per_s"`
}

// overflowRates turns two reads of a site's luffymq status API into the
// overflow its members took from each other site, in messages per second.
// A counter that went back (luffymq restarted) counts from zero.
func overflowRates(prev, cur *luffyStatus) map[string]float64 {
	out := map[string]float64{}
	dt := cur.at.Sub(prev.at).Seconds()
	if dt <= 0 {
		return out
	}
	for origin, n := range cur.fromSite {
		if b, ok := prev.fromSite[origin]; ok && n >= b {
			n -= b
		}
		if n > 0 {
			out[origin] = float64(n) / dt
		}
	}
	return out
}

// workQueueTraffic estimates each site's work-queue overflow over the
// overlay from what receivers report (received: receiver -> origin ->
// messages per second): a receiver's inbound is what it took from every
// origin, an origin's outbound what every receiver took from it, both
// times the receiver's mean message size. Messages that crossed and were
// not taken yet are not counted, so it errs low.
func workQueueTraffic(received map[string]map[string]float64, sizes map[string]float64) map[string]WorkQueueTraffic {
	out := map[string]WorkQueueTraffic{}
	for receiver, from := range received {
		for origin, rate := range from {
			if origin == receiver {
				continue
			}
			bytes := rate * sizes[receiver]
			r := out[receiver]
			r.In += bytes
			out[receiver] = r
			o := out[origin]
			o.Out += bytes
			out[origin] = o
		}
	}
	return out
}
