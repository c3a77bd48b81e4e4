package pingreq

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// fuzzLimits are the report limits a fuzz input can select; small ones
// make oversized reports common.
var fuzzLimits = [...]int{4096, 1, 8, 300}

// wellFormed splits in into whole packets whose remaining lengths are
// valid and whose PINGREQ payloads fit max. ok is false if in is not such
// a concatenation.
func wellFormed(in []byte, max int) (pkts [][]byte, ok bool) {
	for len(in) > 0 {
		val, n, status := refLength(in[1:])
		if status != lengthOK || 1+n+val > len(in) || (in[0] == pingreqByte && val > max) {
			return nil, false
		}
		pkts = append(pkts, in[:1+n+val])
		in = in[1+n+val:]
	}
	return pkts, true
}

func FuzzConnRead(f *testing.F) {
	s, _ := testStream(false)
	f.Add(s.in, uint64(0))
	f.Add(s.in, uint64(0x0102_0304_0506_0701))
	f.Add([]byte{0xC0, 0x00, 0xC0, 0x03, '{', '}', ' ', 0xC0, 0x80, 0x00}, uint64(0x11))
	f.Add([]byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x01, 0xC0, 0x01, 'x'}, uint64(0x21))
	f.Add([]byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0xC0, 0x01, 'x'}, uint64(0x31))
	f.Add(concat(packet(0x30, filler(200, 1)), packet(0xC0, jsonReport(9)), []byte{0xC0, 0x7F}), uint64(0x0201))
	f.Add(concat([]byte{0xC1, 0x02, 0xC0, 0x00}, packet(0xC0, []byte("{}"))), uint64(0x41))

	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		max := fuzzLimits[seed%uint64(len(fuzzLimits))]
		maxChunk := 1 + int(seed>>2%64)
		maxBuf := 1 + int(seed>>8%32)
		if seed&(1<<14) != 0 {
			maxBuf = 2048
		}
		rng := rand.New(rand.NewPCG(seed, uint64(len(in))))

		var sizes []int
		for n := 0; n < len(in); {
			s := 1 + rng.IntN(maxChunk)
			sizes = append(sizes, s)
			n += s
		}
		inner := newChunkConn(splitAt(bytes.Clone(in), sizes)...)
		if seed&(1<<15) != 0 {
			inner.finalErr = io.EOF // EOF together with the last bytes
		}
		c := NewConn(inner, max)
		res := drive(t, c, inner, func() int { return 1 + rng.IntN(maxBuf) }, nil)

		pings := bytes.Count(in, []byte{pingreqByte})
		if len(res.out) > len(in)+2*pings {
			t.Fatalf("output %d bytes for %d input bytes with %d PINGREQs", len(res.out), len(in), pings)
		}
		if len(res.out) > len(in) {
			t.Fatalf("output %d bytes longer than input %d", len(res.out), len(in))
		}

		wantOut, wantPayloads, wantOversized := reference(in, max)
		if !bytes.Equal(res.out, wantOut) {
			t.Fatalf("output\n got %x\nwant %x", res.out, wantOut)
		}
		if len(res.payloads) != len(wantPayloads) {
			t.Fatalf("lifted %d payloads, want %d", len(res.payloads), len(wantPayloads))
		}
		for i := range wantPayloads {
			if !bytes.Equal(res.payloads[i], wantPayloads[i]) {
				t.Fatalf("payload %d: got %q want %q", i, res.payloads[i], wantPayloads[i])
			}
		}
		if res.oversized != wantOversized {
			t.Fatalf("oversized %v, want %v", res.oversized, wantOversized)
		}
		if wantOversized {
			if !errors.Is(res.err, ErrReportTooLarge) {
				t.Fatalf("error %v, want ErrReportTooLarge", res.err)
			}
		} else if !errors.Is(res.err, io.EOF) {
			t.Fatalf("error %v, want io.EOF", res.err)
		}
		if c.Dropped() != 0 || c.Lifted() != uint64(len(wantPayloads)) {
			t.Fatalf("lifted %d dropped %d, want %d and 0", c.Lifted(), c.Dropped(), len(wantPayloads))
		}

		// A stream of whole packets comes out with every extended
		// PINGREQ's payload stripped.
		if pkts, ok := wellFormed(in, max); ok {
			var want []byte
			var payloads [][]byte
			for _, p := range pkts {
				if p[0] == pingreqByte {
					if len(p) > 2 || p[1] != 0 {
						_, n, _ := refLength(p[1:])
						if len(p) > 1+n {
							payloads = append(payloads, p[1+n:])
						}
					}
					want = append(want, pingreqByte, 0)
					continue
				}
				want = append(want, p...)
			}
			if !bytes.Equal(res.out, want) || len(res.payloads) != len(payloads) {
				t.Fatalf("well-formed input: output\n got %x\nwant %x", res.out, want)
			}
			for i := range payloads {
				if !bytes.Equal(res.payloads[i], payloads[i]) {
					t.Fatalf("well-formed input: payload %d: got %q want %q", i, res.payloads[i], payloads[i])
				}
			}
		}
	})
}
