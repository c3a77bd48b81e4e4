package clientsdk

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

func TestTopicMatches(t *testing.T) {
	tests := []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/+", "a/b", true},
		{"a/+", "a", false},
		{"a/+", "a/b/c", false},
		{"a/+", "a/", true},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"a/#", "b", false},
		{"#", "a/b", true},
		{"+/b", "a/b", true},
		{"+", "a/b", false},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"#", "$SYS/x", false},
		{"+/x", "$SYS/x", false},
		{"$SYS/#", "$SYS/x", true},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, topicMatches(tt.filter, tt.topic), "%s against %s", tt.filter, tt.topic)
	}
}

func TestLoadTrackerIgnoresStartsItDidNotRecord(t *testing.T) {
	l := newLoadTracker(1)
	l.begin(t0)
	finished, _ := l.end(t0.Add(-time.Second), t0.Add(5*time.Millisecond))
	require.Equal(t, 1, finished, "measured all the same")
	mean, inFlight := l.meanProcessingTime()
	require.Equal(t, time.Second+5*time.Millisecond, mean)
	require.Equal(t, 1, inFlight, "the handler begin recorded is still running")
	l.end(t0, t0.Add(10*time.Millisecond))
	_, inFlight = l.meanProcessingTime()
	require.Zero(t, inFlight)
}

func TestLoadReporterCountsItsOwnPending(t *testing.T) {
	r, err := NewLoadReporter(LoadReporterConfig{Workers: 2})
	require.NoError(t, err)
	rep := r.takeReport(time.Now())
	require.False(t, rep.HasReceived, "an application that never calls Received does not claim to have received nothing")

	r.Received()
	r.Received()
	r.Received()
	require.Equal(t, 3, r.Stats().Pending)
	start := r.Start()
	require.Equal(t, 2, r.Stats().Pending)
	require.Equal(t, 1, r.Stats().InFlight)
	rep = r.takeReport(time.Now())
	require.Equal(t, 2, rep.Pending)
	require.Equal(t, 1, rep.InProgress)
	require.Equal(t, 2, rep.Workers)
	require.True(t, rep.HasReceived)
	require.Equal(t, uint64(3), rep.Received)

	r.Done(start, nil)
	r.Done(r.Start(), errors.New("boom"))
	st := r.Stats()
	require.Equal(t, uint64(1), st.Processed)
	require.Equal(t, uint64(1), st.Failed)
	require.Equal(t, 1, st.Pending)
	require.Zero(t, st.InFlight)

	// Start without Received takes nothing from pending.
	r.Done(r.Start(), nil)
	r.Done(r.Start(), nil)
	require.Zero(t, r.Stats().Pending)
	r.Done(r.Start(), nil)
	require.Zero(t, r.Stats().Pending, "never negative")

	r.connectionStarted()
	require.Zero(t, r.takeReport(time.Now()).Received, "received counts per connection")
}

func TestLoadReporterPendingFunc(t *testing.T) {
	queued := 7
	r, err := NewLoadReporter(LoadReporterConfig{Pending: func() int { return queued }})
	require.NoError(t, err)
	r.Received()
	require.Equal(t, 7, r.takeReport(time.Now()).Pending, "the application's count wins")
	queued = -1
	require.Zero(t, r.Stats().Pending)
}

func TestLoadReporterConfigRejectsBadInput(t *testing.T) {
	for _, cfg := range []LoadReporterConfig{
		{Workers: -1},
		{ReportVia: "carrier-pigeon"},
		{ReportInterval: -time.Second},
	} {
		_, err := NewLoadReporter(cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

func TestWrapOnPublishReceivedRunsHandlersAsPahoDoes(t *testing.T) {
	r, err := NewLoadReporter(LoadReporterConfig{})
	require.NoError(t, err)
	boom := errors.New("boom")
	var seen []paho.PublishReceived
	h := r.WrapOnPublishReceived(
		func(pr paho.PublishReceived) (bool, error) {
			seen = append(seen, pr)
			time.Sleep(2 * time.Millisecond)
			return false, boom
		},
		func(pr paho.PublishReceived) (bool, error) {
			seen = append(seen, pr)
			return true, nil
		},
		func(pr paho.PublishReceived) (bool, error) {
			seen = append(seen, pr)
			return false, nil
		},
	)
	handled, err := h(paho.PublishReceived{Packet: &paho.Publish{Topic: "t"}})
	require.True(t, handled)
	require.ErrorIs(t, err, boom)
	require.Len(t, seen, 3)
	require.False(t, seen[1].AlreadyHandled)
	require.True(t, seen[2].AlreadyHandled)
	require.Equal(t, []error{boom, nil}, seen[2].Errs)

	st := r.Stats()
	require.Equal(t, uint64(1), st.Received)
	require.Equal(t, uint64(1), st.Failed, "the first error is the message's outcome")
	require.GreaterOrEqual(t, st.MeanProcessingTime, 2*time.Millisecond)
	require.Zero(t, st.Pending)
	require.Zero(t, st.InFlight)
}

func TestAdoptChainsTheApplicationsConfig(t *testing.T) {
	r, err := NewLoadReporter(LoadReporterConfig{})
	require.NoError(t, err)
	var upCalled, builderCalled bool
	var handled int
	cfg := autopaho.ClientConfig{
		OnConnectionUp: func(*autopaho.ConnectionManager, *paho.Connack) { upCalled = true },
		ConnectPacketBuilder: func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			builderCalled = true
			cp.Properties = &paho.ConnectProperties{User: paho.UserProperties{{Key: "k", Value: "v"}}}
			return cp, nil
		},
		ClientConfig: paho.ClientConfig{
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(paho.PublishReceived) (bool, error) { handled++; return true, nil },
			},
		},
	}
	r.Adopt(&cfg)
	require.Same(t, r.pinger, cfg.PingHandler.(*reportPinger))

	cfg.OnConnectionUp(nil, &paho.Connack{Properties: &paho.ConnackProperties{
		User: paho.UserProperties{{Key: report.ReportIntervalProperty, Value: "250"}},
	}})
	require.True(t, upCalled, "the application's OnConnectionUp still runs")
	require.Equal(t, 250*time.Millisecond, r.ReportInterval(), "the broker's interval is followed")

	cp, err := cfg.ConnectPacketBuilder(&paho.Connect{ClientID: "c"}, nil)
	require.NoError(t, err)
	require.True(t, builderCalled)
	require.True(t, cp.Properties.RequestProblemInfo)
	require.Equal(t, "v", cp.Properties.User.Get("k"), "the application's CONNECT properties are kept")

	require.Len(t, cfg.OnPublishReceived, 1)
	_, _ = cfg.OnPublishReceived[0](paho.PublishReceived{Packet: &paho.Publish{Topic: "t"}})
	require.Equal(t, 1, handled)
	require.Equal(t, uint64(1), r.Stats().Processed)
}

func TestSubscriberConfigWithAutopaho(t *testing.T) {
	u, err := url.Parse("mqtt://127.0.0.1:1883")
	require.NoError(t, err)
	base := func() SubscriberConfig {
		return SubscriberConfig{
			Autopaho: &autopaho.ClientConfig{
				ServerUrls: []*url.URL{u}, KeepAlive: 7, ConnectTimeout: 2 * time.Second,
				ClientConfig: paho.ClientConfig{ClientID: "app", SendAcksInterval: 5 * time.Millisecond},
			},
			Group: "g", Filters: []string{"t/#"}, Handler: noopHandler,
		}
	}
	c, err := base().withDefaults()
	require.NoError(t, err)
	require.Equal(t, "app", c.ClientID)
	require.Equal(t, 7*time.Second, c.KeepAlive)
	require.Equal(t, 2*time.Second, c.ConnectTimeout)
	require.Equal(t, 5*time.Millisecond, c.AckFlushInterval)

	tests := []struct {
		name   string
		mutate func(*SubscriberConfig)
		want   string
	}{
		{"brokers too", func(c *SubscriberConfig) { c.Brokers = []string{"mqtt://x:1"} }, "not in ConnectionConfig"},
		{"no server urls", func(c *SubscriberConfig) { c.Autopaho.ServerUrls = nil }, "no ServerUrls"},
		{"own pinger", func(c *SubscriberConfig) { c.Autopaho.PingHandler = paho.NewDefaultPinger() }, "PingHandler"},
		{"two client ids", func(c *SubscriberConfig) { c.ClientID = "other" }, `ClientID "other" differs`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			_, err := NewSubscriber(c)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestSubscriberConfigGroups(t *testing.T) {
	c := validSubscriberConfig()
	c.Groups = []GroupSubscription{{Group: "h", Filters: []string{"u/#"}, QoS: 1}}
	c, err := c.withDefaults()
	require.NoError(t, err)
	require.Len(t, c.groups, 2)
	require.Equal(t, "dlq/h", c.groups[1].DeadLetterTopic)
	require.NotNil(t, c.groups[1].Handler, "the Subscriber's Handler by default")

	onlyGroups := SubscriberConfig{
		ConnectionConfig: ConnectionConfig{Brokers: []string{"mqtt://127.0.0.1:1883"}},
		Groups: []GroupSubscription{
			{Group: "a", Filters: []string{"a/#"}, Handler: noopHandler},
			{Group: "b", Filters: []string{"b/#"}, Handler: noopHandler},
		},
	}
	s, err := NewSubscriber(onlyGroups)
	require.NoError(t, err)
	require.Equal(t, []string{"$share/a/a/#", "$share/b/b/#"}, s.topics)
	require.False(t, s.anyQoS())

	// Routing: by Subscription Identifier when the message carries one,
	// else by filter.
	id := maxSubscriptionID - 1
	require.Equal(t, "b", s.groupOf(&paho.Publish{Topic: "a/1", Properties: &paho.PublishProperties{SubscriptionIdentifier: &id}}).Group)
	require.Equal(t, "a", s.groupOf(&paho.Publish{Topic: "a/1"}).Group)
	require.Nil(t, s.groupOf(&paho.Publish{Topic: "c/1"}))
	appID := 3
	require.Nil(t, s.groupOf(&paho.Publish{Topic: "a/1", Properties: &paho.PublishProperties{SubscriptionIdentifier: &appID}}),
		"the application's own subscription")

	tests := []struct {
		name   string
		mutate func(*SubscriberConfig)
		want   string
	}{
		{"twice", func(c *SubscriberConfig) {
			c.Groups = append(c.Groups, GroupSubscription{Group: "g", Filters: []string{"x"}})
		}, `group "g" is joined twice`},
		{"bad group", func(c *SubscriberConfig) { c.Groups = []GroupSubscription{{Group: "h", Filters: []string{"a/#/b"}}} }, `Groups[0]: filter "a/#/b"`},
		{"no handler", func(c *SubscriberConfig) {
			c.Handler = nil
			c.Group, c.Filters = "", nil
			c.Groups = []GroupSubscription{{Group: "h", Filters: []string{"x"}}}
		}, "Groups[0]: Handler is nil"},
		{"filters without group", func(c *SubscriberConfig) {
			c.Group = ""
			c.Groups = []GroupSubscription{{Group: "h", Filters: []string{"x"}}}
		}, "Filters given without Group"},
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
