package bridge_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
)

// TestArrivalBellOnRealNode checks on a real RabbitMQ node what the work
// queues' consume loop relies on: an armed bell is handed a message the
// moment it arrives, at most one while it is unacknowledged, and a bell
// armed again after a cancel gets the next one though the first is still
// unacknowledged (the prefetch counts per consumer); a disarmed bell gets
// nothing, and what reached it before the cancel is returned, not lost.
func TestArrivalBellOnRealNode(t *testing.T) {
	h := sharedNodes(t)
	conn, err := amqp.Dial(h.Node("berlin").AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	// Exclusive, not auto-delete: cancelling the bell's consumer must not
	// delete the queue (the work queues are durable).
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Qos(1, 0, false))
	pubCh, err := conn.Channel()
	require.NoError(t, err)
	publish := func(body string) {
		t.Helper()
		require.NoError(t, pubCh.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte(body)}))
	}
	rings := func(bell bridge.ArrivalBell) amqp.Delivery {
		t.Helper()
		select {
		case d, ok := <-bell.Ringing():
			require.True(t, ok, "the bell's consumer ended")
			return d
		case <-time.After(5 * time.Second):
			t.Fatal("the bell did not ring")
			return amqp.Delivery{}
		}
	}
	silent := func(bell bridge.ArrivalBell, d time.Duration) {
		t.Helper()
		select {
		case m := <-bell.Ringing():
			t.Fatalf("the bell rang with %q", m.Body)
		case <-time.After(d):
		}
	}

	bell := bridge.NewArrivalBellForTest(ch, q.Name, "bell-test")
	require.Nil(t, bell.Ringing(), "a disarmed bell never rings")
	require.NoError(t, bell.Arm())
	require.NoError(t, bell.Arm(), "arming an armed bell is a no-op")
	publish("one")
	publish("two")
	first := rings(bell)
	require.Equal(t, "one", string(first.Body))
	silent(bell, 200*time.Millisecond) // "two" waits: "one" is unacknowledged
	left, err := bell.Disarm()
	require.NoError(t, err)
	require.Empty(t, left)

	require.NoError(t, bell.Arm())
	second := rings(bell)
	require.Equal(t, "two", string(second.Body), "a bell armed again rings though the first message is unacknowledged")
	left, err = bell.Disarm()
	require.NoError(t, err)
	require.Empty(t, left)

	publish("three")
	time.Sleep(100 * time.Millisecond)
	got, ok, err := ch.Get(q.Name, false)
	require.NoError(t, err)
	require.True(t, ok, "a disarmed bell takes nothing: basic.get finds the message")
	require.Equal(t, "three", string(got.Body))

	require.NoError(t, bell.Arm())
	publish("four")
	time.Sleep(200 * time.Millisecond) // RabbitMQ hands it over; nobody reads it
	left, err = bell.Disarm()
	require.NoError(t, err)
	require.Len(t, left, 1, "what reached the bell before its cancel is returned")
	require.Equal(t, "four", string(left[0].Body))
	for _, d := range []amqp.Delivery{first, second, got, left[0]} {
		require.NoError(t, d.Ack(false))
	}
}
