package clientsdk

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func noopHandler(context.Context, *Message) error { return nil }

func validSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		ConnectionConfig: ConnectionConfig{Brokers: []string{"mqtt://127.0.0.1:1883"}},
		Group:            "g",
		Filters:          []string{"sensors/+/temp"},
		Handler:          noopHandler,
	}
}

func TestSubscriberConfigDefaults(t *testing.T) {
	c, err := validSubscriberConfig().withDefaults()
	require.NoError(t, err)
	require.Equal(t, DefaultWorkers, c.Workers)
	require.Equal(t, DefaultQueueCapacity, c.QueueCapacity)
	require.Equal(t, ReportViaPingreq, c.ReportVia)
	require.Zero(t, c.ReportInterval, "0 means: follow the broker")
	require.Equal(t, DefaultMaxAttempts, c.MaxAttempts)
	require.Equal(t, "dlq/g", c.DeadLetterTopic)
	require.Equal(t, DefaultKeepAlive, c.KeepAlive)
	require.Regexp(t, `^luffy-[0-9a-f]{12}$`, c.ClientID)
	require.NotNil(t, c.Logger)
	require.Equal(t, uint16(30), c.keepAliveSeconds())
}

func TestSubscriberConfigRejectsBadInput(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*SubscriberConfig)
		want   string
	}{
		{"no brokers", func(c *SubscriberConfig) { c.Brokers = nil }, "Brokers is empty"},
		{"bad scheme", func(c *SubscriberConfig) { c.Brokers = []string{"http://x:1"} }, `scheme "http"`},
		{"no host", func(c *SubscriberConfig) { c.Brokers = []string{"mqtt://"} }, "no host"},
		{"no group", func(c *SubscriberConfig) { c.Group = "" }, "Group is empty"},
		{"group with slash", func(c *SubscriberConfig) { c.Group = "a/b" }, `Group "a/b"`},
		{"no filters", func(c *SubscriberConfig) { c.Filters = nil }, "Filters is empty"},
		{"bad hash", func(c *SubscriberConfig) { c.Filters = []string{"a/#/b"} }, `filter "a/#/b"`},
		{"bad plus", func(c *SubscriberConfig) { c.Filters = []string{"a/b+"} }, `filter "a/b+"`},
		{"already shared", func(c *SubscriberConfig) { c.Filters = []string{"$share/g/a"} }, "plain filter"},
		{"qos 3", func(c *SubscriberConfig) { c.QoS = 3 }, "QoS 3"},
		{"no handler", func(c *SubscriberConfig) { c.Handler = nil }, "Handler is nil"},
		{"huge queue", func(c *SubscriberConfig) { c.QueueCapacity = 70000 }, "QueueCapacity 70000"},
		{"report channel", func(c *SubscriberConfig) { c.ReportVia = "smoke" }, `report channel "smoke"`},
		{"negative interval", func(c *SubscriberConfig) { c.ReportInterval = -time.Second }, "ReportInterval -1s"},
		{"wildcard dlq", func(c *SubscriberConfig) { c.DeadLetterTopic = "dlq/#" }, `DeadLetterTopic "dlq/#"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validSubscriberConfig()
			tt.mutate(&c)
			_, err := NewSubscriber(c)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestParseReportChannel(t *testing.T) {
	for in, want := range map[string]ReportChannel{"": ReportViaPingreq, "PINGREQ": ReportViaPingreq, "publish": ReportViaPublish, " off ": ReportOff} {
		got, err := ParseReportChannel(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := ParseReportChannel("udp")
	require.ErrorContains(t, err, `"udp"`)
}

func TestRetryDelay(t *testing.T) {
	base, limit := 100*time.Millisecond, time.Second
	require.Equal(t, 100*time.Millisecond, retryDelay(base, limit, 1))
	require.Equal(t, 200*time.Millisecond, retryDelay(base, limit, 2))
	require.Equal(t, 800*time.Millisecond, retryDelay(base, limit, 4))
	require.Equal(t, time.Second, retryDelay(base, limit, 5))
	require.Equal(t, time.Second, retryDelay(base, limit, 500), "no overflow")
	b := reconnectBackoff(time.Second)
	require.Zero(t, b(0), "first attempt at once")
	require.Equal(t, 100*time.Millisecond, b(1))
}

func TestParseMillis(t *testing.T) {
	d, err := parseMillis("300")
	require.NoError(t, err)
	require.Equal(t, 300*time.Millisecond, d)
	d, err = parseMillis("2.5")
	require.NoError(t, err)
	require.Equal(t, 2500*time.Microsecond, d)
	for _, bad := range []string{"", "x", "0", "-5", "1e12"} {
		_, err := parseMillis(bad)
		require.Error(t, err, bad)
	}
}
