package bridge

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// outMsg is a message waiting to be published and confirmed.
type outMsg struct {
	exchange string
	key      string
	pub      amqp.Publishing
	attempts int
	label    string // counted under this name instead of exchange
	// wakesWork is set on publishes to the site's own work queue: once
	// RabbitMQ has it, the consume loops look at once instead of at their
	// next poll.
	wakesWork bool
}

// outbox is a bounded FIFO of messages to publish. When full, the oldest
// message is dropped. Messages that were not confirmed go back to the front.
type outbox struct {
	mu      sync.Mutex
	items   []*outMsg
	head    int
	max     int
	notify  chan struct{}
	dropped uint64
}

func newOutbox(max int) *outbox {
	return &outbox{max: max, notify: make(chan struct{}, 1)}
}

func (o *outbox) signal() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// push appends m; it reports false when the oldest message was dropped to
// make room.
func (o *outbox) push(m *outMsg) bool {
	o.mu.Lock()
	ok := true
	if len(o.items)-o.head >= o.max {
		o.items[o.head] = nil
		o.head++
		o.dropped++
		ok = false
	}
	o.items = append(o.items, m)
	o.mu.Unlock()
	o.signal()
	return ok
}

// requeue puts ms back at the front, in order, dropping the oldest beyond
// the bound.
func (o *outbox) requeue(ms []*outMsg) {
	if len(ms) == 0 {
		return
	}
	o.mu.Lock()
	rest := o.items[o.head:]
	items := make([]*outMsg, 0, len(ms)+len(rest))
	items = append(items, ms...)
	items = append(items, rest...)
	if over := len(items) - o.max; over > 0 {
		items = items[over:]
		o.dropped += uint64(over)
	}
	o.items, o.head = items, 0
	o.mu.Unlock()
	o.signal()
}

// take waits until at least one message is queued and removes up to max.
func (o *outbox) take(ctx context.Context, max int) ([]*outMsg, error) {
	for {
		o.mu.Lock()
		if n := len(o.items) - o.head; n > 0 {
			n = min(n, max)
			batch := make([]*outMsg, n)
			copy(batch, o.items[o.head:o.head+n])
			clear(o.items[o.head : o.head+n])
			o.head += n
			if o.head == len(o.items) {
				o.items, o.head = o.items[:0], 0
			} else if o.head > 1024 && o.head > len(o.items)/2 {
				o.items = append([]*outMsg(nil), o.items[o.head:]...)
				o.head = 0
			}
			o.mu.Unlock()
			return batch, nil
		}
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-o.notify:
		}
	}
}

// len returns the number of queued messages.
func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.items) - o.head
}

// droppedCount returns how many messages were dropped for lack of room.
func (o *outbox) droppedCount() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped
}

// dedup remembers the last n message IDs.
type dedup struct {
	mu   sync.Mutex
	ring []string
	next int
	set  map[string]struct{}
}

func newDedup(n int) *dedup {
	return &dedup{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

// contains reports whether id was recorded, without recording it.
func (d *dedup) contains(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.set[id]
	return ok
}

// seen records id and reports whether it was already recorded. Empty IDs
// are never duplicates.
func (d *dedup) seen(id string) bool {
	if id == "" {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.set[id]; ok {
		return true
	}
	if old := d.ring[d.next]; old != "" {
		delete(d.set, old)
	}
	d.ring[d.next] = id
	d.set[id] = struct{}{}
	d.next = (d.next + 1) % len(d.ring)
	return false
}
