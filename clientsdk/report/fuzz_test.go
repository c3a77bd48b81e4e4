package report

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"
)

// FuzzDecode: every payload is either rejected with an error wrapping
// ErrMalformed or decodes to a report within the documented bounds that
// Encode writes back without loss; Decode never changes its input, never
// accepts more than MaxPayload bytes, and reads a JSON report the same
// with an empty MQTT properties area in front of it.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"msgsInQueue": 3, "processingTimePerMsg": 25.5}`))
	f.Add([]byte(`{"numberOfMsgsInQueue": 7, "processingTimerPerMsg": 50}`))
	f.Add([]byte(`{"msgsInQueue":4,"processingTimePerMsg":10,"workers":2,"inProgress":2,"backlogMs":20.5,"received":99}`))
	f.Add([]byte(`{"msgsInQueue":1,"processed":3,"received":9223372036854774784,"backlogMs":86400000}`))
	f.Add([]byte(`{"MSGSINQUEUE": 2, "msgsInQueue": null, "numberOfMsgsInQueue": 4}`))
	f.Add([]byte("\x05\x26\x00\x01a\x00{\"msgsInQueue\": 6}"))
	f.Add([]byte("\x00 {\"msgsInQueue\": 6}"))
	f.Add([]byte("\xff\xff\xff\xff"))
	f.Add([]byte(`{"msgsInQueue": -1e400}`))
	f.Add([]byte(`{"msgsInQueue": 2147483647.0, "processingTimePerMsg": 1e-9}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		orig := bytes.Clone(payload)
		r, err := Decode(payload)
		if !bytes.Equal(payload, orig) {
			t.Fatal("Decode changed its input")
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(payload) > MaxPayload {
			t.Fatalf("accepted %d bytes, more than MaxPayload", len(payload))
		}
		for name, v := range map[string]int{"pending": r.Pending, "workers": r.Workers, "inProgress": r.InProgress, "processed": r.Processed} {
			if v < 0 || v > math.MaxInt32 {
				t.Fatalf("%s %d out of [0, MaxInt32]: %+v", name, v, r)
			}
		}
		if r.ProcessingTime < 0 || r.ProcessingTime > maxProcessingTime || r.Backlog < 0 || r.Backlog > maxProcessingTime {
			t.Fatalf("durations out of [0, %v]: %+v", maxProcessingTime, r)
		}
		if r.Received > math.MaxInt64 || (!r.HasReceived && r.Received != 0) || (!r.HasBacklog && r.Backlog != 0) {
			t.Fatalf("optional fields inconsistent: %+v", r)
		}

		// Encode writes back every field; a duration may come back 1ns
		// off, as milliseconds in float64 cannot hold every nanosecond.
		again, err := Decode(Encode(r))
		if err != nil {
			t.Fatalf("re-decoding %+v (%s): %v", r, Encode(r), err)
		}
		if !sameReport(r, again) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}

		// A plain JSON report reads the same behind an empty properties
		// area.
		if body := bytes.TrimLeft(payload, " \t\r\n"); len(payload) < MaxPayload && len(body) > 0 && body[0] == '{' {
			withProps, err := Decode(append([]byte{0}, payload...))
			if err != nil || withProps != r {
				t.Fatalf("behind an empty properties area: %+v, %v; want %+v", withProps, err, r)
			}
		}
	})
}

// sameReport compares reports, durations to within a nanosecond.
func sameReport(a, b Report) bool {
	near := func(x, y time.Duration) bool { return x-y <= 1 && y-x <= 1 }
	if !near(a.ProcessingTime, b.ProcessingTime) || !near(a.Backlog, b.Backlog) {
		return false
	}
	a.ProcessingTime, a.Backlog = b.ProcessingTime, b.Backlog
	return a == b
}

// FuzzVarint: DecodeVarint reads at most 4 bytes, fails exactly when the
// input ends inside them (ErrVarintTruncated) or the fourth has the
// continuation bit (ErrVarintTooLong), and otherwise returns the value
// those bytes encode, which AppendVarint writes back in as many bytes or
// fewer (only overlong encodings are longer).
func FuzzVarint(f *testing.F) {
	f.Add([]byte{0x00})
	f.Add([]byte{0x7F, 0x01})
	f.Add([]byte{0x80, 0x01})
	f.Add([]byte{0x80, 0x80, 0x80, 0x00})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0x7F})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0x7F})
	f.Add([]byte{0x80, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, used, err := DecodeVarint(b)
		cont := 0 // leading bytes with the continuation bit, up to 4
		for cont < len(b) && cont < 4 && b[cont]&0x80 != 0 {
			cont++
		}
		switch {
		case cont == 4:
			if !errors.Is(err, ErrVarintTooLong) {
				t.Fatalf("% x: error %v, want ErrVarintTooLong", b, err)
			}
			return
		case cont == len(b):
			if !errors.Is(err, ErrVarintTruncated) {
				t.Fatalf("% x: error %v, want ErrVarintTruncated", b, err)
			}
			return
		}
		if err != nil || used != cont+1 {
			t.Fatalf("% x: used %d, err %v; want %d bytes", b, used, err, cont+1)
		}
		want := 0
		for i := used - 1; i >= 0; i-- {
			want = want<<7 | int(b[i]&0x7F)
		}
		if v != want || v > 268435455 {
			t.Fatalf("% x: value %d, want %d", b, v, want)
		}
		enc := AppendVarint(nil, v)
		if len(enc) > used {
			t.Fatalf("% x: value %d re-encoded in %d bytes", b, v, len(enc))
		}
		if len(enc) == used && !bytes.Equal(enc, b[:used]) {
			t.Fatalf("% x: minimal encoding of %d is % x", b, v, enc)
		}
		if back, n, err := DecodeVarint(enc); err != nil || back != v || n != len(enc) {
			t.Fatalf("AppendVarint(%d) = % x decodes to %d, %d, %v", v, enc, back, n, err)
		}
	})
}
