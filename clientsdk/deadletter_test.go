package clientsdk

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestDeadLetterProperties(t *testing.T) {
	first := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))
	m := &Message{
		Topic: "orders/42",
		UserProperties: []UserProperty{
			{Key: "tenant", Value: "a"},
			{Key: AttemptsProperty, Value: "9"}, // from an earlier dead-lettering
			{Key: "tenant", Value: "b"},
		},
	}
	got := deadLetterProperties(m, 3, errors.New("db down"), first)
	require.Equal(t, []UserProperty{
		{Key: "tenant", Value: "a"},
		{Key: "tenant", Value: "b"},
		{Key: AttemptsProperty, Value: "3"},
		{Key: ErrorProperty, Value: "db down"},
		{Key: FirstFailureProperty, Value: "2025-03-04T04:06:07.123456789Z"},
		{Key: OriginalTopicProperty, Value: "orders/42"},
	}, got)
	parsed, err := time.Parse(time.RFC3339Nano, got[4].Value)
	require.NoError(t, err)
	require.True(t, parsed.Equal(first))
}

func TestMQTTString(t *testing.T) {
	require.Equal(t, "a\uFFFDb", mqttString("a\x00b", 100))
	require.Equal(t, "a\uFFFDb", mqttString("a\xffb", 100))
	long := strings.Repeat("é", 600) // 1200 bytes
	cut := mqttString(long, 1001)
	require.LessOrEqual(t, len(cut), 1001)
	require.True(t, utf8.ValidString(cut), "never cuts inside a character")
	require.Equal(t, 1000, len(cut))
}
