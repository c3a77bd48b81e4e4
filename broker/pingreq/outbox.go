package pingreq

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// A client that stops reading its socket must stall nobody else. Mochi
// 2.7.9 writes to a client while holding that client's lock, and every
// publisher that delivers a QoS≥1 message to the client needs the same lock
// for a packet ID; with the socket full, the write blocks forever (no write
// deadline) and so do they. A Conn therefore never blocks its caller: Write
// appends the bytes to the connection's outbox and a writer goroutine of
// its own sends them. The outbox is bounded, and a write that makes no
// progress for the write timeout ends the connection.
//
// The writer runs only while bytes wait: Write starts it when the outbox
// was empty and it ends once it has sent everything, so an idle connection
// (most of a device fleet) costs no goroutine of LuffyMQ's.

// DefaultWriteTimeout is how long the writer may go without sending a byte
// to a client before the connection is closed, when WriteLimits.Timeout is
// zero.
const DefaultWriteTimeout = 30 * time.Second

// DefaultMaxQueuedBytes is the outbox size, when WriteLimits.MaxQueuedBytes
// is zero, above which QoS 0 publishes to the client are dropped.
const DefaultMaxQueuedBytes = 8 << 20

// closeFlushTimeout bounds how long Close lets the writer send what is
// queued (a DISCONNECT or an error CONNACK, typically) before the socket
// is closed.
const closeFlushTimeout = time.Second

// shrinkAbove is the outbox capacity above which an emptied buffer is let
// go rather than kept for reuse, so one burst does not pin its memory.
const shrinkAbove = 1 << 20

// idleBuffer is the largest buffer (of two) a connection keeps while
// nothing waits to be sent to it.
const idleBuffer = 4 << 10

// ErrWriteTimeout ends a connection whose socket accepted no byte for the
// write timeout.
var ErrWriteTimeout = errors.New("pingreq: client did not read for the write timeout")

// ErrOutboxFull ends a connection when packets other than QoS 0 publishes
// would grow its outbox past twice the limit.
var ErrOutboxFull = errors.New("pingreq: client's outbox is full")

// WriteLimits bounds what a Conn queues for a client that reads slowly or
// not at all.
type WriteLimits struct {
	// Timeout: a client that accepts no byte for this long is
	// disconnected (DefaultWriteTimeout when zero; negative disables).
	Timeout time.Duration
	// MaxQueuedBytes: above this many queued bytes, QoS 0 publishes to the
	// client are dropped and counted; above twice this, any other packet
	// ends the connection, whose session keeps its QoS≥1 messages for a
	// later connection (DefaultMaxQueuedBytes when zero).
	MaxQueuedBytes int
	// Totals, if set, also counts the connection's drops and failures,
	// summed with other connections' (a broker's metrics).
	Totals *OutboxTotals
}

// OutboxTotals sums what the outboxes of many connections dropped and how
// many connections they ended. Safe for concurrent use.
type OutboxTotals struct {
	// DroppedQoS0 counts QoS 0 publishes dropped for a full outbox.
	DroppedQoS0 atomic.Uint64
	// WriteTimeouts counts connections ended by the write timeout.
	WriteTimeouts atomic.Uint64
	// OutboxFull counts connections ended by a full outbox.
	OutboxFull atomic.Uint64
}

func (l WriteLimits) withDefaults() WriteLimits {
	if l.Timeout == 0 {
		l.Timeout = DefaultWriteTimeout
	}
	if l.MaxQueuedBytes <= 0 {
		l.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	return l
}

// WriteStats counts what a Conn's outbox did.
type WriteStats struct {
	QueuedBytes  int    // bytes waiting to be sent now
	DroppedQoS0  uint64 // QoS 0 publishes dropped because the outbox was full
	WriteTimeout bool   // the connection was ended by the write timeout
	// DroppedWriteQueue counts publishes the broker dropped before they
	// reached this connection, because the client's write queue was full
	// (Mochi's outbound channel; see CountWriteQueueDrop).
	DroppedWriteQueue uint64
}

// outbox holds the bytes written to a Conn until its writer goroutine has
// sent them. Lock order: sendQuota.mu, then outbox.mu.
type outbox struct {
	mu      sync.Mutex
	limits  WriteLimits
	pending []byte // bytes not yet taken by the writer
	spare   []byte // the buffer the writer last sent, reused
	writing int    // bytes the writer took and has not finished sending
	running bool   // a writer goroutine runs; false only while nothing waits
	closing bool   // Close was called: flush, then close the socket
	err     error  // sticky: the connection failed

	droppedQoS0  atomic.Uint64
	writeTimeout atomic.Bool

	droppedWriteQueue atomic.Uint64

	// progress is when (Unix nanoseconds) the writer last took a batch
	// or the socket last accepted bytes (see Draining).
	progress atomic.Int64
}

// writeChunk is the most bytes the writer hands the socket in one Write,
// so that a slow client's progress is seen at least every writeChunk
// bytes rather than once per batch (see Draining).
const writeChunk = 64 << 10

// SetWriteLimits sets the connection's outbox limits; call it before the
// first Write.
func (c *Conn) SetWriteLimits(l WriteLimits) {
	o := &c.out
	o.mu.Lock()
	defer o.mu.Unlock()
	o.limits = l.withDefaults()
}

// WriteStats returns the connection's outbox counters.
func (c *Conn) WriteStats() WriteStats {
	o := &c.out
	o.mu.Lock()
	queued := len(o.pending) + o.writing
	o.mu.Unlock()
	return WriteStats{
		QueuedBytes:  queued,
		DroppedQoS0:  o.droppedQoS0.Load(),
		WriteTimeout: o.writeTimeout.Load(),

		DroppedWriteQueue: o.droppedWriteQueue.Load(),
	}
}

// Draining reports whether the client takes what the broker sends it:
// the writer is not in a socket write (nothing waits for the socket, or
// the writer is about to take what waits), or the socket accepted bytes
// (or the writer started on a new batch) within the last stallAfter; and
// the outbox is within MaxQueuedBytes (above it the client's QoS 0
// publishes are dropped whatever happens before). It is false once the
// connection failed or is closing. A publisher may wait for a client
// that drains (see hooks.PacingHook), never for one that does not.
func (c *Conn) Draining(stallAfter time.Duration) bool {
	o := &c.out
	o.mu.Lock()
	queued := len(o.pending) + o.writing
	inWrite := o.writing > 0
	ended := o.err != nil || o.closing
	limit := o.limits.MaxQueuedBytes
	o.mu.Unlock()
	switch {
	case ended || queued > limit:
		return false
	case !inWrite:
		return true
	}
	return time.Since(time.Unix(0, o.progress.Load())) < stallAfter
}

// CountWriteQueueDrop records that a publish for this client was dropped
// before it reached the connection (the broker's write queue for the
// client was full), so WriteStats tells every loss of the client's, by
// reason.
func (c *Conn) CountWriteQueueDrop() { c.out.droppedWriteQueue.Add(1) }

// enqueueOut appends p to the outbox, starting the writer if needed. qos0
// marks p as one QoS 0 PUBLISH, which is dropped (and counted) rather than
// queued when the outbox is over its limit. It never blocks on the socket.
func (c *Conn) enqueueOut(p []byte, qos0 bool) error {
	if len(p) == 0 {
		return nil
	}
	o := &c.out
	o.mu.Lock()
	if o.err != nil {
		o.mu.Unlock()
		return o.err
	}
	if o.closing {
		o.mu.Unlock()
		return net.ErrClosed
	}
	queued := len(o.pending) + o.writing
	switch {
	case qos0 && queued+len(p) > o.limits.MaxQueuedBytes:
		totals := o.limits.Totals
		o.mu.Unlock()
		o.droppedQoS0.Add(1)
		if totals != nil {
			totals.DroppedQoS0.Add(1)
		}
		return nil
	case queued+len(p) > 2*o.limits.MaxQueuedBytes:
		o.err = fmt.Errorf("%w: %d bytes queued, limit %d", ErrOutboxFull, queued, 2*o.limits.MaxQueuedBytes)
		err := o.err
		totals := o.limits.Totals
		o.mu.Unlock()
		if totals != nil {
			totals.OutboxFull.Add(1)
		}
		_ = c.Conn.Close()
		return err
	}
	o.pending = appendOut(o.pending, p)
	if !o.running {
		o.running = true
		go c.runWriter()
	}
	o.mu.Unlock()
	return nil
}

// runWriter sends the outbox to the socket until it is empty and then
// ends. Once the connection failed, or was closed and everything queued
// went out, it closes the socket.
func (c *Conn) runWriter() {
	o := &c.out
	o.mu.Lock()
	for {
		if o.err != nil || (o.closing && len(o.pending) == 0) {
			o.running = false
			o.mu.Unlock()
			_ = c.Conn.Close()
			return
		}
		if len(o.pending) == 0 {
			// Idle: keep the two buffers if they are small (the one the
			// next write appends to, and the one writes append to while
			// the writer sends the first), so that a connection given a
			// few messages at a time does not allocate for each burst;
			// let large ones go, so one burst does not pin its memory
			// (to the pools the next burst takes them from; bufpool.go).
			o.running = false
			if cap(o.pending) > idleBuffer {
				putBuffer(o.pending)
				o.pending = nil
			}
			if cap(o.spare) > idleBuffer {
				putBuffer(o.spare)
				o.spare = nil
			}
			if cap(o.pending) == 0 {
				o.pending, o.spare = o.spare, nil
			}
			o.mu.Unlock()
			return
		}
		batch := o.pending
		o.pending, o.spare = o.spare[:0], nil
		o.writing = len(batch)
		now := time.Now()
		o.progress.Store(now.UnixNano())
		o.mu.Unlock()

		err := c.send(batch, now)

		o.mu.Lock()
		o.writing = 0
		if cap(batch) <= shrinkAbove {
			o.spare = batch[:0]
		}
		if err != nil && o.err == nil {
			o.err = err
		}
	}
}

// send writes batch, taken at now, to the socket, renewing the write
// deadline while bytes go out: only a client that accepts nothing for the
// whole timeout fails.
//
// The clock is read once for a batch that goes out in one write (most
// do): the first deadline counts from when the batch was taken, and a
// write that sends the rest of the batch records no progress, since the
// writer is done with it (Draining looks at progress only while a batch
// is being sent, and the writer stores it again for the next one).
func (c *Conn) send(batch []byte, now time.Time) error {
	o := &c.out
	for len(batch) > 0 {
		o.mu.Lock()
		timeout := o.limits.Timeout
		if o.closing {
			timeout = closeFlushTimeout
		}
		var deadline time.Time
		if timeout > 0 {
			deadline = now.Add(timeout)
		}
		_ = c.Conn.SetWriteDeadline(deadline)
		o.mu.Unlock()

		n, err := c.Conn.Write(batch[:min(len(batch), writeChunk)])
		batch = batch[n:]
		if len(batch) > 0 {
			now = time.Now() // the next write's deadline counts from here
			if n > 0 {
				o.progress.Store(now.UnixNano())
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if n > 0 {
				continue // slow, not stuck
			}
			o.writeTimeout.Store(true)
			o.mu.Lock()
			totals := o.limits.Totals
			o.mu.Unlock()
			if totals != nil {
				totals.WriteTimeouts.Add(1)
			}
			return fmt.Errorf("%w (%v)", ErrWriteTimeout, timeout)
		}
		return err
	}
	return nil
}

// Close lets the writer send what is queued (for at most a second) and
// then closes the socket; it does not wait for that.
func (c *Conn) Close() error {
	o := &c.out
	o.mu.Lock()
	if o.closing {
		o.mu.Unlock()
		return nil
	}
	o.closing = true
	if !o.running {
		// Nothing waits to be sent, or the connection failed.
		o.mu.Unlock()
		return c.Conn.Close()
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	o.mu.Unlock()
	return nil
}

// SetDeadline sets the read deadline only: Mochi refreshes both with the
// keep-alive, but writes are the writer goroutine's, bounded by the write
// timeout.
func (c *Conn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }

// SetWriteDeadline is ignored for the same reason: the writer goroutine
// owns the socket's write deadline.
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }
