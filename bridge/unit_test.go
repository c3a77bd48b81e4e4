package bridge

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

func TestExchangeName(t *testing.T) {
	tests := []struct{ filter, want string }{
		{"sensors/+/temp", "pubsub.sensors"},
		{"sensors/#", "pubsub.sensors"},
		{"sensors", "pubsub.sensors"},
		{"#", "pubsub.all"},
		{"+/status", "pubsub.all"},
		{"café/#", "pubsub.caf%C3%A9"},
		{"a.b/c", "pubsub.a%2Eb"},
		{"/a", "pubsub."},
		{"Weather_EU-1/x", "pubsub.Weather_EU-1"},
	}
	for _, tt := range tests {
		t.Run(tt.filter, func(t *testing.T) {
			require.Equal(t, tt.want, ExchangeName(tt.filter))
		})
	}
}

func TestGroupExports(t *testing.T) {
	got := groupExports([]string{"sensors/#", "alerts/+", "sensors/+/temp", "sensors/#", "#"})
	require.Equal(t, []exchange{
		{name: "pubsub.alerts", filters: []string{"alerts/+"}},
		{name: "pubsub.all", filters: []string{"#"}},
		{name: "pubsub.sensors", filters: []string{"sensors/#", "sensors/+/temp"}},
	}, got)
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Site: "berlin", AMQPURL: "amqp://127.0.0.1:5672/"}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"empty site", func(c *Config) { c.Site = "" }, `site ""`},
		{"bad site", func(c *Config) { c.Site = "a.b" }, `site "a.b"`},
		{"no url", func(c *Config) { c.AMQPURL = "" }, "amqp-url is empty"},
		{"bad scheme", func(c *Config) { c.AMQPURL = "http://x" }, `amqp-url "http://x"`},
		{"password redacted", func(c *Config) { c.AMQPURL = "amqp:/u:secret@" }, "amqp-url"},
		{"empty export", func(c *Config) { c.Exports = []string{""} }, "export filter is empty"},
		{"system export", func(c *Config) { c.Exports = []string{"$SYS/#"} }, `export "$SYS/#"`},
		{"bad export", func(c *Config) { c.Exports = []string{"a/b#"} }, `export "a/b#"`},
		{"bad group", func(c *Config) { c.ExportGroups = []string{"jobs/#"} }, `export-group "jobs/#"`},
		{"group needs management", func(c *Config) { c.ExportGroups = []string{"$share/g/jobs/#"} }, "needs the management URL"},
		{"bad group name", func(c *Config) { c.ExportGroups = []string{"$share/a.b/jobs/#"} }, `group name "a.b"`},
		{"bad group filter", func(c *Config) { c.ExportGroups = []string{"$share/g/a/#/b"} }, `filter "a/#/b"`},
		{"group twice", func(c *Config) {
			c.ExportGroups = []string{"$share/g/a", "$share/g/b"}
			c.WorkQueue = WorkQueueConfig{ManagementURL: "http://127.0.0.1:1", Load: noLoad{}}
		}, `group "g" is exported twice`},
		{"bad management url", func(c *Config) { c.WorkQueue.ManagementURL = "amqp://x" }, `amqp-management-url "amqp://x"`},
		{"group needs load", func(c *Config) {
			c.ExportGroups = []string{"$share/g/jobs/#"}
			c.WorkQueue.ManagementURL = "http://127.0.0.1:1"
		}, "needs a load source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tt.want)
			require.NotContains(t, err.Error(), "secret")
		})
	}
	require.NoError(t, ok.Validate())
}

func TestOutbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o := newOutbox(3)
	msg := func(k string) *outMsg { return &outMsg{key: k} }
	keys := func(ms []*outMsg) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.key)
		}
		return out
	}
	require.True(t, o.push(msg("a")))
	require.True(t, o.push(msg("b")))
	require.True(t, o.push(msg("c")))
	require.False(t, o.push(msg("d")), "full: the oldest is dropped")
	require.Equal(t, uint64(1), o.droppedCount())

	batch, err := o.take(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c"}, keys(batch))
	o.requeue(batch)
	all, err := o.take(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c", "d"}, keys(all), "requeued messages go first")
	require.Zero(t, o.len())

	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	_, err = o.take(short, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "take waits for a message or the context")
}

func TestDedup(t *testing.T) {
	d := newDedup(2)
	require.False(t, d.seen("a"))
	require.True(t, d.seen("a"))
	require.False(t, d.seen("b"))
	require.False(t, d.seen("c"), "evicts a")
	require.False(t, d.seen("a"), "a was forgotten")
	require.False(t, d.seen(""))
	require.False(t, d.seen(""), "empty IDs are never duplicates")
}

func TestFullMesh(t *testing.T) {
	ups := FullMesh("b", []string{"a", "b", "c"}, func(from, to string) string { return "amqp://" + from + "-" + to })
	require.Equal(t, []Upstream{{Site: "a", URI: "amqp://b-a"}, {Site: "c", URI: "amqp://b-c"}}, ups)
}

type noLoad struct{}

func (noLoad) Snapshot() []scoring.GroupSnapshot { return nil }

func TestCapacity(t *testing.T) {
	c, err := WorkQueueConfig{ManagementURL: "http://127.0.0.1:1", Load: noLoad{}}.withDefaults("amqp://u:p@127.0.0.1/", true)
	require.NoError(t, err)
	require.Equal(t, "u", c.Username)
	ms := time.Millisecond
	tests := []struct {
		name      string
		members   []scoring.MemberSnapshot
		online    int
		available float64
		room      bool
	}{
		{"none", nil, 0, 0, false},
		{"offline only", []scoring.MemberSnapshot{{Online: false}}, 0, 0, false},
		{"idle silent member", []scoring.MemberSnapshot{{Online: true}}, 1, 1, true},
		{"busy silent member", []scoring.MemberSnapshot{{Online: true, InFlight: 1}}, 1, 1, false},
		{"backlogged silent member", []scoring.MemberSnapshot{{Online: true, InFlight: 3}}, 1, 1.0 / 3, false},
		{"reporting, one service time queued", []scoring.MemberSnapshot{{Online: true, ServiceEstimate: 100 * ms, PredictedWait: 100 * ms}}, 1, 0.5, true},
		{"reporting, three queued", []scoring.MemberSnapshot{{Online: true, ServiceEstimate: 100 * ms, PredictedWait: 300 * ms}}, 1, 0.25, false},
		{"two idle", []scoring.MemberSnapshot{{Online: true}, {Online: true}}, 2, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.capacity(tt.members)
			require.Equal(t, tt.online, got.Online)
			require.InDelta(t, tt.available, got.Available, 1e-9)
			require.Equal(t, max(int(3000*tt.available), 1), got.MaxLength)
			require.Equal(t, max(time.Duration(float64(500*ms)*tt.available), ms), got.TTL)
			require.Equal(t, tt.room, hasRoom(tt.members))
		})
	}
	require.Equal(t, 1, weight(10, 30))
	require.Equal(t, 7, weight(10, 3))
}

func TestFederationFor(t *testing.T) {
	var m configMessage
	require.NoError(t, json.Unmarshal([]byte(`{"pubsub.weather":[{"uri":"amqp://b:5672"}],"wq.jobs":[{"uri":"amqp://b:5672"},{"uri":"amqp://c:5672"}]}`), &m))
	xs, err := federationFor(m)
	require.NoError(t, err)
	sort.Slice(xs, func(i, j int) bool { return xs[i].Exchange < xs[j].Exchange })
	require.Equal(t, []ExchangeFederation{
		{Exchange: "pubsub.weather", Upstreams: []Upstream{{Site: "0", URI: "amqp://b:5672"}}},
		{Exchange: "wq.jobs.in", UpstreamExchange: "wq.jobs.dlx", Upstreams: []Upstream{{Site: "0", URI: "amqp://b:5672"}, {Site: "1", URI: "amqp://c:5672"}}},
		{Exchange: "wq.jobs.to", Upstreams: []Upstream{{Site: "0", URI: "amqp://b:5672"}, {Site: "1", URI: "amqp://c:5672"}}, MaxHops: 1},
	}, xs)
	for _, bad := range []string{`{"other":[]}`, `{"wq.a.b":[]}`, `{"pubsub.x":[{"uri":"http://x"}]}`} {
		var m configMessage
		require.NoError(t, json.Unmarshal([]byte(bad), &m))
		_, err := federationFor(m)
		require.ErrorIs(t, err, ErrInvalidConfig, bad)
	}
}

// TestNamesLongerThanAMQPAllowsAreRefused: an export or a configuration
// entry whose exchange name RabbitMQ cannot carry is a configuration error
// up front, not a failure (and retry loop) later.
func TestNamesLongerThanAMQPAllowsAreRefused(t *testing.T) {
	long := strings.Repeat("b", 300)
	require.ErrorIs(t, checkExport(long+"/#"), ErrInvalidConfig)
	require.NoError(t, checkExport(strings.Repeat("b", MaxAMQPNameLength-len(ExchangePrefix))+"/#"))
	_, err := federationFor(configMessage{"pubsub." + long: nil})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
