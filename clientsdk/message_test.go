package clientsdk

import (
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

func TestSentAt(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	m := &Message{UserProperties: []UserProperty{{Key: SentAtProperty, Value: strconv.FormatInt(at.UnixNano(), 10)}}}
	got, ok := SentAt(m)
	require.True(t, ok)
	require.True(t, got.Equal(at))

	for _, bad := range []string{"", "abc", "-1", "0"} {
		_, ok := SentAt(&Message{UserProperties: []UserProperty{{Key: SentAtProperty, Value: bad}}})
		require.False(t, ok, bad)
	}
	_, ok = SentAt(&Message{})
	require.False(t, ok)
}

func TestStampSentAtReplacesAnEarlierStamp(t *testing.T) {
	props := &paho.PublishProperties{User: paho.UserProperties{{Key: "a", Value: "1"}, {Key: SentAtProperty, Value: "5"}}}
	at := time.Unix(0, 42)
	stampSentAt(props, at)
	require.Equal(t, paho.UserProperties{{Key: "a", Value: "1"}, {Key: SentAtProperty, Value: "42"}}, props.User)
}

func TestMessageFromPublish(t *testing.T) {
	now := time.Unix(10, 0)
	p := &paho.Publish{
		PacketID: 7, QoS: 1, Topic: "t/1", Payload: []byte("x"),
		Properties: &paho.PublishProperties{
			ContentType: "text/plain",
			User:        paho.UserProperties{{Key: MessageIDProperty, Value: "id-1"}, {Key: "k", Value: "v"}},
		},
	}
	m := messageFromPublish(p, now)
	require.Equal(t, "t/1", m.Topic)
	require.Equal(t, byte(1), m.QoS)
	require.Equal(t, uint16(7), m.PacketID)
	require.Equal(t, "id-1", m.ID)
	require.Equal(t, "text/plain", m.ContentType)
	require.Equal(t, now, m.ReceivedAt)
	v, ok := m.UserProperty("k")
	require.True(t, ok)
	require.Equal(t, "v", v)
}
