package bridge

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMQTTToAMQP(t *testing.T) {
	tests := []struct {
		mqtt, amqp string
	}{
		{"sensors/berlin/temp", "sensors.berlin.temp"},
		{"sensors/+/temp", "sensors.*.temp"},
		{"sensors/#", "sensors.#"},
		{"#", "#"},
		{"+", "*"},
		{"a.b/c", "a%2Eb.c"},
		{"a*b/*", "a%2Ab.%2A"},
		{"100%/x", "100%25.x"},
		{"a//b", "a..b"},
		{"/a", ".a"},
		{"a/", "a."},
		{"/", "."},
		{"a+b/c#", "a%2Bb.c%23"},
		{"ünïcødé/日本", "ünïcødé.日本"},
		{"$SYS/broker", "$SYS.broker"},
	}
	for _, tt := range tests {
		t.Run(tt.mqtt, func(t *testing.T) {
			require.Equal(t, tt.amqp, MQTTToAMQP(tt.mqtt))
			back, err := AMQPToMQTT(tt.amqp)
			require.NoError(t, err)
			require.Equal(t, tt.mqtt, back)
		})
	}
}

func TestAMQPToMQTTRejects(t *testing.T) {
	for _, key := range []string{"a/b", "a+b", "a*b", "a#", "%", "%2", "%zz", "%2e", "%41"} {
		t.Run(key, func(t *testing.T) {
			_, err := AMQPToMQTT(key)
			require.ErrorIs(t, err, ErrUnmappable)
			require.Contains(t, err.Error(), key)
		})
	}
}

func TestMatchFilter(t *testing.T) {
	tests := []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/+", "a/b", true},
		{"a/+", "a/", true},
		{"a/+", "a", false},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"#", "a/b", true},
		{"#", "$SYS/x", false},
		{"+/x", "$SYS/x", false},
		{"$SYS/#", "$SYS/x", true},
		{"a/b", "a/c", false},
		{"a/b/c", "a/b", false},
	}
	for _, tt := range tests {
		t.Run(tt.filter+" "+tt.topic, func(t *testing.T) {
			require.Equal(t, tt.want, MatchFilter(tt.filter, tt.topic))
		})
	}
}

func TestIntersectFilters(t *testing.T) {
	tests := []struct {
		a, b, want string
		ok         bool
	}{
		{"a/#", "a/b", "a/b", true},
		{"a/#", "+/b", "a/b", true},
		{"a/#", "#", "a/#", true},
		{"#", "#", "#", true},
		{"a/#", "a", "a", true},
		{"+", "a/#", "a", true},
		{"a/+/#", "+/b/c", "a/b/c", true},
		{"a/+", "+/b", "a/b", true},
		{"a/b", "a/c", "", false},
		{"a/b", "a/b/c", "", false},
		{"a/+", "a/+/+", "", false},
		{"sensors/#", "sensors/+/temp", "sensors/+/temp", true},
	}
	for _, tt := range tests {
		t.Run(tt.a+" "+tt.b, func(t *testing.T) {
			got, ok := IntersectFilters(tt.a, tt.b)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
			got, ok = IntersectFilters(tt.b, tt.a)
			require.Equal(t, tt.ok, ok, "symmetric")
			require.Equal(t, tt.want, got, "symmetric")
		})
	}
}

// amqpMatch is an independent model of RabbitMQ's topic matching: words
// split on '.', "*" matches one word, "#" zero or more.
func amqpMatch(binding, key []string) bool {
	if len(binding) == 0 {
		return len(key) == 0
	}
	switch binding[0] {
	case "#":
		for i := 0; i <= len(key); i++ {
			if amqpMatch(binding[1:], key[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(key) > 0 && amqpMatch(binding[1:], key[1:])
	default:
		return len(key) > 0 && binding[0] == key[0] && amqpMatch(binding[1:], key[1:])
	}
}

// FuzzTopicMapping checks, for arbitrary strings, that the mapping is
// reversible, that AMQPToMQTT is canonical, that mapped topic names never
// contain wildcard words, and that MQTT matching agrees with AMQP matching
// of the mapped keys.
func FuzzTopicMapping(f *testing.F) {
	for _, s := range [][2]string{
		{"sensors/+/temp", "sensors/berlin/temp"},
		{"a/#", "a"},
		{"#", "a.b/c*d"},
		{"a//+", "a//"},
		{"100%/+", "100%/x"},
		{"+/+", "/"},
		{"a/b", "a.b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		for _, s := range []string{filter, topic} {
			key := MQTTToAMQP(s)
			back, err := AMQPToMQTT(key)
			if err != nil {
				t.Fatalf("AMQPToMQTT(MQTTToAMQP(%q)=%q): %v", s, key, err)
			}
			if back != s {
				t.Fatalf("round trip %q -> %q -> %q", s, key, back)
			}
			// Any key that maps back maps back canonically.
			if m, err := AMQPToMQTT(s); err == nil && MQTTToAMQP(m) != s {
				t.Fatalf("AMQP %q -> MQTT %q -> AMQP %q", s, m, MQTTToAMQP(m))
			}
		}
		if validTopic(topic) {
			for _, w := range strings.Split(MQTTToAMQP(topic), ".") {
				if w == "*" || w == "#" {
					t.Fatalf("topic %q maps to wildcard word in %q", topic, MQTTToAMQP(topic))
				}
			}
		}
		if validFilter(filter) && validTopic(topic) && !strings.HasPrefix(topic, "$") {
			want := MatchFilter(filter, topic)
			got := amqpMatch(strings.Split(MQTTToAMQP(filter), "."), strings.Split(MQTTToAMQP(topic), "."))
			if got != want {
				t.Fatalf("filter %q topic %q: MQTT match %v, AMQP match of %q %q %v",
					filter, topic, want, MQTTToAMQP(filter), MQTTToAMQP(topic), got)
			}
			if validFilter(topic) {
				if i, ok := IntersectFilters(filter, topic); ok != want || (ok && i != topic) {
					t.Fatalf("IntersectFilters(%q, %q) = %q, %v; want %q, %v", filter, topic, i, ok, topic, want)
				}
			}
		}
	})
}
