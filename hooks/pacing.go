package hooks

import (
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Publisher pacing.
//
// Mochi hands every delivery to the receiving client's write queue, a
// channel of Capabilities.MaximumClientWritesPending packets (Mochi's
// default 8192; the broker sizes it from the outbox) that the client's
// write loop drains, and drops the delivery when that queue is full. The queue is filled by the publishers' read
// goroutines and nothing slows them: on two cores four publishers
// bursting QoS 0 messages fill the queues of subscribers that keep up on
// average, and a quarter of the burst is dropped (Mosquitto's single loop
// paces its publishers by itself and drops nothing).
//
// PacingHook makes a publisher wait, before it hands a delivery to a
// client whose queue is above a high-water mark, until the queue is below
// the mark again, for at most MaxWait per delivery, as long as the client
// drains: its connection says it takes what the broker sends (see
// WriteDrainer). The publisher's read goroutine waiting stops it reading
// its socket, so TCP slows the publisher itself. A client that does not
// drain (its socket accepted nothing for StallAfter) never makes anyone
// wait: it loses its own messages, counted as before.
//
// Where it waits. Mochi's only call into the hooks between choosing a
// recipient and queueing the delivery is the ACL check for the recipient
// (OnACLCheck with write false, in Server.publishToClient, on the
// publisher's goroutine, with no lock held). PacingHook provides
// OnACLCheck, always answers false (it never allows anything, so the
// other hooks' answer stands: Mochi allows what any hook allows) and must
// be added before the hook that answers ACL checks, since Mochi stops at
// the first hook that allows. (OnSelectSubscribers, where the broker
// picks recipients, runs only for topics with shared subscriptions.)
//
// The signal. The queue's length is read from Mochi's own channel, the
// unexported ClientState.outbound, through reflection (located once, when
// the package is initialised; NewPacingHook fails if a Mochi version
// lacks it). Counting enqueues and writes in hooks instead would drift:
// Mochi has no hook for a delivery queued at QoS 0, and the ACL check
// that precedes it also sees SUBSCRIBE filters and deliveries that a
// later check refuses. Reading the length costs a few nanoseconds and no
// allocation per delivery, and nothing is kept per client.

// Defaults of PacingConfig.
const (
	// DefaultPacingMaxWait is the longest a publisher waits for one
	// delivery.
	DefaultPacingMaxWait = 5 * time.Millisecond
	// DefaultPacingStallAfter is how long a client's socket may accept
	// nothing while bytes wait for it before the client no longer counts
	// as draining.
	DefaultPacingStallAfter = 100 * time.Millisecond
	// MaxPacingMaxWait bounds PacingConfig.MaxWait: a publisher's read
	// goroutine must not stop for long.
	MaxPacingMaxWait = time.Second
)

// pacingPoll is how often a waiting publisher looks at the queue again.
const pacingPoll = 200 * time.Microsecond

// WriteDrainer is implemented by connections that can tell whether their
// client takes what the broker sends (broker/pingreq.Conn). A client whose
// connection does not implement it is never waited for.
type WriteDrainer interface {
	Draining(stallAfter time.Duration) bool
}

// PacingConfig configures a PacingHook.
type PacingConfig struct {
	// Server is the broker whose publishers are paced; its
	// Capabilities.MaximumClientWritesPending is the size of every
	// client's write queue. Required.
	Server *mqtt.Server
	// HighWater is the queue length (packets) from which a publisher
	// waits: 3/4 of MaximumClientWritesPending (at least 1) when zero.
	HighWater int
	// MaxWait is the longest a publisher waits for one delivery
	// (DefaultPacingMaxWait when zero; at most MaxPacingMaxWait). After
	// it the delivery is queued, or dropped if the queue is full.
	MaxWait time.Duration
	// StallAfter: a client whose socket accepted nothing for this long
	// while bytes waited for it is not draining, and nobody waits for it
	// (DefaultPacingStallAfter when zero).
	StallAfter time.Duration
}

// PacingCounters counts what pacing did. Safe for concurrent use.
type PacingCounters struct {
	// Waits counts deliveries a publisher waited for.
	Waits atomic.Uint64
	// WaitNanos is the total time publishers waited, in nanoseconds.
	WaitNanos atomic.Uint64
	// TimedOut counts waits that ended at MaxWait with the queue still
	// above the mark (the delivery was queued, or dropped if full).
	TimedOut atomic.Uint64
	// NotDraining counts deliveries to a client above the mark that was
	// not draining: nobody waited.
	NotDraining atomic.Uint64
}

// PacingHook is the Mochi hook that paces publishers toward clients whose
// write queue is filling while they drain it (see the package notes
// above). It keeps no state per client.
type PacingHook struct {
	mqtt.HookBase
	highWater  int
	maxWait    time.Duration
	stallAfter time.Duration

	// Counters counts waits.
	Counters PacingCounters
}

// NewPacingHook returns a hook for cfg.
func NewPacingHook(cfg PacingConfig) (*PacingHook, error) {
	if cfg.Server == nil {
		return nil, errors.New("pacing hook needs a server")
	}
	if writeQueueField < 0 {
		return nil, errors.New("pacing hook: this Mochi version has no client write queue ClientState.outbound of type chan *packets.Packet; turn publisher pacing off")
	}
	capacity := int(cfg.Server.Options.Capabilities.MaximumClientWritesPending)
	if cfg.HighWater == 0 {
		cfg.HighWater = max(capacity*3/4, 1)
	}
	if cfg.HighWater < 1 || cfg.HighWater > capacity {
		return nil, errors.New("pacing hook: high-water mark must be from 1 to the client write queue's size")
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultPacingMaxWait
	}
	if cfg.MaxWait < 0 || cfg.MaxWait > MaxPacingMaxWait {
		return nil, errors.New("pacing hook: max wait must be positive and at most " + MaxPacingMaxWait.String())
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = DefaultPacingStallAfter
	}
	if cfg.StallAfter < 0 {
		return nil, errors.New("pacing hook: stall-after must be positive")
	}
	return &PacingHook{highWater: cfg.HighWater, maxWait: cfg.MaxWait, stallAfter: cfg.StallAfter}, nil
}

// ID identifies the hook to Mochi.
func (h *PacingHook) ID() string { return "luffymq-publisher-pacing" }

// Provides tells Mochi which events the hook handles: only OnACLCheck.
func (h *PacingHook) Provides(b byte) bool { return b == mqtt.OnACLCheck }

// HighWater returns the queue length from which publishers wait.
func (h *PacingHook) HighWater() int { return h.highWater }

// OnACLCheck waits, before a delivery to cl, while cl's write queue is at
// or above the high-water mark and cl drains it. It answers false: it
// allows nothing, and leaves the answer to the hook that decides.
func (h *PacingHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if write || writeQueueLen(cl) < h.highWater {
		return false
	}
	h.pace(cl, topic)
	return false
}

// pace waits for cl's write queue to go below the mark, at most maxWait,
// while cl drains.
func (h *PacingHook) pace(cl *mqtt.Client, topic string) {
	if isFilter(topic) {
		return // a SUBSCRIBE's filter, checked on the subscriber's own goroutine
	}
	d, ok := cl.Net.Conn.(WriteDrainer)
	if !ok {
		return
	}
	if !d.Draining(h.stallAfter) {
		h.Counters.NotDraining.Add(1)
		return
	}
	start := time.Now()
	var waited time.Duration
	for {
		time.Sleep(pacingPoll)
		waited = time.Since(start)
		if writeQueueLen(cl) < h.highWater || cl.Closed() || !d.Draining(h.stallAfter) {
			break
		}
		if waited >= h.maxWait {
			h.Counters.TimedOut.Add(1)
			break
		}
	}
	h.Counters.Waits.Add(1)
	h.Counters.WaitNanos.Add(uint64(waited))
}

// isFilter reports whether topic is a subscription filter rather than a
// topic name: it holds a wildcard, or names a shared group. (A filter
// without either is indistinguishable, and waits as a delivery would.)
func isFilter(topic string) bool {
	return strings.ContainsAny(topic, "+#") || mqtt.IsSharedFilter(topic)
}

// writeQueueField is the index in mqtt.ClientState of Mochi's per-client
// write queue (outbound, a chan *packets.Packet), or -1 if this Mochi
// version has none; writeQueueOffset is its offset in the struct.
var writeQueueField, writeQueueOffset = func() (int, uintptr) {
	f, ok := reflect.TypeFor[mqtt.ClientState]().FieldByName("outbound")
	if !ok || len(f.Index) != 1 || f.Type != reflect.TypeFor[chan *packets.Packet]() {
		return -1, 0
	}
	return f.Index[0], f.Offset
}()

// writeQueueLen returns how many packets wait in cl's write queue.
//
// It reads the field at the offset reflection found, checked above to be
// a chan *packets.Packet: the same read as reflect.Value.Field and Len,
// without their checks (flags, the field's export status), which took 70 %
// of the time on every delivery (BenchmarkPacingACLCheck 17.8 -> 5.3 ns).
func writeQueueLen(cl *mqtt.Client) int {
	return len(*(*chan *packets.Packet)(unsafe.Add(unsafe.Pointer(&cl.State), writeQueueOffset)))
}
