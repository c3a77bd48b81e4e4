package report

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecodeAcceptsBothSpellings(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    Report
	}{
		{"digest spelling", `{"msgsInQueue": 3, "processingTimePerMsg": 25.5}`,
			Report{Pending: 3, ProcessingTime: 25500 * time.Microsecond}},
		{"thesis java spelling", `{"numberOfMsgsInQueue": 7, "processingTimerPerMsg": 50}`,
			Report{Pending: 7, ProcessingTime: 50 * time.Millisecond}},
		{"integral float count", `{"msgsInQueue": 2.0, "processingTimePerMsg": 0}`,
			Report{Pending: 2}},
		{"processing time optional", `{"msgsInQueue": 0}`, Report{}},
		{"unknown keys ignored", `{"msgsInQueue": 1, "processingTimePerMsg": 1, "cpu": "high", "nested": {"a": [1]}}`,
			Report{Pending: 1, ProcessingTime: time.Millisecond}},
		{"luffymq extensions", `{"msgsInQueue":4,"processingTimePerMsg":10,"workers":2,"inProgress":2,"processed":7,"backlogMs":20.5,"received":99}`,
			Report{Pending: 4, ProcessingTime: 10 * time.Millisecond, Workers: 2, InProgress: 2, Processed: 7,
				Backlog: 20500 * time.Microsecond, HasBacklog: true, Received: 99, HasReceived: true}},
		{"leading whitespace", " \n{\"msgsInQueue\": 5}", Report{Pending: 5}},
		{"properties area before the JSON", "\x05\x26\x00\x01a\x00" + `{"msgsInQueue": 6}`,
			Report{Pending: 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.payload))
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestDecodeRejectsBadInputWithClearErrors(t *testing.T) {
	tests := []struct {
		name, payload, mentions string
	}{
		{"empty", "", "neither"},
		{"not json", "hello", "neither"},
		{"array", "[1,2]", "neither"},
		{"null pending", `{"msgsInQueue": null}`, "missing msgsInQueue"},
		{"missing pending", `{"processingTimePerMsg": 3}`, "missing msgsInQueue"},
		{"negative pending", `{"msgsInQueue": -1}`, "msgsInQueue"},
		{"fractional pending", `{"msgsInQueue": 1.5}`, "msgsInQueue"},
		{"string pending", `{"msgsInQueue": "3"}`, "msgsInQueue"},
		{"negative time", `{"msgsInQueue": 1, "processingTimePerMsg": -3}`, "processingTimePerMsg"},
		{"absurd time", `{"msgsInQueue": 1, "processingTimePerMsg": 1e300}`, "processingTimePerMsg"},
		{"huge pending", `{"msgsInQueue": 1e12}`, "msgsInQueue"},
		{"trailing data", `{"msgsInQueue": 1} {"msgsInQueue": 2}`, "trailing"},
		{"properties overrun", "\x40abc", "MQTT properties"},
		{"oversized", `{"msgsInQueue": 1, "pad": "` + strings.Repeat("x", MaxPayload) + `"}`, "allowed"},
		{"bad workers", `{"msgsInQueue": 1, "workers": -2}`, "workers"},
		{"bad received", `{"msgsInQueue": 1, "received": 0.5}`, "received"},
		{"bad processed", `{"msgsInQueue": 1, "processed": -1}`, "processed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.payload))
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "error %v must wrap ErrMalformed", err)
			require.Contains(t, err.Error(), tt.mentions)
		})
	}
}

func TestEncodeRoundTrips(t *testing.T) {
	reports := []Report{
		{},
		{Pending: 3, ProcessingTime: 25100 * time.Microsecond},
		{Pending: 1, ProcessingTime: time.Millisecond, Workers: 4, InProgress: 3, Processed: 9,
			Backlog: 12 * time.Millisecond, HasBacklog: true, Received: 12345, HasReceived: true},
		{Pending: 0, HasBacklog: true, HasReceived: true},
	}
	for _, r := range reports {
		got, err := Decode(Encode(r))
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
}

func TestEncodePingreqFraming(t *testing.T) {
	r := Report{Pending: 2, ProcessingTime: 5 * time.Millisecond}
	pk := EncodePingreq(r)
	payload := Encode(r)
	require.Equal(t, byte(PingreqType), pk[0])
	require.Equal(t, byte(len(payload)), pk[1], "short payloads need a one-byte length")
	require.Equal(t, payload, pk[2:])

	// A payload of 200 bytes needs a two-byte remaining length.
	long := Report{Pending: 2147483647, ProcessingTime: 86399999 * time.Millisecond, Workers: 2147483647,
		InProgress: 2147483647, Backlog: time.Hour, HasBacklog: true, Received: 1 << 62, HasReceived: true}
	require.Greater(t, len(Encode(long)), 127)
	pk = EncodePingreq(long)
	n, used, err := DecodeVarint(pk[1:])
	require.NoError(t, err)
	require.Equal(t, 2, used)
	require.Equal(t, len(pk)-1-used, n)
}

func TestDecodeVarint(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 16383, 16384, 2097151, 2097152, 268435455} {
		b := AppendVarint(nil, n)
		got, used, err := DecodeVarint(b)
		require.NoError(t, err)
		require.Equal(t, n, got)
		require.Equal(t, len(b), used)
	}
	_, _, err := DecodeVarint([]byte{0xff, 0xff, 0xff, 0xff, 0x01})
	require.Error(t, err)
	_, _, err = DecodeVarint([]byte{0x80})
	require.Error(t, err)
}
