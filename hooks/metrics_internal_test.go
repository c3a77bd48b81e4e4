package hooks

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

// metricsFixture is an engine, its selection hook and a registry holding a
// MetricsCollector with a member cap.
type metricsFixture struct {
	engine    *scoring.Engine
	hook      *SelectionHook
	collector *MetricsCollector
	registry  *prometheus.Registry
}

func newMetricsFixture(t *testing.T, maxMembers int) *metricsFixture {
	t.Helper()
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "round-robin"})
	require.NoError(t, err)
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h, err := NewSelectionHook(SelectionConfig{Engine: eng, Server: srv})
	require.NoError(t, err)
	c := NewMetricsCollector(h, MetricsOptions{MaxMembers: maxMembers})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	return &metricsFixture{engine: eng, hook: h, collector: c, registry: reg}
}

// scrape gathers the registry into "name{label="value",...}" → value.
func (f *metricsFixture) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := f.registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// select n messages of group (round robin spreads them evenly).
func (f *metricsFixture) selectN(t *testing.T, group string, n int) {
	t.Helper()
	for range n {
		_, ok := f.engine.SelectMember(group, scoring.Message{Topic: "t"})
		require.True(t, ok)
	}
}

// memberSeries returns the keys of the samples carrying a group label.
func memberSeries(samples map[string]float64) []string {
	var keys []string
	for k := range samples {
		if strings.Contains(k, "group=") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func sel(group, client string) string {
	return fmt.Sprintf("luffymq_shared_selections_total{client_id=%q,group=%q}", client, group)
}

func TestMemberSeriesBeyondTheCapAreSummed(t *testing.T) {
	f := newMetricsFixture(t, 2)
	const g = "$share/g/t"
	for _, id := range []string{"a", "b", "c", "d"} {
		f.engine.Join(g, id)
	}
	f.engine.Disconnect("d", false) // offline: counted in _other but not online
	f.selectN(t, g, 9)
	s := f.scrape(t)

	require.Contains(t, s, sel(g, "a"))
	require.Contains(t, s, sel(g, "b"))
	require.NotContains(t, s, sel(g, "c"), "c came after the cap")
	require.NotContains(t, s, sel(g, "d"))
	total := s[sel(g, "a")] + s[sel(g, "b")] + s[sel(g, OtherMembers)]
	require.Equal(t, 9.0, total, "every selection is counted once")
	require.Greater(t, s[sel(g, OtherMembers)], 0.0)
	require.Equal(t, 1.0, s[`luffymq_member_online{client_id="_other",group="$share/g/t"}`], "c online, d offline")
	require.Contains(t, s, `luffymq_member_inflight{client_id="_other",group="$share/g/t"}`)
	require.Contains(t, s, `luffymq_member_reported_pending{client_id="_other",group="$share/g/t"}`)
	require.NotContains(t, s, `luffymq_member_predicted_wait_seconds{client_id="_other",group="$share/g/t"}`,
		"a wait is not summable")
	require.Equal(t, 4.0, s[`luffymq_shared_group_members{group="$share/g/t"}`])

	// The cap counts member series over all groups.
	f.engine.Join("$share/h/t", "a")
	s = f.scrape(t)
	require.Contains(t, s, sel("$share/h/t", OtherMembers))
	require.NotContains(t, s, sel("$share/h/t", "a"))
}

func TestSummedSelectionsNeverDecrease(t *testing.T) {
	f := newMetricsFixture(t, 1)
	const g = "$share/g/t"
	for _, id := range []string{"a", "b", "c"} {
		f.engine.Join(g, id)
	}
	other := func() float64 { return f.scrape(t)[sel(g, OtherMembers)] }
	f.selectN(t, g, 6)
	require.Equal(t, 4.0, other())

	f.engine.Leave(g, "c") // its 2 selections stay in the sum
	require.Equal(t, 4.0, other())

	// b leaves and comes back between scrapes: its count restarts at 0.
	f.engine.Leave(g, "b")
	f.engine.Join(g, "b")
	f.selectN(t, g, 2) // a and b one each
	require.Equal(t, 5.0, other(), "b's 2 before and 1 after")

	f.engine.Join(g, "c")
	f.selectN(t, g, 3)
	require.Equal(t, 7.0, other())
	// A freed slot goes to a newcomer, never to a summed member.
	f.engine.Leave(g, "a")
	f.engine.Join(g, "e")
	s := f.scrape(t)
	require.Contains(t, s, sel(g, "e"))
	require.NotContains(t, s, sel(g, "b"))
	require.Equal(t, 7.0, s[sel(g, OtherMembers)])
}

func TestMemberChurnLeavesNoSeriesBehind(t *testing.T) {
	const maxMembers = 5
	f := newMetricsFixture(t, maxMembers)
	groups := []string{"$share/g1/t", "$share/g2/t"}
	for round := range 40 {
		var ids []string
		for i := range 4 {
			id := fmt.Sprintf("w%d-%d", round, i)
			ids = append(ids, id)
			f.engine.Connect(id)
			for _, g := range groups {
				f.engine.Join(g, id)
			}
		}
		for _, g := range groups {
			f.selectN(t, g, 5)
		}
		s := f.scrape(t)
		own := 0
		for _, k := range memberSeries(s) {
			if strings.HasPrefix(k, "luffymq_shared_selections_total") && !strings.Contains(k, `client_id="_other"`) {
				own++
			}
		}
		require.LessOrEqual(t, own, maxMembers, "round %d", round)
		for i, id := range ids {
			f.engine.Disconnect(id, i%2 == 0) // expired, or the session survives...
			if i%2 == 1 {
				for _, g := range groups {
					f.engine.Leave(g, id) // ...until it unsubscribes
				}
			}
		}
	}
	s := f.scrape(t)
	require.Empty(t, memberSeries(s), "no series of departed members or groups")
	members, groupsTracked := f.collector.labels.tracked()
	require.Zero(t, members)
	require.Zero(t, groupsTracked)
}

func TestAClientNamedOtherIsSummed(t *testing.T) {
	f := newMetricsFixture(t, 10)
	const g = "$share/g/t"
	f.engine.Join(g, OtherMembers)
	f.engine.Join(g, "x")
	f.selectN(t, g, 4)
	s := f.scrape(t)
	require.Equal(t, 2.0, s[sel(g, OtherMembers)])
	require.Equal(t, 2.0, s[sel(g, "x")])
	require.Equal(t, 1.0, s[`luffymq_member_online{client_id="_other",group="$share/g/t"}`])
}

func TestLoadReportOutcomes(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.hook.Reports.Accepted[ViaPublish].Add(3)
	f.hook.Reports.Malformed[ViaPingreq].Add(2)
	f.hook.Reports.Oversized.Add(1)
	s := f.scrape(t)
	require.Equal(t, 3.0, s[`luffymq_load_reports_total{channel="publish",outcome="accepted"}`])
	require.Equal(t, 2.0, s[`luffymq_load_reports_total{channel="pingreq",outcome="malformed"}`])
	require.Equal(t, 1.0, s[`luffymq_load_reports_total{channel="pingreq",outcome="oversized"}`])
	require.Equal(t, 1.0, s[`luffymq_load_reports_oversized_total`])
	require.Equal(t, DefaultMetricsMaxMembers, f.collector.labels.max, "0 selects the default cap")
}

func TestMetricsCollectorLint(t *testing.T) {
	f := newMetricsFixture(t, 1)
	f.engine.Join("$share/g/t", "a")
	f.engine.Join("$share/g/t", "b")
	f.selectN(t, "$share/g/t", 2)
	problems, err := testutil.CollectAndLint(f.collector)
	require.NoError(t, err)
	require.Empty(t, problems)
	problems, err = testutil.CollectAndLint(NewTopicRulesCollector(&TopicRulesHook{}))
	require.NoError(t, err)
	require.Empty(t, problems)
}
