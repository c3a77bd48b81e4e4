package pingreq

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/stretchr/testify/require"
)

// heldLimits holds packets over 64 KiB, as the broker does, with Mochi's
// default 1 MiB packet limit.
var heldLimits = ReadLimits{BufferAbove: DefaultBufferAbove, MaxPacketSize: 1 << 20}

// readAll reads c until it fails, with caller buffers of bufSize() bytes,
// and calls check after every Read with the output so far.
func readAll(t testing.TB, c *Conn, bufSize func() int, check func(out []byte)) ([]byte, error) {
	t.Helper()
	var out []byte
	for range 1 << 22 {
		buf := make([]byte, bufSize())
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if check != nil {
			check(out)
		}
		if err != nil {
			return out, err
		}
	}
	t.Fatal("Read never failed")
	return nil, nil
}

func TestLargePacketIsHeldUntilComplete(t *testing.T) {
	small := packet(0x30, filler(300, 1))
	big := packet(0x32, filler(200_000, 2)) // QoS 1 PUBLISH of 200 kB
	// A large packet whose length spans two reads takes the slow path.
	in := concat(small, big, packet(0xC0, []byte(`{"msgsInQueue":1}`)), small, big, small)
	bigStart := [2]int{len(small), 2*len(small) + len(big) + len(packet(0xC0, []byte(`{"msgsInQueue":1}`)))}
	want := bytes.Replace(in, packet(0xC0, []byte(`{"msgsInQueue":1}`)), []byte{0xC0, 0}, 1)
	wantBigStart := [2]int{bigStart[0], bigStart[1] - len(in) + len(want)}

	for _, chunk := range []int{1, 2, 7, 1000, 4096, 70_000, len(in)} {
		for _, bufSize := range []int{1, 3, 2048, 1 << 20} {
			inner := newChunkConn(chunksOf(bytes.Clone(in), chunk)...)
			c := NewConn(inner, DefaultMaxPayload)
			require.NoError(t, c.SetReadLimits(heldLimits))
			out, err := readAll(t, c, fixed(bufSize), func(out []byte) {
				for i := range bigStart {
					// Nothing of a large packet is delivered before its
					// last byte has been read.
					if len(out) > wantBigStart[i] && inner.consumed < bigStart[i]+len(big) {
						t.Fatalf("chunk %d buf %d: %d bytes out with only %d of %d in", chunk, bufSize,
							len(out), inner.consumed, bigStart[i]+len(big))
					}
				}
			})
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, want, out, "chunk %d buf %d", chunk, bufSize)
			p, _ := c.TakeLiftedReports()
			require.Equal(t, [][]byte{[]byte(`{"msgsInQueue":1}`)}, p)
		}
	}
}

func TestHeldPacketBufferGrowsOnlyWithArrivedBytes(t *testing.T) {
	errStalled := errors.New("client stalled")
	for _, split := range []bool{false, true} {
		// A PUBLISH declaring about 1 MB of which 14 bytes come.
		header := append([]byte{0x30}, varint(1_000_000)...)
		var chunks [][]byte
		if split {
			chunks = [][]byte{header[:2], header[2:], filler(14, 3)}
		} else {
			chunks = [][]byte{concat(header, filler(14, 3))}
		}
		inner := newChunkConn(chunks...)
		inner.finalErr = errStalled
		c := NewConn(inner, DefaultMaxPayload)
		require.NoError(t, c.SetReadLimits(heldLimits))
		out, err := readAll(t, c, fixed(2048), nil)
		require.ErrorIs(t, err, errStalled)
		require.Empty(t, out, "the reader sees nothing of the packet, not even its header")
		require.Len(t, c.held.buf, len(header)+14)
		require.LessOrEqual(t, cap(c.held.buf), heldInitialCap, "split %v", split)
	}
}

func TestPacketsNotHeld(t *testing.T) {
	cases := []struct {
		name   string
		limits ReadLimits
		in     []byte
	}{
		// Over the packet limit: the reader must see the header at once to
		// refuse it without reading the body.
		{"over the packet limit", heldLimits, concat([]byte{0x30}, varint(2<<20), filler(100, 1))},
		{"over the packet limit, split header", heldLimits, concat([]byte{0x30}, varint(2<<20), filler(100, 1))},
		{"at the threshold", heldLimits, packet(0x30, filler(DefaultBufferAbove, 1))},
		{"holding disabled", ReadLimits{}, concat([]byte{0x30}, varint(1_000_000), filler(100, 1))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chunks := [][]byte{tc.in}
			if tc.name == "over the packet limit, split header" {
				chunks = [][]byte{tc.in[:2], tc.in[2:]}
			}
			c := NewConn(newChunkConn(chunks...), DefaultMaxPayload)
			require.NoError(t, c.SetReadLimits(tc.limits))
			out, err := readAll(t, c, fixed(4096), nil)
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, tc.in, out)
		})
	}
}

func TestHeldHeaderOfSmallPacketDoesNotBlock(t *testing.T) {
	// A small packet whose length arrives in two writes: once its length
	// is known its header must come out without waiting for more input.
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := NewConn(server, DefaultMaxPayload)
	require.NoError(t, c.SetReadLimits(heldLimits))
	go func() {
		for _, w := range [][]byte{{0x30, 0x80}, {0x01}} { // remaining length 128
			if _, err := client.Write(w); err != nil {
				return
			}
		}
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	var out []byte
	buf := make([]byte, 1)
	for len(out) < 3 {
		n, err := c.Read(buf)
		require.NoError(t, err)
		out = append(out, buf[:n]...)
	}
	require.Equal(t, []byte{0x30, 0x80, 0x01}, out)
}

// wholePackets reports whether in is a concatenation of complete packets
// with valid remaining lengths.
func wholePackets(in []byte) bool {
	for len(in) > 0 {
		v, k, err := report.DecodeVarint(in[1:])
		if err != nil || 1+k+v > len(in) {
			return false
		}
		in = in[1+k+v:]
	}
	return true
}

// FuzzHeldPacketsMatchPassthrough checks holding against the Conn without
// it: holding only delays output, so its output is a prefix of the plain
// one, equal to it for a stream of whole packets, and ends the same way,
// having lifted the same reports.
func FuzzHeldPacketsMatchPassthrough(f *testing.F) {
	f.Add(concat(packet(0x30, filler(40, 1)), packet(0xC0, []byte("{}")), packet(0x32, filler(3, 2))), uint64(0x5))
	f.Add(concat([]byte{0x30, 0x80}, []byte{0x01}, filler(128, 1), packet(0x82, filler(20, 4))), uint64(0x123))
	f.Add(concat([]byte{0x30, 0x40}, filler(20, 1)), uint64(0x77))
	f.Add([]byte{0x30, 0x80, 0x80, 0x80, 0x80, 0x01, 0x30, 0x00}, uint64(0x9))
	f.Add(concat(packet(0x30, filler(300, 1)), packet(0xC0, jsonReport(40))), uint64(0x4242))

	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, uint64(len(in))))
		limits := ReadLimits{BufferAbove: 1 + int(seed%64), MaxPacketSize: [...]int{0, 80, 300}[seed>>6%3]}
		const maxReport = 30

		data := bytes.Clone(in)
		var buf []byte
		plain := NewConn(newChunkConn(data), maxReport)
		want, wantErr := fuzzReadAll(t, plain, &buf, fixed(len(in)+16))

		maxChunk := 1 + int(seed>>8%64)
		chunks := make([][]byte, 0, 2*len(data)/(maxChunk+1)+4)
		for rest := data; len(rest) > 0; {
			n := min(1+rng.IntN(maxChunk), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		held := NewConn(&chunkConn{chunks: chunks}, maxReport)
		if err := held.SetReadLimits(limits); err != nil {
			t.Fatal(err)
		}
		maxBuf := 1 + int(seed>>16%40)
		got, gotErr := fuzzReadAll(t, held, &buf, func() int { return 1 + rng.IntN(maxBuf) })

		if !bytes.HasPrefix(want, got) {
			t.Fatalf("held output is not a prefix of the plain one\n got %x\nwant %x", got, want)
		}
		if wholePackets(in) && !bytes.Equal(got, want) {
			t.Fatalf("whole packets: held output\n got %x\nwant %x", got, want)
		}
		if gotErr.Error() != wantErr.Error() {
			t.Fatalf("held error %v, plain error %v", gotErr, wantErr)
		}
		p1, o1 := plain.TakeLiftedReports()
		p2, o2 := held.TakeLiftedReports()
		if len(p1) != len(p2) || o1 != o2 {
			t.Fatalf("lifted %d (oversized %v), plain %d (oversized %v)", len(p2), o2, len(p1), o1)
		}
		for i := range p1 {
			if !bytes.Equal(p1[i], p2[i]) {
				t.Fatalf("lifted report %d: %q, plain %q", i, p2[i], p1[i])
			}
		}
	})
}

// fuzzReadAll is readAll for the fuzz target: the caller's buffer *buf is
// reused from Read to Read (and from call to call), so an iteration
// allocates little beyond what the Conn does.
func fuzzReadAll(t testing.TB, c *Conn, buf *[]byte, bufSize func() int) ([]byte, error) {
	t.Helper()
	var out []byte
	for range 1 << 22 {
		size := bufSize()
		if size > len(*buf) {
			*buf = make([]byte, max(size, 2*len(*buf)))
		}
		n, err := c.Read((*buf)[:size])
		out = append(out, (*buf)[:n]...)
		if err != nil {
			return out, err
		}
	}
	t.Fatal("Read never failed")
	return nil, nil
}

// BenchmarkConnReadWithReadLimits is BenchmarkConnRead's passthrough case
// with the broker's read limits: small packets must keep the zero-copy,
// allocation-free path.
func BenchmarkConnReadWithReadLimits(b *testing.B) {
	data := benchStream(false)
	inner := &loopConn{data: data}
	c := NewConn(inner, DefaultMaxPayload)
	if err := c.SetReadLimits(heldLimits); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 2048)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		for end := inner.passes + 1; inner.passes < end; {
			if _, err := c.Read(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func TestConnectTimeoutClosesIdleConnection(t *testing.T) {
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := NewConn(server, DefaultMaxPayload)
	start := time.Now()
	require.NoError(t, c.SetReadLimits(ReadLimits{ConnectTimeout: 150 * time.Millisecond}))
	go func() { _, _ = client.Write([]byte{0x10, 0x10, 0x00}) }() // a CONNECT that stops after 1 of 16 body bytes
	_, err := readAll(t, c, fixed(2048), nil)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.True(t, c.ConnectTimedOut())
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestConnectTimeoutIsLiftedWhenConnectIsComplete(t *testing.T) {
	connect := packet(0x10, []byte{0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 0, 0, 0, 2, 'c', '1'}) // keep-alive 0
	timeout := 200 * time.Millisecond
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := NewConn(server, DefaultMaxPayload)
	require.NoError(t, c.SetReadLimits(ReadLimits{ConnectTimeout: timeout}))

	reads := make(chan []byte, 16)
	readErr := make(chan error, 1)
	go func() {
		for {
			buf := make([]byte, 2048)
			n, err := c.Read(buf)
			if n > 0 {
				reads <- buf[:n]
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	// The CONNECT in three pieces, all within the timeout.
	for _, piece := range [][]byte{connect[:1], connect[1:6], connect[6:]} {
		_, err := client.Write(piece)
		require.NoError(t, err)
		time.Sleep(timeout / 5)
	}
	var got []byte
	for len(got) < len(connect) {
		select {
		case b := <-reads:
			got = append(got, b...)
		case err := <-readErr:
			t.Fatalf("read failed after %d CONNECT bytes: %v", len(got), err)
		}
	}
	require.Equal(t, connect, got)

	// Idle for three timeouts after the CONNECT: no deadline cuts it.
	select {
	case err := <-readErr:
		t.Fatalf("connection cut after its CONNECT: %v", err)
	case <-time.After(3 * timeout):
	}
	_, err := client.Write([]byte{0xC0, 0x00})
	require.NoError(t, err)
	require.Equal(t, []byte{0xC0, 0x00}, <-reads)
	require.False(t, c.ConnectTimedOut())

	// A deadline the reader sets itself (Mochi's keep-alive) still works
	// and is no connect timeout.
	require.NoError(t, c.SetDeadline(time.Now().Add(50*time.Millisecond)))
	select {
	case err := <-readErr:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("the reader's own deadline did not fire")
	}
	require.False(t, c.ConnectTimedOut())
}

func TestConnectTimeoutStaysForOtherFirstPackets(t *testing.T) {
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := NewConn(server, DefaultMaxPayload)
	require.NoError(t, c.SetReadLimits(ReadLimits{ConnectTimeout: 150 * time.Millisecond}))
	go func() { _, _ = client.Write([]byte{0xC0, 0x00}) }() // a PINGREQ first
	out, err := readAll(t, c, fixed(2048), nil)
	require.Equal(t, []byte{0xC0, 0x00}, out)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.True(t, c.ConnectTimedOut())
}
