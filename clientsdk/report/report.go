// Package report defines the LuffyMQ load-report wire format, shared by the
// broker and the client SDK.
//
// A load report tells the broker how busy a shared-subscription member is.
// It travels either as the payload of an extended MQTT PINGREQ (packet type
// 0xC0 with a non-zero remaining length) or as the payload of a PUBLISH to
// [LoadTopic]. The payload is a JSON object:
//
//	{"msgsInQueue": 3, "processingTimePerMsg": 25.1}
//
// msgsInQueue counts messages received but not yet taken for processing;
// processingTimePerMsg is the mean processing time in milliseconds of the
// messages processed since the previous report (0 if none). The spellings of
// the original research client, numberOfMsgsInQueue and
// processingTimerPerMsg, are accepted too. LuffyMQ's SDK adds optional keys
// that sharpen the broker's prediction; brokers that do not know them ignore
// them, and this decoder ignores keys it does not know.
package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

const (
	// ReservedTopicPrefix starts every topic the broker reserves for
	// itself: nothing on them is retained or routed, no client may
	// subscribe to them, and a client may publish on them only its own
	// load report, to LoadTopic.
	ReservedTopicPrefix = "$luffy/"

	// LoadTopic is the topic a client publishes its own load report to.
	// The broker consumes such publishes; they are never routed.
	LoadTopic = ReservedTopicPrefix + "load"

	// ReportIntervalProperty is the CONNACK User Property in which the
	// broker announces the report interval in milliseconds.
	ReportIntervalProperty = "luffy-report-interval-ms"

	// MaxPayload is the largest report payload in bytes the broker accepts.
	MaxPayload = 4096

	// PingreqType is the first byte of an MQTT PINGREQ packet.
	PingreqType = 0xC0

	// maxProcessingTime bounds a credible per-message processing time.
	maxProcessingTime = 24 * time.Hour
)

// Report is one load report from a shared-subscription member.
type Report struct {
	// Pending is the number of messages received but not yet taken for
	// processing (msgsInQueue).
	Pending int
	// ProcessingTime is the mean processing time of the messages processed
	// since the previous report, or 0 if none were (processingTimePerMsg).
	ProcessingTime time.Duration
	// Workers is the number of messages the member processes in parallel
	// (optional "workers"; 0 means unknown, treated as 1).
	Workers int
	// InProgress is the number of messages being processed right now
	// (optional "inProgress").
	InProgress int
	// Backlog is the member's own estimate of the time until it can start a
	// newly received message (optional "backlogMs"). HasBacklog says
	// whether it was present.
	Backlog    time.Duration
	HasBacklog bool
	// Processed is how many messages ProcessingTime is the mean of
	// (optional "processed"; 0 means not given). It lets the broker weigh a
	// report covering many messages above one covering a single message.
	Processed int
	// Received is the number of messages the member has received on this
	// connection (optional "received"); it lets the broker count messages
	// still on the wire. HasReceived says whether it was present.
	Received    uint64
	HasReceived bool
}

// wireReport is the JSON shape of a report; raw values tell absent from
// zero and let numbers be checked strictly (a quoted "3" is not a number).
type wireReport struct {
	MsgsInQueue           json.RawMessage `json:"msgsInQueue"`
	NumberOfMsgsInQueue   json.RawMessage `json:"numberOfMsgsInQueue"`
	ProcessingTimePerMsg  json.RawMessage `json:"processingTimePerMsg"`
	ProcessingTimerPerMsg json.RawMessage `json:"processingTimerPerMsg"`
	Workers               json.RawMessage `json:"workers"`
	InProgress            json.RawMessage `json:"inProgress"`
	BacklogMs             json.RawMessage `json:"backlogMs"`
	Processed             json.RawMessage `json:"processed"`
	Received              json.RawMessage `json:"received"`
}

// ErrMalformed is wrapped by every error Decode returns for bad input.
var ErrMalformed = errors.New("malformed load report")

// Decode parses a report payload: a JSON object, optionally preceded by an
// MQTT v5 properties area (a variable-byte length and that many bytes of
// properties, which are skipped).
func Decode(payload []byte) (Report, error) {
	if len(payload) > MaxPayload {
		return Report{}, fmt.Errorf("%w: %d bytes, more than the %d allowed", ErrMalformed, len(payload), MaxPayload)
	}
	if body := bytes.TrimLeft(payload, " \t\r\n"); len(body) > 0 && body[0] == '{' {
		return decodeJSON(body)
	}
	// Not plain JSON: a properties area may come first.
	n, used, err := DecodeVarint(payload)
	if err == nil && used+n <= len(payload) {
		if body := bytes.TrimLeft(payload[used+n:], " \t\r\n"); len(body) > 0 && body[0] == '{' {
			return decodeJSON(body)
		}
	}
	return Report{}, fmt.Errorf("%w: payload (%d bytes) is neither a JSON object nor MQTT properties followed by one", ErrMalformed, len(payload))
}

func decodeJSON(body []byte) (Report, error) {
	var w wireReport
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return Report{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Report{}, fmt.Errorf("%w: trailing data after the JSON object", ErrMalformed)
	}
	var r Report
	pending := firstOf(w.MsgsInQueue, w.NumberOfMsgsInQueue)
	if pending == nil {
		return Report{}, fmt.Errorf("%w: missing msgsInQueue", ErrMalformed)
	}
	var err error
	if r.Pending, err = count("msgsInQueue", pending); err != nil {
		return Report{}, err
	}
	if pt := firstOf(w.ProcessingTimePerMsg, w.ProcessingTimerPerMsg); pt != nil {
		if r.ProcessingTime, err = millis("processingTimePerMsg", pt); err != nil {
			return Report{}, err
		}
	}
	if present(w.Workers) {
		if r.Workers, err = count("workers", w.Workers); err != nil {
			return Report{}, err
		}
	}
	if present(w.InProgress) {
		if r.InProgress, err = count("inProgress", w.InProgress); err != nil {
			return Report{}, err
		}
	}
	if present(w.Processed) {
		if r.Processed, err = count("processed", w.Processed); err != nil {
			return Report{}, err
		}
	}
	if present(w.BacklogMs) {
		if r.Backlog, err = millis("backlogMs", w.BacklogMs); err != nil {
			return Report{}, err
		}
		r.HasBacklog = true
	}
	if present(w.Received) {
		n, err := wholeNumber("received", w.Received, math.MaxInt64)
		if err != nil {
			return Report{}, err
		}
		r.Received, r.HasReceived = uint64(n), true
	}
	return r, nil
}

// present reports whether a key was given a non-null value.
func present(v json.RawMessage) bool { return len(v) > 0 && string(v) != "null" }

func firstOf(a, b json.RawMessage) json.RawMessage {
	if present(a) {
		return a
	}
	if present(b) {
		return b
	}
	return nil
}

// number parses a JSON number (not a string, bool or object).
func number(key string, v json.RawMessage) (float64, error) {
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: %s must be a number, got %.40s", ErrMalformed, key, v)
	}
	return f, nil
}

// count parses a non-negative whole number up to MaxInt32; integral floats
// such as 3.0 are accepted because some JSON encoders write every number
// that way.
func count(key string, v json.RawMessage) (int, error) {
	n, err := wholeNumber(key, v, math.MaxInt32)
	return int(n), err
}

func wholeNumber(key string, v json.RawMessage, max float64) (int64, error) {
	f, err := number(key, v)
	if err != nil {
		return 0, err
	}
	// max may be 2^63 - 1, which float64 rounds to 2^63: refuse that too.
	if f < 0 || f != math.Trunc(f) || f > max || f >= 0x1p63 {
		return 0, fmt.Errorf("%w: %s must be a whole number from 0 to %.0f, got %s", ErrMalformed, key, max, v)
	}
	return int64(f), nil
}

// millis parses a non-negative number of milliseconds.
func millis(key string, v json.RawMessage) (time.Duration, error) {
	f, err := number(key, v)
	if err != nil {
		return 0, err
	}
	if f < 0 || f > float64(maxProcessingTime/time.Millisecond) {
		return 0, fmt.Errorf("%w: %s must be milliseconds from 0 to %d, got %s", ErrMalformed, key, maxProcessingTime/time.Millisecond, v)
	}
	return time.Duration(f * float64(time.Millisecond)), nil
}

// Encode returns the JSON payload of r, in the canonical key spellings.
func Encode(r Report) []byte {
	buf := make([]byte, 0, 128)
	return AppendJSON(buf, r)
}

// AppendJSON appends the JSON payload of r to buf and returns it.
func AppendJSON(buf []byte, r Report) []byte {
	buf = append(buf, `{"msgsInQueue":`...)
	buf = strconv.AppendInt(buf, int64(r.Pending), 10)
	buf = append(buf, `,"processingTimePerMsg":`...)
	buf = appendMillis(buf, r.ProcessingTime)
	if r.Workers > 0 {
		buf = append(buf, `,"workers":`...)
		buf = strconv.AppendInt(buf, int64(r.Workers), 10)
	}
	if r.InProgress > 0 {
		buf = append(buf, `,"inProgress":`...)
		buf = strconv.AppendInt(buf, int64(r.InProgress), 10)
	}
	if r.Processed > 0 {
		buf = append(buf, `,"processed":`...)
		buf = strconv.AppendInt(buf, int64(r.Processed), 10)
	}
	if r.HasBacklog {
		buf = append(buf, `,"backlogMs":`...)
		buf = appendMillis(buf, r.Backlog)
	}
	if r.HasReceived {
		buf = append(buf, `,"received":`...)
		buf = strconv.AppendUint(buf, r.Received, 10)
	}
	return append(buf, '}')
}

func appendMillis(buf []byte, d time.Duration) []byte {
	return strconv.AppendFloat(buf, float64(d)/float64(time.Millisecond), 'f', -1, 64)
}

// EncodePingreq returns a complete extended PINGREQ packet carrying r:
// 0xC0, the variable-byte remaining length, and the JSON payload. Write it to
// the connection in a single Write so it cannot interleave with other packets.
func EncodePingreq(r Report) []byte {
	payload := Encode(r)
	pk := make([]byte, 0, len(payload)+5)
	pk = append(pk, PingreqType)
	pk = AppendVarint(pk, len(payload))
	return append(pk, payload...)
}

// AppendVarint appends n as an MQTT variable-byte integer.
func AppendVarint(buf []byte, n int) []byte {
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		buf = append(buf, b)
		if n == 0 {
			return buf
		}
	}
}

// Errors of DecodeVarint.
var (
	ErrVarintTruncated = errors.New("truncated variable-byte integer")
	ErrVarintTooLong   = errors.New("variable-byte integer longer than 4 bytes")
)

// DecodeVarint reads an MQTT variable-byte integer (a packet's remaining
// length) from the front of b and returns its value and how many bytes it
// used. It fails with ErrVarintTruncated if b ends inside it and
// ErrVarintTooLong if it runs past the 4 bytes MQTT allows.
func DecodeVarint(b []byte) (value, used int, err error) {
	multiplier := 1
	for i := 0; i < 4; i++ {
		if i >= len(b) {
			return 0, 0, ErrVarintTruncated
		}
		value += int(b[i]&0x7f) * multiplier
		if b[i]&0x80 == 0 {
			return value, i + 1, nil
		}
		multiplier *= 128
	}
	return 0, 0, ErrVarintTooLong
}
