package clientsdk

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// User Property keys the SDK reads or writes.
const (
	// SentAtProperty carries the publisher's send time in Unix nanoseconds
	// (see PublisherConfig.StampSentAt and SentAt).
	SentAtProperty = "luffy-sent-at"
	// MessageIDProperty carries a publisher-assigned message ID that
	// consumers use to deduplicate redeliveries (see
	// PublisherConfig.StampMessageID and Message.ID).
	MessageIDProperty = "luffy-msg-id"
	// AttemptsProperty on a dead-lettered message is the number of times
	// the handler was called.
	AttemptsProperty = "luffy-attempts"
	// ErrorProperty on a dead-lettered message is the last handler error.
	ErrorProperty = "luffy-error"
	// FirstFailureProperty on a dead-lettered message is the time of the
	// first failed attempt, RFC 3339 with nanoseconds.
	FirstFailureProperty = "luffy-first-failure"
	// OriginalTopicProperty on a dead-lettered message is the topic the
	// message was first published to.
	OriginalTopicProperty = "luffy-original-topic"
)

// UserProperty is one MQTT v5 User Property. A packet may carry a key more
// than once, so properties are kept as an ordered list.
type UserProperty struct {
	Key   string
	Value string
}

// Handler processes one message. A nil error acknowledges it (QoS 1 and 2);
// an error makes the Subscriber retry it and, after the last attempt, send it
// to the dead-letter topic. ctx is cancelled when the Subscriber gives up on
// in-flight work during Close.
type Handler func(ctx context.Context, m *Message) error

// Message is an application message delivered to a Handler.
type Message struct {
	// Topic is the topic the message was published to.
	Topic string
	// Group is the shared group the message was delivered through.
	Group string
	// Payload is the message body.
	Payload []byte
	// QoS is the quality of service the message was delivered with.
	QoS byte
	// Retain is the RETAIN flag as delivered.
	Retain bool
	// Duplicate is the DUP flag: the broker may have delivered the message
	// to this session before.
	Duplicate bool
	// PacketID is the MQTT packet identifier (0 for QoS 0). It identifies
	// the delivery, not the message: use ID for deduplication.
	PacketID uint16
	// ID is the publisher-assigned message ID from the MessageIDProperty
	// User Property, or "" if the publisher set none. Consumers that must
	// process a message once deduplicate on it.
	ID string
	// ContentType is the MQTT v5 Content Type property.
	ContentType string
	// ResponseTopic is the MQTT v5 Response Topic property.
	ResponseTopic string
	// CorrelationData is the MQTT v5 Correlation Data property.
	CorrelationData []byte
	// UserProperties are the message's User Properties in wire order.
	UserProperties []UserProperty
	// ReceivedAt is when the Subscriber received the message from the
	// broker, before it entered the pending queue.
	ReceivedAt time.Time
	// Attempt is the 1-based number of the current handler call.
	Attempt int
}

// UserProperty returns the value of the first User Property named key.
func (m *Message) UserProperty(key string) (string, bool) {
	for _, p := range m.UserProperties {
		if p.Key == key {
			return p.Value, true
		}
	}
	return "", false
}

// SentAt returns the publisher's send time stamped in the SentAtProperty
// User Property, and whether the message carried a valid one.
func SentAt(m *Message) (time.Time, bool) {
	v, ok := m.UserProperty(SentAtProperty)
	if !ok {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ns <= 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// topicMatches says whether an MQTT topic filter matches topic. A filter
// starting with a wildcard does not match topics starting with '$'.
func topicMatches(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		if !fmore || !tmore {
			// "a/#" also matches "a".
			return fmore == tmore || (fmore && frest == "#")
		}
		filter, topic = frest, trest
	}
}
