package bridge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// TestPatternFederationIgnoresPerExchangeUpstreams: on a node with both
// families of ApplyFederation, an exchange federated by the pattern
// (full mesh) gets links from the full mesh's upstreams only, never from
// the per-exchange upstreams the configuration agent creates. With the
// policy's upstream set "all" it got one from each of those too, whose
// queue on the upstream node was the per-exchange link's own: moving that
// link then never finished (TestReconfigSlowAgentLosesNothing after the
// full-mesh tests).
func TestPatternFederationIgnoresPerExchangeUpstreams(t *testing.T) {
	h := federatedNodes(t)
	site, other := "berlin", "tunis"
	n := h.Node(site)
	patterned, perExchange := "pubsub.fedsets-mesh", "pubsub.fedsets-x"

	conn, err := amqp.Dial(n.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, x := range []string{patterned, perExchange} {
		require.NoError(t, ch.ExchangeDeclare(x, amqp.ExchangeTopic, false, true, false, false, nil))
	}

	link, err := h.Link(n, h.Node(other))
	require.NoError(t, err)
	fc := bridge.FederationConfig{
		ManagementURL: n.ManagementURL(), Username: rabbitharness.User, Password: rabbitharness.Password,
		Exchanges: []bridge.ExchangeFederation{{Exchange: perExchange, Upstreams: []bridge.Upstream{{Site: "0", URI: link.AMQPURL()}}}},
	}
	require.NoError(t, bridge.ApplyFederation(context.Background(), fc))
	t.Cleanup(func() {
		fc.Exchanges = []bridge.ExchangeFederation{{Exchange: perExchange}}
		_ = bridge.ApplyFederation(context.Background(), fc)
	})

	var last []bridge.FederationLink
	require.Eventually(t, func() bool {
		links, err := bridge.FederationLinks(context.Background(), n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
		if err != nil {
			return false
		}
		last = links
		mesh, own := 0, 0
		for _, l := range links {
			switch l.Exchange {
			case patterned:
				if strings.HasPrefix(l.Upstream, bridge.ExchangeUpstreamPrefix) {
					return false // never acceptable; keep polling so last shows it
				}
				if l.Status == "running" {
					mesh++
				}
			case perExchange:
				if l.Status == "running" {
					own++
				}
			}
		}
		return mesh == len(testSites)-1 && own == 1
	}, 30*time.Second, 100*time.Millisecond, "links at %s: %v", site, &last)
	// And it stays so once every link runs.
	time.Sleep(time.Second)
	links, err := bridge.FederationLinks(context.Background(), n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	for _, l := range links {
		if l.Exchange == patterned {
			require.False(t, strings.HasPrefix(l.Upstream, bridge.ExchangeUpstreamPrefix),
				"%s federates from the per-exchange upstream %s", patterned, l.Upstream)
		}
	}
}
