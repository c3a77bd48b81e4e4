package pingreq

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// chunkConn is an in-memory net.Conn whose Reads return its chunks one at
// a time (a chunk larger than the caller's buffer is split). Only Read is
// implemented; the embedded nil net.Conn panics on anything else.
type chunkConn struct {
	net.Conn
	chunks   [][]byte
	consumed int   // bytes returned so far
	finalErr error // returned together with the last bytes when non-nil; io.EOF after them otherwise
}

func newChunkConn(chunks ...[]byte) *chunkConn {
	var cs [][]byte
	for _, ch := range chunks {
		if len(ch) > 0 {
			cs = append(cs, ch)
		}
	}
	return &chunkConn{chunks: cs}
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		if c.finalErr != nil {
			return 0, c.finalErr
		}
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	c.consumed += n
	if len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
		if len(c.chunks) == 0 && c.finalErr != nil {
			return n, c.finalErr
		}
	}
	return n, nil
}

// splitAt cuts b into chunks of the given sizes (the last chunk takes the
// rest).
func splitAt(b []byte, sizes []int) [][]byte {
	var out [][]byte
	for _, s := range sizes {
		if s > len(b) {
			s = len(b)
		}
		out = append(out, b[:s])
		b = b[s:]
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

func chunksOf(b []byte, size int) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(size, len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// varint encodes n as an MQTT variable byte integer.
func varint(n int) []byte {
	var out []byte
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		out = append(out, b)
		if n == 0 {
			return out
		}
	}
}

// packet returns a packet with fixed header byte typ and the given body.
func packet(typ byte, body []byte) []byte {
	out := append([]byte{typ}, varint(len(body))...)
	return append(out, body...)
}

// filler returns n bytes that include PINGREQ-looking bytes, to catch a
// reader that parses packet bodies.
func filler(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		switch i % 5 {
		case 0:
			b[i] = 0xC0
		case 1:
			b[i] = byte(i) | 0x80
		default:
			b[i] = byte(i) + seed
		}
	}
	return b
}

func jsonReport(n int) []byte {
	head := fmt.Sprintf(`{"pending":%d,"pad":"`, n)
	tail := `"}`
	if n < len(head)+len(tail) {
		return bytes.Repeat([]byte("7"), n) // a JSON number
	}
	pad := bytes.Repeat([]byte{'x'}, n-len(head)-len(tail))
	return append(append([]byte(head), pad...), tail...)
}

// stream is an input byte stream with what the Conn must make of it.
type stream struct {
	in       []byte
	want     []byte   // in with every extended PINGREQ replaced by C0 00
	payloads [][]byte // lifted payloads in order
	inEnd    []int    // end offset in in of each extended PINGREQ
	outEnd   []int    // end offset in want of its replacement
}

// add appends a packet; an extended PINGREQ is a 0xC0 packet with a
// non-empty body. A PINGREQ with an empty body comes out as C0 00 too,
// whatever the encoding of its zero length.
func (s *stream) add(pkts ...[]byte) *stream {
	for _, p := range pkts {
		s.in = append(s.in, p...)
		if p[0] == pingreqByte && len(p) > 2 {
			_, n, _ := refLength(p[1:])
			if len(p) == 1+n {
				s.want = append(s.want, pingreqByte, 0)
				continue
			}
			s.payloads = append(s.payloads, p[1+n:])
			s.want = append(s.want, pingreqByte, 0)
			s.inEnd = append(s.inEnd, len(s.in))
			s.outEnd = append(s.outEnd, len(s.want))
			continue
		}
		s.want = append(s.want, p...)
	}
	return s
}

// readResult is what driving a Conn to its end produced.
type readResult struct {
	out       []byte
	payloads  [][]byte
	oversized bool
	err       error
	reads     int
}

// drive reads c until it returns an error, with caller buffer sizes from
// bufSize, taking the lifted reports after every Read. If s is non-nil it
// checks after every Read that a replacement C0 00 is only delivered after
// its PINGREQ was read whole and its payload queued.
func drive(t testing.TB, c *Conn, inner *chunkConn, bufSize func() int, s *stream) readResult {
	t.Helper()
	var res readResult
	limit := 4*len(s.inOrNil()) + 1000
	if inner != nil {
		for _, ch := range inner.chunks {
			limit += 4 * len(ch)
		}
	}
	var buf []byte
	if s != nil {
		res.out = make([]byte, 0, len(s.want))
	}
	for {
		res.reads++
		if res.reads > limit {
			t.Fatalf("no end after %d reads", res.reads)
		}
		size := bufSize()
		if size > len(buf) {
			buf = make([]byte, size)
		}
		n, err := c.Read(buf[:size])
		if n < 0 || n > size {
			t.Fatalf("Read returned n=%d for a %d-byte buffer", n, size)
		}
		res.out = append(res.out, buf[:n]...)
		payloads, oversized := c.TakeLiftedReports()
		res.payloads = append(res.payloads, payloads...)
		res.oversized = oversized
		if s != nil {
			for k, end := range s.outEnd {
				if end > len(res.out) {
					break
				}
				if len(res.payloads) <= k {
					t.Fatalf("PINGREQ %d delivered (output %d bytes) before its payload was queued", k, len(res.out))
				}
				if inner != nil && s.inEnd[k] > inner.consumed {
					t.Fatalf("PINGREQ %d delivered before its payload was read (read %d of %d bytes)", k, inner.consumed, s.inEnd[k])
				}
			}
		}
		if err != nil {
			res.err = err
			return res
		}
	}
}

func (s *stream) inOrNil() []byte {
	if s == nil {
		return nil
	}
	return s.in
}

func fixed(n int) func() int { return func() int { return n } }

// refLength decodes an MQTT variable byte integer at the start of b. ok is
// false when b ends inside it; bad reports a fourth byte with the
// continuation bit set.
func refLength(b []byte) (val, n int, status lengthStatus) {
	mul := 1
	for n = 0; n < 4; n++ {
		if n == len(b) {
			return 0, n, lengthShort
		}
		val += int(b[n]&0x7F) * mul
		mul *= 128
		if b[n]&0x80 == 0 {
			return val, n + 1, lengthOK
		}
	}
	return 0, 4, lengthBad
}

type lengthStatus int

const (
	lengthOK lengthStatus = iota
	lengthShort
	lengthBad
)

// refResult is what a Conn must make of a whole input followed by EOF.
type refResult struct {
	out       []byte   // delivered bytes
	payloads  [][]byte // lifted payloads in order
	oversized bool     // ends with ErrReportTooLarge
	malformed bool     // ends with ErrMalformedLength
}

// reference computes, from the whole input at once, what a Conn with limit
// max must deliver for in followed by EOF.
func reference(in []byte, max int) refResult {
	res := refResult{out: []byte{}}
	for i := 0; i < len(in); {
		typ := in[i]
		val, n, status := refLength(in[i+1:])
		if status == lengthBad {
			// Of a PINGREQ nothing is delivered; of another packet its
			// type and first three length bytes are.
			if typ != pingreqByte {
				res.out = append(res.out, in[i:i+4]...)
			}
			res.malformed = true
			return res
		}
		if typ != pingreqByte {
			end := i + 1 + n + val
			if status != lengthOK || end > len(in) {
				res.out = append(res.out, in[i:]...)
				return res
			}
			res.out = append(res.out, in[i:end]...)
			i = end
			continue
		}
		switch {
		case status == lengthShort:
			return res
		case val > max:
			res.out = append(res.out, pingreqByte, 0)
			res.oversized = true
			return res
		}
		end := i + 1 + n + val
		if end > len(in) {
			return res
		}
		if val > 0 {
			res.payloads = append(res.payloads, in[i+1+n:end])
		}
		res.out = append(res.out, pingreqByte, 0)
		i = end
	}
	return res
}

// requireEOF checks that err is io.EOF.
func requireEOF(t testing.TB, err error) {
	t.Helper()
	require.Truef(t, errors.Is(err, io.EOF), "want io.EOF, got %v", err)
}

// testStream builds interleaved packets for a Conn with the returned limit.
// The big stream also holds PUBLISHes with 3-byte remaining lengths.
func testStream(big bool) (*stream, int) {
	max := 300
	if big {
		max = 4096
	}
	s := &stream{}
	s.add(
		packet(0x10, []byte{0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 60, 0, 0, 4, 's', 'u', 'b', '1'}),
		packet(0xC0, jsonReport(40)),
		packet(0x30, filler(10, 1)),
		packet(0x32, filler(200, 2)),
		[]byte{0xC0, 0x00},
		packet(0x82, []byte{0, 1, 0, 0, 5, 'a', '/', 'b', '/', 'c', 1}),
		packet(0xC0, jsonReport(127)),
		packet(0xC0, jsonReport(128)),
		packet(0x30, filler(127, 3)),
		packet(0x30, filler(128, 4)),
	)
	if big {
		s.add(packet(0x30, filler(16384, 5)), packet(0xC0, jsonReport(300)), packet(0x30, filler(20000, 6)))
	} else {
		s.add(packet(0x30, filler(1000, 5)))
	}
	s.add(
		packet(0xC0, jsonReport(max)),
		packet(0xC0, []byte("1")),
		packet(0x40, []byte{0, 1}),
		[]byte{0xC0, 0x00},
		[]byte{0xC0, 0x00},
		packet(0xC0, jsonReport(max-1)),
		packet(0xD0, nil),
		packet(0x82, []byte{0, 2, 0, 0, 1, '#', 0}),
		packet(0xC0, jsonReport(2)),
		packet(0xE0, nil),
	)
	return s, max
}

func requireStream(t *testing.T, s *stream, res readResult, msg string) {
	t.Helper()
	requireEOF(t, res.err)
	require.Equal(t, len(s.want), len(res.out), "%s: output length", msg)
	require.True(t, bytes.Equal(s.want, res.out), "%s: output differs", msg)
	requirePayloads(t, s.payloads, res.payloads, msg)
	require.False(t, res.oversized, msg)
}

// requirePayloads compares payload lists without dumping kilobytes.
func requirePayloads(t *testing.T, want, got [][]byte, msg string) {
	t.Helper()
	require.Equal(t, len(want), len(got), "%s: number of lifted payloads", msg)
	for i := range want {
		if !bytes.Equal(want[i], got[i]) {
			t.Fatalf("%s: payload %d: got %d bytes %.40q..., want %d bytes %.40q...", msg, i, len(got[i]), got[i], len(want[i]), want[i])
		}
	}
}

func TestStreamMatchesReference(t *testing.T) {
	for _, big := range []bool{false, true} {
		s, max := testStream(big)
		ref := reference(s.in, max)
		require.Equal(t, s.want, ref.out)
		require.Equal(t, s.payloads, ref.payloads)
		require.False(t, ref.oversized)
		require.False(t, ref.malformed)
		require.Len(t, s.payloads, map[bool]int{false: 7, true: 8}[big])
	}
}

func TestConnReadEverySplit(t *testing.T) {
	cases := []struct {
		name string
		big  bool
		buf  int
	}{
		{"big stream, 2KiB buffer", true, 2048},
		{"small stream, 2KiB buffer", false, 2048},
		{"small stream, 3-byte buffer", false, 3},
		{"small stream, 1-byte buffer", false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, max := testStream(tc.big)
			for i := 0; i <= len(s.in); i++ {
				inner := newChunkConn(s.in[:i], s.in[i:])
				c := NewConn(inner, max)
				res := drive(t, c, inner, fixed(tc.buf), s)
				requireStream(t, s, res, fmt.Sprintf("split at %d", i))
				require.Equal(t, uint64(len(s.payloads)), c.Lifted())
				require.Zero(t, c.Dropped())
			}
		})
	}
}

func TestConnReadChunked(t *testing.T) {
	bufSizes := []int{1, 2, 3, 4, 5, 7, 64, 2048}
	cases := []struct {
		name   string
		chunks func(in []byte, rng *rand.Rand) [][]byte
		buf    func(rng *rand.Rand) func() int
	}{
		{
			name:   "one inner read holds everything",
			chunks: func(in []byte, _ *rand.Rand) [][]byte { return [][]byte{in} },
			buf:    func(*rand.Rand) func() int { return fixed(1 << 16) },
		},
		{
			name: "random inner chunks, 2KiB buffer",
			chunks: func(in []byte, rng *rand.Rand) [][]byte {
				var sizes []int
				for n := 0; n < len(in); {
					s := 1 + rng.IntN(3000)
					sizes = append(sizes, s)
					n += s
				}
				return splitAt(in, sizes)
			},
			buf: func(*rand.Rand) func() int { return fixed(2048) },
		},
		{
			name: "small random inner chunks, random buffers",
			chunks: func(in []byte, rng *rand.Rand) [][]byte {
				var sizes []int
				for n := 0; n < len(in); {
					s := 1 + rng.IntN(10)
					sizes = append(sizes, s)
					n += s
				}
				return splitAt(in, sizes)
			},
			buf: func(rng *rand.Rand) func() int {
				return func() int { return bufSizes[rng.IntN(len(bufSizes))] }
			},
		},
		{
			name:   "1-byte inner reads, 2KiB buffer",
			chunks: func(in []byte, _ *rand.Rand) [][]byte { return chunksOf(in, 1) },
			buf:    func(*rand.Rand) func() int { return fixed(2048) },
		},
		{
			name:   "caller buffer of 1 byte",
			chunks: func(in []byte, _ *rand.Rand) [][]byte { return [][]byte{in} },
			buf:    func(*rand.Rand) func() int { return fixed(1) },
		},
		{
			name:   "1-byte inner reads, caller buffer of 1 byte",
			chunks: func(in []byte, _ *rand.Rand) [][]byte { return chunksOf(in, 1) },
			buf:    func(*rand.Rand) func() int { return fixed(1) },
		},
		{
			name:   "1-byte inner reads, 2-byte buffer",
			chunks: func(in []byte, _ *rand.Rand) [][]byte { return chunksOf(in, 1) },
			buf:    func(*rand.Rand) func() int { return fixed(2) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, max := testStream(true)
			for seed := uint64(1); seed <= 10; seed++ {
				rng := rand.New(rand.NewPCG(seed, 42))
				inner := newChunkConn(tc.chunks(s.in, rng)...)
				c := NewConn(inner, max)
				res := drive(t, c, inner, tc.buf(rng), s)
				requireStream(t, s, res, fmt.Sprintf("seed %d", seed))
			}
		})
	}
}

func TestConnReadOversized(t *testing.T) {
	const max = 16
	publish := packet(0x30, filler(30, 1))
	okPing := packet(0xC0, jsonReport(max))
	cases := []struct {
		name      string
		chunks    [][]byte
		buf       int
		want      []byte // output before the error
		payloads  [][]byte
		oversized bool
		consumed  int // inner bytes read when the error is returned; -1: all
	}{
		{
			name:     "payload of exactly the limit is lifted",
			chunks:   [][]byte{publish, okPing, publish},
			buf:      2048,
			want:     concat(publish, []byte{0xC0, 0}, publish),
			payloads: [][]byte{jsonReport(max)},
			consumed: -1,
		},
		{
			name:      "payload one over the limit",
			chunks:    [][]byte{concat(publish, packet(0xC0, jsonReport(max+1)), publish)},
			buf:       2048,
			want:      concat(publish, []byte{0xC0, 0}),
			oversized: true,
			consumed:  -1,
		},
		{
			name:      "earlier reports are still lifted",
			chunks:    [][]byte{concat(okPing, publish, packet(0xC0, jsonReport(max+1)))},
			buf:       2048,
			want:      concat([]byte{0xC0, 0}, publish, []byte{0xC0, 0}),
			payloads:  [][]byte{jsonReport(max)},
			oversized: true,
			consumed:  -1,
		},
		{
			name:      "payload is not read",
			chunks:    [][]byte{concat(publish, []byte{0xC0, max + 1}), jsonReport(max + 1), publish},
			buf:       2048,
			want:      concat(publish, []byte{0xC0, 0}),
			oversized: true,
			consumed:  len(publish) + 2,
		},
		{
			name:      "largest remaining length, header only",
			chunks:    [][]byte{{0xC0, 0xFF, 0xFF, 0xFF, 0x7F}},
			buf:       2048,
			want:      []byte{0xC0, 0},
			oversized: true,
			consumed:  -1,
		},
		{
			name:      "header split across reads, 1-byte buffer",
			chunks:    [][]byte{concat(publish, []byte{0xC0}), {0x80}, {0x01}, jsonReport(128)},
			buf:       1,
			want:      concat(publish, []byte{0xC0, 0}),
			oversized: true,
			consumed:  len(publish) + 3,
		},
		{
			name:      "header split across reads, 2KiB buffer",
			chunks:    [][]byte{concat(publish, []byte{0xC0}), {0x80}, {0x01}, jsonReport(128)},
			buf:       2048,
			want:      concat(publish, []byte{0xC0, 0}),
			oversized: true,
			consumed:  len(publish) + 3,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inner := newChunkConn(tc.chunks...)
			total := 0
			for _, ch := range inner.chunks {
				total += len(ch)
			}
			c := NewConn(inner, max)
			res := drive(t, c, inner, fixed(tc.buf), nil)
			require.Equal(t, tc.want, res.out)
			require.Equal(t, tc.payloads, res.payloads)
			require.Equal(t, tc.oversized, res.oversized)
			if !tc.oversized {
				requireEOF(t, res.err)
				return
			}
			require.ErrorIs(t, res.err, ErrReportTooLarge)
			require.Contains(t, res.err.Error(), "exceeded 16 bytes")
			if tc.consumed >= 0 {
				require.Equal(t, tc.consumed, inner.consumed, "inner bytes read")
			}
			// Sticky: every later Read fails the same way, reads nothing.
			before := inner.consumed
			for range 3 {
				n, err := c.Read(make([]byte, 64))
				require.Zero(t, n)
				require.ErrorIs(t, err, ErrReportTooLarge)
			}
			require.Equal(t, before, inner.consumed)
			_, oversized := c.TakeLiftedReports()
			require.True(t, oversized, "oversized mark must stay set")
		})
	}
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// TestConnReadMalformedLength: a remaining length whose fourth byte has
// the continuation bit set loses the packet framing, so the Conn ends the
// connection with ErrMalformedLength. (It used to pass such bytes through
// untouched and stop parsing, but Mochi accepts any number of 0x80 length
// bytes before a final byte, so 80 80 80 80 00 reached it as a valid
// PINGREQ, and every later report went unlifted.) What came before the
// malformed packet is delivered; of a PINGREQ nothing is (its header is
// held back), of another packet the bytes before the fourth length byte
// may already be.
func TestConnReadMalformedLength(t *testing.T) {
	ext := packet(0xC0, jsonReport(20))
	cases := []struct {
		name     string
		in       []byte
		want     []byte // delivered before the error
		payloads [][]byte
		typ      string // packet named in the error
	}{
		{
			name: "PINGREQ with a fifth length byte",
			in:   concat([]byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x01}, ext, []byte{0xC0, 0}),
			typ:  "0xC0",
		},
		{
			name: "overlong zero length that Mochi would accept",
			in:   concat([]byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00}, ext),
			typ:  "0xC0",
		},
		{
			name: "PUBLISH with a fifth length byte",
			in:   concat([]byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}, ext),
			want: []byte{0x30, 0xFF, 0xFF, 0xFF},
			typ:  "0x30",
		},
		{
			name:     "PINGREQ after valid packets",
			in:       concat(packet(0x30, filler(50, 1)), ext, []byte{0xC0, 0xFF, 0xFF, 0xFF, 0xFF}, ext),
			want:     concat(packet(0x30, filler(50, 1)), []byte{0xC0, 0}),
			payloads: [][]byte{jsonReport(20)},
			typ:      "0xC0",
		},
		{
			name:     "SUBSCRIBE after an extended PINGREQ",
			in:       concat(ext, []byte{0x82, 0x80, 0x80, 0x80, 0x80, 0x01}, ext),
			want:     []byte{0xC0, 0, 0x82, 0x80, 0x80, 0x80},
			payloads: [][]byte{jsonReport(20)},
			typ:      "0x82",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ref := reference(tc.in, 64)
			require.True(t, ref.malformed && bytes.Equal(tc.want, ref.out), "the fuzz reference agrees")
			for _, buf := range []int{1, 2, 3, 4, 5, 2048} {
				for i := 0; i <= len(tc.in); i++ {
					inner := newChunkConn(tc.in[:i], tc.in[i:])
					c := NewConn(inner, 64)
					res := drive(t, c, inner, fixed(buf), nil)
					msg := fmt.Sprintf("buffer %d, split at %d", buf, i)
					require.ErrorIs(t, res.err, ErrMalformedLength, msg)
					require.Contains(t, res.err.Error(), "packet "+tc.typ, msg)
					require.Equal(t, tc.want, res.out, msg)
					require.Equal(t, tc.payloads, res.payloads, msg)
					require.False(t, res.oversized, msg)
					// Sticky: later Reads fail the same way and read nothing.
					before := inner.consumed
					for range 2 {
						n, err := c.Read(make([]byte, 64))
						require.Zero(t, n, msg)
						require.ErrorIs(t, err, ErrMalformedLength, msg)
					}
					require.Equal(t, before, inner.consumed, msg)
				}
			}
		})
	}

	// The error comes as soon as the bad byte is read: nothing waits for
	// more input.
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := NewConn(server, 4096)
	go func() {
		for _, w := range [][]byte{{0xC0, 0x80, 0x80}, {0x80, 0x80}} {
			if _, err := client.Write(w); err != nil {
				return
			}
		}
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	var err error
	for n := 0; err == nil; {
		n, err = c.Read(make([]byte, 1))
		require.Zero(t, n, "nothing of the PINGREQ is delivered")
	}
	require.ErrorIs(t, err, ErrMalformedLength)
}

func TestConnReadOtherTypesPassThrough(t *testing.T) {
	cases := []struct {
		name     string
		in       []byte
		want     []byte
		payloads [][]byte
	}{
		{
			name: "PINGREQ type with flags set",
			in:   concat([]byte{0xC1, 3, 0xC0, 1, 'x'}, []byte{0xCF, 0}, packet(0xC8, []byte("{}"))),
			want: concat([]byte{0xC1, 3, 0xC0, 1, 'x'}, []byte{0xCF, 0}, packet(0xC8, []byte("{}"))),
		},
		{
			name: "PINGRESP with a body",
			in:   packet(0xD0, []byte{0xC0, 1, 'x'}),
			want: packet(0xD0, []byte{0xC0, 1, 'x'}),
		},
		{
			name: "plain PINGREQ queues nothing",
			in:   []byte{0xC0, 0, 0xC0, 0},
			want: []byte{0xC0, 0, 0xC0, 0},
		},
		{
			name: "zero length in two bytes becomes a plain PINGREQ",
			in:   []byte{0xC0, 0x80, 0x00, 0xE0, 0},
			want: []byte{0xC0, 0, 0xE0, 0},
		},
		{
			name:     "extended PINGREQ with a 2-byte length",
			in:       concat([]byte{0xE0, 0}, packet(0xC0, jsonReport(200))),
			want:     []byte{0xE0, 0, 0xC0, 0},
			payloads: [][]byte{jsonReport(200)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i <= len(tc.in); i++ {
				inner := newChunkConn(tc.in[:i], tc.in[i:])
				c := NewConn(inner, 4096)
				res := drive(t, c, inner, fixed(2048), nil)
				requireEOF(t, res.err)
				require.Equal(t, tc.want, res.out, "split at %d", i)
				require.Equal(t, tc.payloads, res.payloads, "split at %d", i)
				require.Equal(t, uint64(len(tc.payloads)), c.Lifted())
			}
		})
	}
}

func TestConnReadDataWithError(t *testing.T) {
	errBroken := errors.New("connection broken")
	ext := packet(0xC0, jsonReport(30))
	publish := packet(0x30, filler(20, 1))
	cases := []struct {
		name     string
		chunks   [][]byte
		finalErr error
		buf      int
		want     []byte
	}{
		{"EOF with the last PINGREQ", [][]byte{publish, ext}, io.EOF, 2048, concat(publish, []byte{0xC0, 0})},
		{"EOF with the last PINGREQ, 1-byte buffer", [][]byte{publish, ext}, io.EOF, 1, concat(publish, []byte{0xC0, 0})},
		{"EOF with the final PINGREQ byte, 1-byte buffer", [][]byte{concat(publish, ext[:len(ext)-1]), ext[len(ext)-1:]}, io.EOF, 1, concat(publish, []byte{0xC0, 0})},
		{"error with a publish", [][]byte{ext, publish}, errBroken, 2048, concat([]byte{0xC0, 0}, publish)},
		{"error inside a PINGREQ", [][]byte{publish, ext[:10]}, errBroken, 2048, publish},
		{"error with lifted bytes only", [][]byte{publish, ext[:10]}, errBroken, 2048, publish},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inner := newChunkConn(tc.chunks...)
			inner.finalErr = tc.finalErr
			c := NewConn(inner, 4096)
			var out []byte
			buf := make([]byte, tc.buf)
			var err error
			for range 1000 {
				var n int
				n, err = c.Read(buf)
				out = append(out, buf[:n]...)
				if err != nil {
					break
				}
			}
			require.ErrorIs(t, err, tc.finalErr)
			require.Equal(t, tc.want, out)
		})
	}
}

func TestConnReadNeverReturnsEmptyForLiftedBytes(t *testing.T) {
	// 200 one-byte reads of a single report: bufio.Reader gives up after
	// 100 consecutive (0, nil) reads, so these must not surface.
	ext := packet(0xC0, jsonReport(200))
	inner := newChunkConn(chunksOf(ext, 1)...)
	c := NewConn(inner, 4096)
	n, err := c.Read(make([]byte, 2048))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, len(ext), inner.consumed)
}

func TestTakeLiftedReports(t *testing.T) {
	const pings = MaxQueuedReports + 36
	var in []byte
	var want [][]byte
	for i := range pings {
		p := []byte(fmt.Sprintf(`{"pending":%d}`, i))
		want = append(want, p)
		in = append(in, packet(0xC0, p)...)
	}
	c := NewConn(newChunkConn(in), 4096)
	buf := make([]byte, len(in))
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 2*pings, n)

	// The caller's buffer is reused; the payloads must not alias it.
	for i := range buf {
		buf[i] = 0xFF
	}
	got, oversized := c.TakeLiftedReports()
	require.False(t, oversized)
	require.Equal(t, want[pings-MaxQueuedReports:], got, "newest reports kept in order")
	require.Equal(t, uint64(pings), c.Lifted())
	require.Equal(t, uint64(pings-MaxQueuedReports), c.Dropped())

	again, _ := c.TakeLiftedReports()
	require.Empty(t, again, "take clears the queue")

	// Payload slices must not share backing arrays.
	for i := range got {
		for j := range got[i] {
			got[i][j] = 0
		}
	}
	require.Equal(t, []byte(fmt.Sprintf(`{"pending":%d}`, pings-1)), want[pings-1])
	require.Equal(t, want[pings-MaxQueuedReports+1], []byte(fmt.Sprintf(`{"pending":%d}`, pings-MaxQueuedReports+1)))
}

func TestTakeLiftedReportsConcurrent(t *testing.T) {
	s, max := testStream(true)
	var in []byte
	for range 20 {
		in = append(in, s.in...)
	}
	inner := newChunkConn(chunksOf(in, 777)...)
	c := NewConn(inner, max)

	done := make(chan struct{})
	taken := make(chan [][]byte, 1)
	go func() {
		var all [][]byte
		for {
			select {
			case <-done:
				p, _ := c.TakeLiftedReports()
				taken <- append(all, p...)
				return
			default:
				p, _ := c.TakeLiftedReports()
				all = append(all, p...)
				_ = c.Lifted()
			}
		}
	}()
	var out []byte
	buf := make([]byte, 2048)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			requireEOF(t, err)
			break
		}
	}
	close(done)
	all := <-taken
	var want [][]byte
	for range 20 {
		want = append(want, s.payloads...)
	}
	require.True(t, bytes.Equal(bytes.Repeat(s.want, 20), out), "output differs")
	// A starved taker may let the queue overflow; what was taken must be
	// the reports in order, minus the dropped ones.
	require.Equal(t, uint64(len(want)), c.Lifted())
	require.Equal(t, len(want), len(all)+int(c.Dropped()), "taken + dropped")
	i := 0
	for _, p := range all {
		for i < len(want) && !bytes.Equal(want[i], p) {
			i++
		}
		require.Less(t, i, len(want), "taken reports out of order")
		i++
	}
}

func TestConnOverPipe(t *testing.T) {
	client, server := net.Pipe()
	c := NewConn(server, 4096)
	t.Cleanup(func() { _ = c.Close() })
	require.Equal(t, server, c.NetConn())
	require.Equal(t, server.LocalAddr(), c.LocalAddr())

	s, _ := testStream(true)
	go func() {
		// net.Pipe is unbuffered: every Write is read in pieces.
		for _, ch := range chunksOf(s.in, 333) {
			if _, err := client.Write(ch); err != nil {
				return
			}
		}
	}()
	out := make([]byte, len(s.want))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.ReadFull(c, out)
	require.NoError(t, err)
	require.Equal(t, s.want, out)
	got, _ := c.TakeLiftedReports()
	require.Equal(t, s.payloads, got)

	// Deadlines pass through to the inner conn.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = c.Read(make([]byte, 10))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// Close passes through too.
	require.NoError(t, c.Close())
	_, err = client.Write([]byte{0xC0, 0})
	require.ErrorIs(t, err, io.ErrClosedPipe)
}

func TestNewConnDefaultLimit(t *testing.T) {
	for _, max := range []int{0, -1} {
		in := concat(packet(0xC0, jsonReport(DefaultMaxPayload)), packet(0xC0, jsonReport(DefaultMaxPayload+1)))
		c := NewConn(newChunkConn(in), max)
		res := drive(t, c, nil, fixed(2048), nil)
		require.Equal(t, [][]byte{jsonReport(DefaultMaxPayload)}, res.payloads)
		require.True(t, res.oversized)
		require.ErrorIs(t, res.err, ErrReportTooLarge)
		require.Contains(t, res.err.Error(), fmt.Sprintf("exceeded %d bytes", DefaultMaxPayload))
	}
}

func TestConnReadDoesNotBlockWithOutput(t *testing.T) {
	cases := []struct {
		name   string
		writes [][]byte
		buf    int
		want   []byte
	}{
		{"plain PINGREQ split, 1-byte buffer", [][]byte{{0xC0}, {0x00}}, 1, []byte{0xC0, 0}},
		{"extended PINGREQ split, 1-byte buffer", [][]byte{{0xC0, 2, '{'}, {'}'}}, 1, []byte{0xC0, 0}},
		{"extended PINGREQ, 2KiB buffer", [][]byte{packet(0xC0, jsonReport(100))}, 2048, []byte{0xC0, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client, server := net.Pipe()
			t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
			c := NewConn(server, 4096)
			go func() {
				for _, w := range tc.writes {
					if _, err := client.Write(w); err != nil {
						return
					}
				}
			}()
			// Nothing follows the writes: a Read that waits for more input
			// instead of returning what it holds hits the deadline.
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			out := make([]byte, len(tc.want))
			buf := make([]byte, tc.buf)
			for got := 0; got < len(tc.want); {
				n, err := c.Read(buf)
				require.NoError(t, err)
				got += copy(out[got:], buf[:n])
			}
			require.Equal(t, tc.want, out)
		})
	}
}

// TestConnUnderBufio reads packets the way Mochi does (bufio.Reader of
// 2 KiB, ReadByte, DecodeLength, io.ReadFull) from a conn that delivers a
// byte per read, so lifting a 4 KiB report takes thousands of inner reads.
func TestConnUnderBufio(t *testing.T) {
	s, max := testStream(true)
	inner := newChunkConn(chunksOf(s.in, 1)...)
	c := NewConn(inner, max)
	br := bufio.NewReaderSize(c, 2048)
	var out []byte
	var lifted [][]byte
	for {
		b, err := br.ReadByte()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		n, _, err := packets.DecodeLength(br)
		require.NoError(t, err)
		body := make([]byte, n)
		_, err = io.ReadFull(br, body)
		require.NoError(t, err)
		if b == pingreqByte {
			require.Empty(t, body, "Mochi must see plain PINGREQs")
			p, _ := c.TakeLiftedReports()
			lifted = append(lifted, p...)
		}
		out = append(out, b)
		out = append(out, varint(n)...)
		out = append(out, body...)
	}
	require.Equal(t, s.want, out)
	require.Equal(t, s.payloads, lifted)
}
