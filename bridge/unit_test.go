package bridge

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
		{"group not yet", func(c *Config) { c.ExportGroups = []string{"$share/g/jobs/#"} }, "not implemented yet"},
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
