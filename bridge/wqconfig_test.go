package bridge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

// TestWQConfigTuning: zero work-queue constants take the defaults, given
// ones are kept and drive eq. 2.12, and values RabbitMQ or the retune loop
// cannot honour are refused with the name of luffymq's flag.
func TestWQConfigTuning(t *testing.T) {
	c, err := WorkQueueConfig{}.withDefaults("amqp://127.0.0.1/", false)
	require.NoError(t, err)
	require.Equal(t, DefaultTTLPerMember, c.TTLPerMember)
	require.Equal(t, 500*time.Millisecond, c.TTLPerMember)
	require.Equal(t, 3000, c.MaxLengthPerMember)
	require.Equal(t, 2, c.UnackedPerMember)
	require.Equal(t, time.Second, c.RetuneInterval)

	c, err = WorkQueueConfig{TTLPerMember: 50 * time.Millisecond, MaxLengthPerMember: 300, UnackedPerMember: 1, RetuneInterval: 100 * time.Millisecond}.
		withDefaults("amqp://127.0.0.1/", false)
	require.NoError(t, err)
	require.Equal(t, 50*time.Millisecond, c.TTLPerMember)
	require.Equal(t, 100*time.Millisecond, c.RetuneInterval)
	require.Equal(t, 1, c.UnackedPerMember)
	// Two idle members: eq. 2.12 with the given constants.
	idle := []scoring.MemberSnapshot{{Online: true}, {Online: true}}
	capa := c.capacity(idle)
	require.Equal(t, 600, capa.MaxLength)
	require.Equal(t, 100*time.Millisecond, capa.TTL)
	require.Equal(t, RouteNearest, c.Route, "default routing")
	require.Equal(t, DefaultStateInterval, c.StateInterval)
	require.Nil(t, newGroupRouter(WorkQueueConfig{Route: RouteRing}, "berlin", "b1"))
	require.Nil(t, newGroupRouter(WorkQueueConfig{Route: RouteNearest, TTLOverflowOnly: true}, "berlin", "b1"), "the thesis's rule routes nothing at publish")

	for _, tt := range []struct {
		cfg  WorkQueueConfig
		want string
	}{
		{WorkQueueConfig{TTLPerMember: -time.Millisecond}, "wq-ttl-per-member -1ms: want 1ms or more"},
		{WorkQueueConfig{TTLPerMember: 500 * time.Microsecond}, "wq-ttl-per-member 500µs: want 1ms or more"},
		{WorkQueueConfig{MaxLengthPerMember: -3}, "wq-max-length-per-member -3 is negative"},
		{WorkQueueConfig{UnackedPerMember: -1}, "wq-unacked-per-member -1 is negative"},
		{WorkQueueConfig{RetuneInterval: -time.Second}, "wq-retune-interval -1s: want 10ms or more"},
		{WorkQueueConfig{RetuneInterval: time.Millisecond}, "wq-retune-interval 1ms: want 10ms or more"},
		{WorkQueueConfig{Route: "closest"}, `wq-route "closest": want nearest or ring`},
		{WorkQueueConfig{StateInterval: -time.Second}, "wq-state-interval -1s: want 10ms or more"},
		{WorkQueueConfig{StateInterval: time.Millisecond}, "wq-state-interval 1ms: want 10ms or more"},
	} {
		_, err := tt.cfg.withDefaults("amqp://127.0.0.1/", false)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, tt.want)
		// New refuses them too.
		_, err = New(Config{Site: "berlin", AMQPURL: "amqp://127.0.0.1/", WorkQueue: tt.cfg})
		require.ErrorContains(t, err, tt.want)
	}
}
