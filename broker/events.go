package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/scoring"
)

// Live view of the broker for the dashboard: GET /api/v1/events streams,
// as Server-Sent Events, the history of the last minutes on connect and a
// snapshot every second.

const (
	// SampleInterval is how often the broker samples its rates into the
	// history and sends a snapshot to every event stream.
	SampleInterval = time.Second
	// HistoryLength is how many samples the history keeps (10 minutes).
	HistoryLength = 600
	// MaxMemberSeries bounds the members recorded per history sample:
	// those with the most selections per second, then by group and ID.
	MaxMemberSeries = 16
	// MaxEventStreams bounds the event streams served at once; more are
	// refused with 503 (the dashboard then polls).
	MaxEventStreams = 16
	// federationCheckInterval is how often the federation links are read
	// from the site's RabbitMQ management API.
	federationCheckInterval = 10 * time.Second
)

// memberKey names a member of a group.
type memberKey struct{ group, client string }

// counterSample is what the sampler remembers of the previous sample to
// turn counters into rates.
type counterSample struct {
	at                 time.Time
	in, out, dropped   int64
	selections         map[memberKey]uint64
	exported, imported map[string]uint64
}

// historyRing keeps the newest samples, oldest overwritten first.
type historyRing struct {
	buf  []HistoryPoint
	next int
	n    int
}

func newHistoryRing(size int) *historyRing { return &historyRing{buf: make([]HistoryPoint, size)} }

func (r *historyRing) add(p HistoryPoint) {
	r.buf[r.next] = p
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// points returns the samples held, oldest first.
func (r *historyRing) points() []HistoryPoint {
	out := make([]HistoryPoint, 0, r.n)
	for i := r.n; i > 0; i-- {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}

// latest returns the newest sample, or nil.
func (r *historyRing) latest() *HistoryPoint {
	if r.n == 0 {
		return nil
	}
	p := r.buf[(r.next-1+len(r.buf))%len(r.buf)]
	return &p
}

// liveState samples the broker every SampleInterval into the history and
// wakes the event streams.
type liveState struct {
	b *Broker

	mu      sync.Mutex
	history *historyRing
	prev    counterSample
	bridge  *BridgeStatus
	fed     federationState
	tick    chan struct{} // closed after each sample, then replaced

	streams  atomic.Int32
	stopping chan struct{} // closed by stop: streams and sampler end
	stopOnce sync.Once
	done     chan struct{} // closed when the sampler has ended
	started  atomic.Bool

	sessions *sessionTimes

	rankScratch []MemberPoint // every member's point, reused by each sample
	dropping    []ClientDrops // clients that lost the most, as of the last sample
}

// federationState is the last read of the federation links.
type federationState struct {
	links []FederationLinkStatus
	err   string
}

func newLiveState(b *Broker) (*liveState, error) {
	l := &liveState{
		b:        b,
		history:  newHistoryRing(HistoryLength),
		tick:     make(chan struct{}),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
		sessions: new(sessionTimes),
	}
	if err := b.server.AddHook(l.sessions, nil); err != nil {
		return nil, err
	}
	if err := b.server.AddHook(new(writeQueueDrops), nil); err != nil {
		return nil, err
	}
	return l, nil
}

// start begins sampling.
func (l *liveState) start() {
	if l.started.Swap(true) {
		return
	}
	l.mu.Lock()
	l.prev = l.readCounters(time.Now(), l.b.engine.Snapshot())
	l.mu.Unlock()
	go l.run()
}

// stop ends sampling and every event stream; it waits for the sampler.
func (l *liveState) stop() {
	l.stopOnce.Do(func() { close(l.stopping) })
	if l.started.Load() {
		<-l.done
	}
}

func (l *liveState) run() {
	defer close(l.done)
	sample := time.NewTicker(SampleInterval)
	defer sample.Stop()
	var fedTick <-chan time.Time
	if l.b.bridge != nil && l.b.cfg.AMQPManagementURL != "" {
		t := time.NewTicker(federationCheckInterval)
		defer t.Stop()
		fedTick = t.C
		go l.readFederation()
	}
	for {
		select {
		case <-l.stopping:
			return
		case now := <-sample.C:
			l.sample(now)
		case <-fedTick:
			go l.readFederation()
		}
	}
}

// readCounters reads the counters the history is built from.
func (l *liveState) readCounters(now time.Time, groups []scoring.GroupSnapshot) counterSample {
	info := l.b.server.Info
	c := counterSample{
		at:         now,
		in:         atomic.LoadInt64(&info.MessagesReceived),
		out:        atomic.LoadInt64(&info.MessagesSent),
		dropped:    atomic.LoadInt64(&info.MessagesDropped) + int64(l.b.guard.Outbox.DroppedQoS0.Load()),
		selections: map[memberKey]uint64{},
	}
	for _, g := range groups {
		for _, m := range g.Members {
			c.selections[memberKey{g.Filter, m.ClientID}] = m.Selections
		}
	}
	if l.b.bridge != nil {
		c.exported, c.imported = l.b.bridge.Counts()
	}
	return c
}

// sample records one history point and wakes the event streams.
func (l *liveState) sample(now time.Time) {
	groups := l.b.engine.Snapshot()
	cur := l.readCounters(now, groups)
	// Listing the dropping clients walks a copy of Mochi's client map,
	// an allocation the size of the fleet. Only this goroutine writes
	// l.prev and l.dropping, so it may read them unlocked: rescan when
	// a drop was counted since the last sample (every per-client count
	// is also in cur.dropped), or while the last list named clients,
	// which may since have gone.
	dropping := l.dropping
	if cur.dropped != l.prev.dropped || len(dropping) > 0 {
		dropping = l.b.droppingClients(MaxDroppingClients)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	secs := now.Sub(l.prev.at).Seconds()
	rate := func(cur, prev float64) float64 {
		if secs <= 0 || cur < prev {
			return 0
		}
		return (cur - prev) / secs
	}
	p := HistoryPoint{
		TimeMs:            now.UnixMilli(),
		MessagesInPerSec:  rate(float64(cur.in), float64(l.prev.in)),
		MessagesOutPerSec: rate(float64(cur.out), float64(l.prev.out)),
		DroppedPerSec:     rate(float64(cur.dropped), float64(l.prev.dropped)),
	}
	ranked := l.rankScratch[:0]
	for _, g := range groups {
		for _, m := range g.Members {
			k := memberKey{g.Filter, m.ClientID}
			ranked = append(ranked, MemberPoint{
				Group:            g.Filter,
				ClientID:         m.ClientID,
				SelectionsPerSec: rate(float64(cur.selections[k]), float64(l.prev.selections[k])),
				PredictedWaitMs:  millis(m.PredictedWait),
			})
		}
	}
	sort.Slice(ranked, func(i, j int) bool {
		a, b := ranked[i], ranked[j]
		if a.SelectionsPerSec != b.SelectionsPerSec {
			return a.SelectionsPerSec > b.SelectionsPerSec
		}
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		return a.ClientID < b.ClientID
	})
	// The history keeps a copy of the busiest members, never a slice of
	// the scratch buffer: with one point per member per second kept for
	// HistoryLength samples, 2 000 members cost 57 MB.
	p.Members = slices.Clone(ranked[:min(len(ranked), MaxMemberSeries)])
	if p.Members == nil {
		p.Members = []MemberPoint{}
	}
	l.rankScratch = ranked[:0]
	l.history.add(p)
	l.dropping = dropping
	if l.b.bridge != nil {
		l.bridge = l.bridgeStatus(cur, rate)
	}
	l.prev = cur
	close(l.tick)
	l.tick = make(chan struct{})
}

// bridgeStatus describes the bridge; rate turns the exchange counters into
// per-second rates since the previous sample. Called with l.mu held.
func (l *liveState) bridgeStatus(cur counterSample, rate func(cur, prev float64) float64) *BridgeStatus {
	br := l.b.bridge
	s := &BridgeStatus{
		Site:            l.b.cfg.Site,
		Connected:       br.Connected(),
		ImportQueue:     br.ImportQueue(),
		Exports:         append([]string{}, l.b.cfg.Exports...),
		Exchanges:       []BridgeExchange{},
		Bindings:        []BridgeBinding{},
		WorkQueues:      []BridgeWorkQueue{},
		FederationLinks: l.fed.links,
		FederationError: l.fed.err,
	}
	rc := br.ReconfigStats()
	s.Reconfig = BridgeReconfig{
		Moves: rc.Moves, LinksAdded: rc.LinksAdded, LinksRemoved: rc.LinksRemoved,
		RequestsSent: rc.RequestsSent, RequestsPending: rc.RequestsPending, RequestsHandled: rc.RequestsHandled,
		Conserved: rc.Conserved, Discarded: rc.Discarded,
	}
	bindings := br.Bindings()
	perExchange := map[string]int{}
	for _, bd := range bindings {
		s.Bindings = append(s.Bindings, BridgeBinding{Exchange: bd.Exchange, Key: bd.Key})
		perExchange[bd.Exchange]++
	}
	for _, x := range br.Exchanges() {
		s.Exchanges = append(s.Exchanges, BridgeExchange{
			Name:             x,
			Exported:         cur.exported[x],
			Imported:         cur.imported[x],
			ExportedPerSec:   rate(float64(cur.exported[x]), float64(l.prev.exported[x])),
			ImportedPerSec:   rate(float64(cur.imported[x]), float64(l.prev.imported[x])),
			ImportedBindings: perExchange[x],
		})
	}
	for g, w := range br.WorkQueueStats() {
		s.WorkQueues = append(s.WorkQueues, BridgeWorkQueue{
			Group: g, Depth: w.InQueue, MaxLength: w.MaxLength, TTLMs: millis(w.TTL), Weight: w.Weight,
			Local: w.Local, OwnOverflow: w.OwnOverflow, OverflowAtPublish: w.OverflowAtPublish, RoutedTo: w.RoutedTo, StatesFresh: w.StatesFresh, StatesWanted: w.StatesWanted, FromOtherSites: w.FromOtherSites, FromSite: w.FromSite,
			Completed: w.Completed, Requeued: w.Requeued, Duplicates: w.Duplicates,
		})
	}
	sort.Slice(s.WorkQueues, func(i, j int) bool { return s.WorkQueues[i].Group < s.WorkQueues[j].Group })
	return s
}

// readFederation reads the federation links from the site's RabbitMQ
// management API (at most 5 s).
func (l *liveState) readFederation() {
	cfg := l.b.cfg
	user, pass := cfg.WorkQueue.Username, cfg.WorkQueue.Password
	if user == "" {
		user, pass = "guest", "guest"
		if u, err := url.Parse(cfg.AMQPURL); err == nil && u.User != nil {
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st federationState
	links, err := bridge.FederationLinks(ctx, cfg.AMQPManagementURL, user, pass)
	if err != nil {
		st.err = err.Error()
	} else {
		st.links = make([]FederationLinkStatus, 0, len(links))
		for _, k := range links {
			st.links = append(st.links, FederationLinkStatus{Upstream: k.Upstream, Exchange: k.Exchange, Status: k.Status, Error: k.Error})
		}
	}
	l.mu.Lock()
	l.fed = st
	l.mu.Unlock()
}

// History returns the samples of the last minutes, oldest first.
func (b *Broker) History() HistoryEvent {
	b.live.mu.Lock()
	defer b.live.mu.Unlock()
	return HistoryEvent{IntervalMs: millis(SampleInterval), Points: b.live.history.points()}
}

// Snapshot returns what a "snapshot" event carries now.
func (b *Broker) Snapshot() SnapshotEvent {
	s := SnapshotEvent{
		TimeMs:          time.Now().UnixMilli(),
		Overview:        b.Overview(),
		Groups:          b.Groups().Groups,
		RejectedReports: b.RejectedReports().RejectedReports,
	}
	b.live.mu.Lock()
	s.Rates = b.live.history.latest()
	s.Bridge = b.live.bridge
	s.DroppingClients = b.live.dropping
	b.live.mu.Unlock()
	if s.DroppingClients == nil {
		s.DroppingClients = []ClientDrops{}
	}
	return s
}

// RejectedReports returns the most recent load reports the broker refused,
// newest first.
func (b *Broker) RejectedReports() RejectedReportsResponse {
	resp := RejectedReportsResponse{RejectedReports: []RejectedReportStatus{}}
	for _, r := range b.selection.RecentRejections() {
		resp.RejectedReports = append(resp.RejectedReports, RejectedReportStatus{
			TimeMs: r.Time.UnixMilli(), ClientID: r.ClientID, Channel: r.Channel, Reason: r.Reason,
		})
	}
	return resp
}

// BridgeStatus returns the site bridge's state as of the last sample, or
// nil when the bridge is off.
func (b *Broker) BridgeStatus() *BridgeStatus {
	b.live.mu.Lock()
	defer b.live.mu.Unlock()
	return b.live.bridge
}

// serveEvents streams the history, then a snapshot every SampleInterval,
// as Server-Sent Events, until the client goes or the broker closes.
func (b *Broker) serveEvents(w http.ResponseWriter, r *http.Request) {
	l := b.live
	if n := l.streams.Add(1); n > MaxEventStreams {
		l.streams.Add(-1)
		w.Header().Set("Retry-After", "10")
		http.Error(w, "too many event streams; poll /api/v1/overview and /api/v1/groups", http.StatusServiceUnavailable)
		return
	}
	defer l.streams.Add(-1)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	send := func(event string, data any) error {
		body, err := json.Marshal(data)
		if err != nil {
			return err
		}
		// A client that takes nothing for 10 s is dropped.
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 0, len(body)+len(event)+16)
		buf = append(buf, "event: "...)
		buf = append(buf, event...)
		buf = append(buf, "\ndata: "...)
		buf = append(buf, body...) // JSON from Marshal holds no newline
		buf = append(buf, "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return err
		}
		return rc.Flush()
	}
	if _, err := w.Write([]byte("retry: 2000\n\n")); err != nil {
		return
	}
	if send("history", b.History()) != nil || send("snapshot", b.Snapshot()) != nil {
		return
	}
	for {
		l.mu.Lock()
		tick := l.tick
		l.mu.Unlock()
		select {
		case <-r.Context().Done():
			return
		case <-l.stopping:
			return
		case <-tick:
		}
		if send("snapshot", b.Snapshot()) != nil {
			return
		}
	}
}

// sessionTimes is a Mochi hook that remembers when each live connection
// established its session (for GET /api/v1/clients).
type sessionTimes struct {
	mqtt.HookBase
	since sync.Map // *mqtt.Client → time.Time
}

// ID identifies the hook to Mochi.
func (h *sessionTimes) ID() string { return "luffymq-session-times" }

// Provides tells Mochi which events the hook handles.
func (h *sessionTimes) Provides(b byte) bool {
	return b == mqtt.OnSessionEstablished || b == mqtt.OnDisconnect
}

// OnSessionEstablished records when the client's session was established.
func (h *sessionTimes) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	h.since.Store(cl, time.Now())
}

// OnDisconnect forgets the connection.
func (h *sessionTimes) OnDisconnect(cl *mqtt.Client, _ error, _ bool) { h.since.Delete(cl) }

// connectedSince returns when cl's connection established its session.
func (h *sessionTimes) connectedSince(cl *mqtt.Client) (time.Time, bool) {
	v, ok := h.since.Load(cl)
	if !ok {
		return time.Time{}, false
	}
	return v.(time.Time), true
}
