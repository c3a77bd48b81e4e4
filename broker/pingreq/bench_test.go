package pingreq

import (
	"io"
	"net"
	"testing"
)

// loopConn is an endless in-memory net.Conn that serves data over and over.
type loopConn struct {
	net.Conn
	data   []byte
	off    int
	passes int // completed passes over data
}

func (l *loopConn) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off += n
	if l.off == len(l.data) {
		l.off = 0
		l.passes++
	}
	return n, nil
}

// benchStream returns 1000 PUBLISH packets of 100 bytes each, followed by
// an extended PINGREQ if withPing.
func benchStream(withPing bool) []byte {
	pub := packet(0x30, filler(98, 1)) // 1 + 1 + 98 = 100 bytes
	var s []byte
	for range 1000 {
		s = append(s, pub...)
	}
	if withPing {
		s = append(s, packet(0xC0, []byte(`{"pending":12,"processing_time_ms":35,"workers":8,"in_progress":3}`))...)
	}
	return s
}

// BenchmarkConnRead reads the stream through a 2 KiB buffer, as Mochi's
// bufio.Reader does; one op is one pass over the stream (1000 PUBLISHes
// and, for "pingreq-every-1000", one extended PINGREQ). "raw" reads the
// same stream without the Conn.
func BenchmarkConnRead(b *testing.B) {
	cases := []struct {
		name     string
		withPing bool
		wrap     bool
	}{
		{"raw", true, false},
		{"passthrough", false, true},
		{"pingreq-every-1000", true, true},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			data := benchStream(bc.withPing)
			inner := &loopConn{data: data}
			var r io.Reader = inner
			var c *Conn
			if bc.wrap {
				c = NewConn(inner, DefaultMaxPayload)
				r = c
			}
			buf := make([]byte, 2048)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for end := inner.passes + 1; inner.passes < end; {
					if _, err := r.Read(buf); err != nil {
						b.Fatal(err)
					}
				}
				if c != nil {
					c.TakeLiftedReports() // as the hook does on each PINGREQ
				}
			}
			b.StopTimer()
			if c != nil && bc.withPing && c.Lifted() != uint64(b.N) {
				b.Fatalf("lifted %d reports in %d passes", c.Lifted(), b.N)
			}
		})
	}
}
