package controller

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge/placement"
)

// triangleSites are sites a, b and c, 40 ms from each other, each with
// the given inbound bandwidth ("" for unlimited).
func triangleSites(t *testing.T, inbound string) *Sites {
	t.Helper()
	var b strings.Builder
	b.WriteString("sites:\n")
	for _, s := range []string{"a", "b", "c"} {
		fmt.Fprintf(&b, "  - {name: %s, amqp_url: \"amqp://%s:5672/\", management_url: \"http://%s:15672\"", s, s, s)
		if inbound != "" {
			fmt.Fprintf(&b, ", inbound_bandwidth: %s", inbound)
		}
		b.WriteString("}\n")
	}
	b.WriteString("delays_ms: {a: {b: 40, c: 40}, b: {c: 40}}\n")
	ss, err := ParseSites("triangle.yaml", []byte(b.String()))
	require.NoError(t, err, b.String())
	return ss
}

// quietController returns a controller over sites whose logs are dropped.
func quietController(t *testing.T, cfg Config) *Controller {
	t.Helper()
	cfg.Period, cfg.Lambda, cfg.Logger = time.Minute, DefaultLambda, slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// pattern is one period's traffic of pubsub.x: messages per second
// published at a, b and c. Every site consumes 30 messages per second.
type pattern [3]float64

var (
	busyA = pattern{60, 20, 20}
	busyB = pattern{20, 60, 20}
	busyC = pattern{20, 20, 60}
)

// simulate runs the controller's decision step (smoothing, placement,
// hysteresis: what Round does between reading the sites and publishing)
// over one pattern per one-minute period, and returns the synchronisation
// site of pubsub.x after each round and the moves held.
func simulate(t *testing.T, halfLife, margin float64, patterns []pattern) (sites []string, held int) {
	t.Helper()
	c := quietController(t, Config{Sites: triangleSites(t, ""), RateHalfLife: halfLife, MoveMargin: margin})
	plan := placement.Plan{}
	for round, p := range patterns {
		rates := map[string]*siteRates{}
		for i, s := range []string{"a", "b", "c"} {
			raw := siteRates{periodSeconds: 60, meanMessageSize: 1000, exchanges: map[string]InstanceRates{
				"pubsub.x": {Site: s, LocalPublished: p[i], LocalConsumed: 30},
			}}
			r := c.damp.smooth(s, raw)
			rates[s] = &r
		}
		dec, err := c.decide(rates, nil, nil, plan, uint64(round))
		require.NoError(t, err)
		plan = dec.result.Plan
		sites = append(sites, plan["pubsub.x"])
		held += len(dec.held)
	}
	return sites, held
}

func moves(sites []string) int {
	n := 0
	for i := 1; i < len(sites); i++ {
		if sites[i] != sites[i-1] {
			n++
		}
	}
	return n
}

func repeat(n int, ps ...pattern) []pattern {
	var out []pattern
	for range n {
		out = append(out, ps...)
	}
	return out
}

// TestDampingStopsFlippingOnAlternatingTraffic alternates the busy site of
// pubsub.x between a and b every period. On one period's rates the best
// site flips each round (a: 42.7 ms, b: 58.7 ms, λ's share 1.1 ms, and the
// reverse), so the undamped controller moves every round. Smoothed with a
// half-life of one period, the shares swing by a third of that (a 46.7 %,
// b 33.3 %, and the reverse): the new site is still cheaper (49.1 ms with
// λ against 53.3 ms), so smoothing alone still flips, and so does the
// margin alone on raw rates (43.8 / 58.7 = 0.75 < 0.9); with both, the
// gain (8 %) stays within the 10 % margin and the plan stays put.
func TestDampingStopsFlippingOnAlternatingTraffic(t *testing.T) {
	alternating := repeat(8, busyA, busyB)

	undamped, held := simulate(t, 0, 0, alternating)
	require.Equal(t, len(alternating)-1, moves(undamped), "undamped: a move every round %v", undamped)
	require.Zero(t, held)

	smoothingOnly, _ := simulate(t, DefaultRateHalfLife, 0, alternating)
	require.Greater(t, moves(smoothingOnly), len(alternating)/2, "smoothing alone: %v", smoothingOnly)

	marginOnly, _ := simulate(t, 0, DefaultMoveMargin, alternating)
	require.Equal(t, len(alternating)-1, moves(marginOnly), "margin alone: %v", marginOnly)

	damped, held := simulate(t, DefaultRateHalfLife, DefaultMoveMargin, alternating)
	require.Zero(t, moves(damped), "damped: %v", damped)
	require.Equal(t, "a", damped[0])
	require.Positive(t, held, "the hysteresis held moves placement asked for")
}

// TestDampingAdaptsToLastingChange moves the busy site from a to b for
// good (ps-dynamic's case: the busy site moves and stays). Undamped, the
// synchronisation site follows in the first round after the change. With
// the defaults (half-life one period, margin 10 %) it follows in the
// second: after one period the smoothed traffic weighs both patterns
// alike (a and b 40 % each: equal costs, no move); after two, the new one
// weighs ¾ (b 50 %, a 30 %: 47.8 ms with λ at b against 54.7 ms at a,
// a gain of 13 % > 10 %). The bound asserted is two rounds, and the site
// stays at b afterwards.
func TestDampingAdaptsToLastingChange(t *testing.T) {
	const before = 4
	traffic := append(repeat(before, busyA), repeat(8, busyB)...)
	follows := func(sites []string) int {
		for i := before; i < len(sites); i++ {
			if sites[i] == "b" {
				for _, s := range sites[i:] {
					require.Equal(t, "b", s, "stays at b: %v", sites)
				}
				return i - before + 1
			}
		}
		t.Fatalf("never moved to b: %v", sites)
		return 0
	}
	undamped, _ := simulate(t, 0, 0, traffic)
	require.Equal(t, "a", undamped[before-1])
	require.Equal(t, 1, follows(undamped), "undamped: %v", undamped)

	damped, _ := simulate(t, DefaultRateHalfLife, DefaultMoveMargin, traffic)
	require.Equal(t, "a", damped[before-1])
	require.Equal(t, 2, follows(damped), "damped: %v", damped)
}

// TestDampingFollowsDynamicPhases runs ps-dynamic's shape: six phases, the
// busy site moving a → b → c → a → b → c, each phase lasting four periods.
// With the defaults, the synchronisation site reaches each phase's busy
// site by the phase's second round and stays there for the rest of the
// phase: one move per phase, not one per round.
func TestDampingFollowsDynamicPhases(t *testing.T) {
	const phase = 4
	busy := []pattern{busyA, busyB, busyC, busyA, busyB, busyC}
	names := []string{"a", "b", "c", "a", "b", "c"}
	var traffic []pattern
	for _, p := range busy {
		traffic = append(traffic, repeat(phase, p)...)
	}
	sites, _ := simulate(t, DefaultRateHalfLife, DefaultMoveMargin, traffic)
	for j, want := range names {
		got := sites[j*phase : (j+1)*phase]
		for k := 1; k < phase; k++ {
			require.Equal(t, want, got[k], "phase %d (busy %s), round %d: %v", j, want, k, sites)
		}
	}
	require.Equal(t, len(busy)-1, moves(sites), "one move per phase: %v", sites)
}

// TestDampingHoldYieldsToBandwidth checks that the margin never keeps a
// synchronisation site that placement left for bandwidth: keeping it
// would overload the site, so the move stands even when its gain in
// latency is within the margin.
func TestDampingHoldYieldsToBandwidth(t *testing.T) {
	ss := triangleSites(t, "")
	in, _ := buildInput(ss, map[string]*siteRates{
		"a": {exchanges: map[string]InstanceRates{"pubsub.x": {Site: "a", LocalPublished: 50, LocalConsumed: 30, OverlayIn: 100, OverlayOut: 100}}, meanMessageSize: 1000},
		"b": {exchanges: map[string]InstanceRates{"pubsub.x": {Site: "b", LocalPublished: 50, LocalConsumed: 30, OverlayOut: 50, OverlayIn: 50}}, meanMessageSize: 1000},
	}, map[string]string{"pubsub.x": "a"}, 0, 1)
	in.Sites[0].InboundBandwidth = 10_000 // a cannot take the sync traffic (100 kB/s)
	res, err := placement.Improved(in)
	require.NoError(t, err)
	require.Equal(t, "b", res.Plan["pubsub.x"], "placement leaves a for bandwidth")

	d := newDamper(0, 60, 0.5) // costs are equal: the gain is within any margin
	got, held := d.hold(in, res)
	require.Empty(t, held)
	require.Equal(t, "b", got.Plan["pubsub.x"])

	in.Sites[0].InboundBandwidth = 0 // unlimited: nothing forces the move
	got, held = d.hold(in, res)
	require.Len(t, held, 1)
	require.Equal(t, "a", got.Plan["pubsub.x"])
	require.Equal(t, reasonHeld, got.Decisions[0].Reason)
	require.Equal(t, HeldMove{Exchange: "pubsub.x", Site: "a", Candidate: "b", CostMs: held[0].CostMs, CandidateCostMs: held[0].CandidateCostMs, Rounds: 1}, held[0])
	_, held = d.hold(in, res)
	require.Equal(t, 2, held[0].Rounds, "consecutive rounds held")
}

// TestDampingSmoothing checks the moving average: the weight of a new
// measurement follows the half-life and the interval it covers, a new
// exchange starts from its measurement, one gone is forgotten, and a
// half-life of 0 passes rates through.
func TestDampingSmoothing(t *testing.T) {
	rates := func(dt, v float64, xs ...string) siteRates {
		r := siteRates{periodSeconds: dt, exchanges: map[string]InstanceRates{}}
		for _, x := range xs {
			r.exchanges[x] = InstanceRates{Site: "s", LocalPublished: v, LocalConsumed: 2 * v, OverlayIn: 3 * v, OverlayOut: 4 * v, BacklogMessages: int64(v)}
		}
		return r
	}
	d := newDamper(1, 60, 0)
	require.Equal(t, 100.0, d.smooth("s", rates(60, 100, "pubsub.x")).exchanges["pubsub.x"].LocalPublished, "first: as measured")
	got := d.smooth("s", rates(60, 0, "pubsub.x", "pubsub.y")).exchanges
	require.InDelta(t, 50, got["pubsub.x"].LocalPublished, 1e-9, "one half-life: half the way")
	require.InDelta(t, 200, got["pubsub.x"].OverlayOut, 1e-9)
	require.Zero(t, got["pubsub.x"].BacklogMessages, "backlogs are not averaged")
	require.Zero(t, got["pubsub.y"].LocalPublished)
	got = d.smooth("s", rates(120, 100, "pubsub.y")).exchanges
	require.InDelta(t, 75, got["pubsub.y"].LocalPublished, 1e-9, "two half-lives: three quarters of the way")
	require.NotContains(t, got, "pubsub.x")
	got = d.smooth("s", rates(60, 100, "pubsub.x")).exchanges
	require.Equal(t, 100.0, got["pubsub.x"].LocalPublished, "back after a gap: starts afresh")

	off := newDamper(0, 60, 0)
	off.smooth("s", rates(60, 100, "pubsub.x"))
	require.Equal(t, 0.0, off.smooth("s", rates(60, 0, "pubsub.x")).exchanges["pubsub.x"].LocalPublished)
}

// TestDampingFlags checks --rate-half-life and --move-margin: defaults,
// both spellings of a fraction, and bad values.
func TestDampingFlags(t *testing.T) {
	good := filepath.Join(t.TempDir(), "sites.yaml")
	require.NoError(t, os.WriteFile(good, []byte(goodSites), 0o600))
	c, err := ConfigFromArgs([]string{"--sites", good}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultRateHalfLife, c.RateHalfLife)
	require.Equal(t, DefaultMoveMargin, c.MoveMargin)

	c, err = ConfigFromArgs([]string{"--sites", good, "--rate-half-life", "2.5", "--move-margin", "25%"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2.5, c.RateHalfLife)
	require.InDelta(t, 0.25, c.MoveMargin, 1e-12)
	c, err = ConfigFromArgs([]string{"--sites", good, "--rate-half-life", "0", "--move-margin", "0.05"}, io.Discard)
	require.NoError(t, err)
	require.Zero(t, c.RateHalfLife)
	require.InDelta(t, 0.05, c.MoveMargin, 1e-12)

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate-half-life", "-1"}, "rate-half-life -1: use a number of periods from 0"},
		{[]string{"--rate-half-life", "NaN"}, "rate-half-life NaN"},
		{[]string{"--rate-half-life", "1000"}, "rate-half-life 1000"},
		{[]string{"--move-margin", "1"}, "move-margin 1: use a fraction from 0"},
		{[]string{"--move-margin", "150%"}, "move-margin 1.5"},
		{[]string{"--move-margin", "-5%"}, "move-margin -0.05"},
		{[]string{"--move-margin", "lots"}, "want a fraction such as 0.1 or 10%"},
	} {
		_, err := ConfigFromArgs(append([]string{"--sites", good}, tt.args...), io.Discard)
		require.Error(t, err, "%v", tt.args)
		require.Contains(t, err.Error(), tt.want, "%v", tt.args)
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
	}
}

// TestDampingReported checks what /api/v1/status and /metrics say of the
// damping: the settings, the moves held in the last round (an empty list,
// not null, when none) and the count of held moves per exchange.
func TestDampingReported(t *testing.T) {
	c := quietController(t, Config{Sites: triangleSites(t, ""), RateHalfLife: 2, MoveMargin: 0.15})
	body := scrape(t, c.Handler(), "/api/v1/status")
	require.Contains(t, body, `"rate_half_life_periods": 2,`)
	require.Contains(t, body, `"move_margin": 0.15,`)
	require.Contains(t, body, `"held_moves": [],`)
	require.Contains(t, body, `"work_queue_overflow": {`)

	held := []HeldMove{{Exchange: "pubsub.x", Site: "a", Candidate: "b", CostMs: 53.3, CandidateCostMs: 49.1, Rounds: 3}}
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
	require.Equal(t, held, c.Status().Held)
	c.metrics.observePlan(placement.Plan{"pubsub.x": "a"}, placement.Plan{"pubsub.x": "a"}, nil, nil, held)
	c.metrics.observePlan(placement.Plan{"pubsub.x": "a"}, placement.Plan{"pubsub.x": "a"}, nil, nil, held)
	metrics := scrape(t, c.Handler(), "")
	require.Contains(t, metrics, `luffy_controller_moves_held_total{exchange="pubsub.x"} 2`)
	require.Contains(t, metrics, "luffy_controller_moves_held 1")
}
