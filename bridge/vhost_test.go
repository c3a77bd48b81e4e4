package bridge_test

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// TestWorkQueueInAVirtualHost runs an exported group on a RabbitMQ
// virtual host other than "/", named by the AMQP URL only: the work
// queue's policy, bindings and federation settings go through the
// management API, which must name the same virtual host. (They went to
// "/" before: the policy was missing and the retune failed.)
func TestWorkQueueInAVirtualHost(t *testing.T) {
	n := sharedNodes(t).Node("montreal")
	const vhost, g = "luffy-vh", "vhg"
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	n.AddVhost(t, vhost)

	share := "$share/" + g + "/jobs/" + g + "/#"
	b := startSiteBroker(t, n, broker.Config{
		AMQPURL:      strings.TrimSuffix(n.AMQPURL(), "%2F") + vhost,
		ExportGroups: []string{share},
		WorkQueue:    bridge.WorkQueueConfig{RetuneInterval: 50 * time.Millisecond},
	})

	policy := bridge.WorkQueuePolicyPrefix + bridge.WorkQueueName(g)
	require.Eventually(t, func() bool {
		_, err := rh.GetPolicy(vhost, policy)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "policy %s not set in virtual host %s", policy, vhost)
	_, err = rh.GetPolicy("/", policy)
	require.Error(t, err, "the policy went to virtual host / as well")

	var got atomic.Int64
	mqtttest.Connect(t, b.MQTTAddr(), "vh-member", paho.ClientConfig{
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			got.Add(1)
			return true, nil
		}},
	}, paho.SubscribeOptions{Topic: share, QoS: 1})
	// The member's capacity reaches the queue's weight: the retune works.
	require.Eventually(t, func() bool { return b.Bridge().WorkQueueStats()[g].Weight > 1 },
		20*time.Second, 50*time.Millisecond, "work queue never retuned")

	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "vh-publisher")
	const messages = 20
	for i := range messages {
		pub.MustSend(t, &paho.Publish{Topic: "jobs/" + g + "/" + strconv.Itoa(i), QoS: 1, Payload: []byte("job")})
	}
	require.Eventually(t, func() bool { return got.Load() == messages }, 20*time.Second, 20*time.Millisecond,
		"the member got %d of %d messages", stringer(func() string { return strconv.FormatInt(got.Load(), 10) }), messages)
	require.EqualValues(t, messages, b.Bridge().WorkQueueStats()[g].Local, "every message went through wq.%s", g)
}
