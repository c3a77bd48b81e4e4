package siteconfig

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	require.Equal(t, "wq.jobs", WorkQueueName("jobs"))
	require.Equal(t, "wq.jobs.dlx", DeadLetterExchangeName("jobs"))
	require.Equal(t, "wq.jobs.in", IntakeExchangeName("jobs"))
	require.Equal(t, "wq.jobs.to", RouteExchangeName("jobs"))
	require.Equal(t, "luffymq.config.berlin", ConfigQueueName("berlin"))
	for x, want := range map[string]string{"pubsub.weather": "pubsub.weather", "wq.jobs.in": "wq.jobs", "wq.jobs.dlx": "", "amq.topic": ""} {
		got, ok := SiteConfigEntity(x)
		require.Equal(t, want, got, x)
		require.Equal(t, want != "", ok, x)
	}
}

func TestFederationForWorkQueue(t *testing.T) {
	fs, err := FederationFor(Message{"wq.jobs": {{URI: "amqp://b:5672"}}})
	require.NoError(t, err)
	require.Equal(t, []ExchangeFederation{
		{Exchange: "wq.jobs.in", UpstreamExchange: "wq.jobs.dlx", Upstreams: []Upstream{{Site: "0", URI: "amqp://b:5672"}}},
		{Exchange: "wq.jobs.to", Upstreams: []Upstream{{Site: "0", URI: "amqp://b:5672"}}, MaxHops: 1},
	}, fs)
}

func TestParseSiteConfigRefusesWithoutPasswords(t *testing.T) {
	_, err := ParseSiteConfig([]byte(`{"pubsub.x":[{"uri":"http://user:s3cret@b:15672"}]}`))
	require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
	require.NotContains(t, err.Error(), "s3cret")
	_, err = ParseSiteConfig([]byte(`{"wq.bad name":[]}`))
	require.ErrorIs(t, err, ErrInvalidConfig)
	c, err := ParseSiteConfig([]byte(`{"pubsub.a":[{"uri":"amqp://b"}]}`))
	require.NoError(t, err)
	require.True(t, c.Equal(SiteConfig{"pubsub.a": {"amqp://b"}}))
}
