package soak

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// soakPayloadSize is the size of every soak message: sequence ID (8 bytes),
// send time in Unix nanoseconds (8), group index (2), QoS (1), zero padding.
const soakPayloadSize = 32

// encodeSoakPayload writes a soak message into b (soakPayloadSize bytes).
func encodeSoakPayload(b []byte, seq uint64, sent time.Time, group int, qos byte) {
	binary.BigEndian.PutUint64(b[0:8], seq)
	binary.BigEndian.PutUint64(b[8:16], uint64(sent.UnixNano()))
	binary.BigEndian.PutUint16(b[16:18], uint16(group))
	b[18] = qos
	clear(b[19:soakPayloadSize])
}

// decodeSoakPayload reads what encodeSoakPayload wrote.
func decodeSoakPayload(b []byte) (seq uint64, sentNs int64, group int, qos byte, ok bool) {
	if len(b) != soakPayloadSize {
		return 0, 0, 0, 0, false
	}
	return binary.BigEndian.Uint64(b[0:8]), int64(binary.BigEndian.Uint64(b[8:16])),
		int(binary.BigEndian.Uint16(b[16:18])), b[18], true
}

// Publish states of a sequence ID in soakTracker.published (a positive
// value is the Unix time in nanoseconds at which the broker acknowledged a
// QoS 1 publish, or at which a QoS 0 publish was written).
const (
	soakPending int64 = 0  // reserved, publish not finished
	soakFailed  int64 = -1 // the publish returned an error: not counted
)

// soakTracker counts, per sequence ID, what was published and how often it
// was received, so lost and duplicated messages are counted exactly. Every
// array is allocated once for the run's capacity; recording a message
// allocates nothing.
type soakTracker struct {
	qos1Percent int
	next        atomic.Uint64
	published   []atomic.Int64
	group       []uint16 // written by the publisher before the publish
	received    []atomic.Uint32
	latencyMs   []atomic.Uint32 // float32 bits of the first receipt's latency

	receipts   atomic.Int64 // every delivery, duplicates included
	firstQoS1  atomic.Int64
	firstQoS0  atomic.Int64
	dupQoS1    atomic.Int64
	dupQoS0    atomic.Int64
	misrouted  atomic.Int64 // delivered to a member of another group
	undecoded  atomic.Int64
	pubFailed  atomic.Int64
	overflowed atomic.Int64

	winMu  sync.Mutex
	winLat []float64 // first-receipt latencies since the last sample

	// watermark: every ID below it is settled (received, failed, or QoS 0
	// missing for long); scanMu guards it.
	scanMu             sync.Mutex
	watermark          uint64
	missingQoS0Settled int
}

func newSoakTracker(capacity, qos1Percent int) *soakTracker {
	return &soakTracker{
		qos1Percent: qos1Percent,
		published:   make([]atomic.Int64, capacity),
		group:       make([]uint16, capacity),
		received:    make([]atomic.Uint32, capacity),
		latencyMs:   make([]atomic.Uint32, capacity),
		winLat:      make([]float64, 0, 4096),
	}
}

// qosOf is the QoS of sequence ID seq: qos1Percent of every 100 IDs are
// QoS 1, spread evenly.
func (t *soakTracker) qosOf(seq uint64) byte {
	// Bresenham-style spreading: ID k is QoS 1 when the count of QoS 1 IDs
	// up to k grows.
	p := uint64(t.qos1Percent)
	if (seq+1)*p/100 > seq*p/100 {
		return 1
	}
	return 0
}

// reserve returns the next sequence ID for group, or false when the
// capacity is used up.
func (t *soakTracker) reserve(group int) (uint64, bool) {
	seq := t.next.Add(1) - 1
	if seq >= uint64(len(t.published)) {
		t.overflowed.Add(1)
		return 0, false
	}
	t.group[seq] = uint16(group)
	return seq, true
}

// publishDone records the outcome of the publish of seq.
func (t *soakTracker) publishDone(seq uint64, at time.Time, err error) {
	if err != nil {
		t.published[seq].Store(soakFailed)
		t.pubFailed.Add(1)
		return
	}
	t.published[seq].Store(at.UnixNano())
}

// receive records a delivery of payload to a member of group at now.
func (t *soakTracker) receive(payload []byte, group int, now time.Time) {
	seq, sentNs, g, qos, ok := decodeSoakPayload(payload)
	if !ok || seq >= uint64(len(t.received)) {
		t.undecoded.Add(1)
		return
	}
	t.receipts.Add(1)
	if g != group {
		t.misrouted.Add(1)
	}
	if t.received[seq].Add(1) > 1 {
		if qos == 1 {
			t.dupQoS1.Add(1)
		} else {
			t.dupQoS0.Add(1)
		}
		return
	}
	if qos == 1 {
		t.firstQoS1.Add(1)
	} else {
		t.firstQoS0.Add(1)
	}
	lat := float64(now.UnixNano()-sentNs) / 1e6
	t.latencyMs[seq].Store(math.Float32bits(float32(lat)))
	t.winMu.Lock()
	t.winLat = append(t.winLat, lat)
	t.winMu.Unlock()
}

// takeWindow returns the p99 of the first-receipt latencies since the last
// call (NaN if none) and how many there were.
func (t *soakTracker) takeWindow(scratch []float64) (p99 float64, n int, buf []float64) {
	t.winMu.Lock()
	scratch = append(scratch[:0], t.winLat...)
	t.winLat = t.winLat[:0]
	t.winMu.Unlock()
	slices.Sort(scratch)
	return harness.Percentile(scratch, 99), len(scratch), scratch
}

// soakOutstanding is what a scan of the tracker found.
type soakOutstanding struct {
	// OverdueQoS1 counts QoS 1 IDs acknowledged by the broker at least age
	// before the scan and received by nobody.
	OverdueQoS1 int
	// AwaitingQoS1 counts QoS 1 IDs acknowledged and not yet received,
	// however recent.
	AwaitingQoS1 int
	// MissingQoS0 counts QoS 0 IDs written at least age before the scan
	// and received by nobody.
	MissingQoS0 int
	// Overdue lists up to 20 overdue QoS 1 IDs, for diagnosis.
	Overdue []uint64
}

// scan counts the outstanding messages at now; a message is overdue once
// it has been unreceived for age since the broker acknowledged (QoS 1) or
// the publisher wrote it (QoS 0). IDs below
// the watermark are not looked at again: a QoS 0 message missing for age is
// counted as missing from then on (see finalCounts for the exact tally).
func (t *soakTracker) scan(now time.Time, age time.Duration) soakOutstanding {
	t.scanMu.Lock()
	defer t.scanMu.Unlock()
	var o soakOutstanding
	limit := min(t.next.Load(), uint64(len(t.published)))
	cut := now.Add(-age).UnixNano()
	settled := true
	for seq := t.watermark; seq < limit; seq++ {
		at := t.published[seq].Load()
		got := t.received[seq].Load() > 0
		old := at > 0 && at <= cut
		done := false
		switch {
		case got || at == soakFailed:
			done = true
		case at == soakPending:
		case t.qosOf(seq) == 1:
			o.AwaitingQoS1++
			if old {
				o.OverdueQoS1++
				if len(o.Overdue) < 20 {
					o.Overdue = append(o.Overdue, seq)
				}
			}
		case old:
			if settled {
				t.missingQoS0Settled++
				done = true
			} else {
				o.MissingQoS0++
			}
		}
		settled = settled && done
		if settled {
			t.watermark = seq + 1
		}
	}
	o.MissingQoS0 += t.missingQoS0Settled
	return o
}

// soakFinal is the exact tally at the end of a run.
type soakFinal struct {
	AckedQoS1, WrittenQoS0 int
	// LostQoS1 were acknowledged by the broker and received by nobody.
	LostQoS1 int
	// MissingQoS0 were written and received by nobody.
	MissingQoS0 int
	// Lost lists up to 20 lost QoS 1 IDs.
	Lost []uint64
}

// finalCounts counts, over every ID, what was published and what was never
// received.
func (t *soakTracker) finalCounts() soakFinal {
	var f soakFinal
	limit := min(t.next.Load(), uint64(len(t.published)))
	for seq := range limit {
		if t.published[seq].Load() <= 0 {
			continue
		}
		got := t.received[seq].Load() > 0
		if t.qosOf(seq) == 1 {
			f.AckedQoS1++
			if !got {
				f.LostQoS1++
				if len(f.Lost) < 20 {
					f.Lost = append(f.Lost, seq)
				}
			}
		} else {
			f.WrittenQoS0++
			if !got {
				f.MissingQoS0++
			}
		}
	}
	return f
}

// latencies returns the first-receipt latencies of every received QoS 1
// and QoS 0 message, sorted.
func (t *soakTracker) latencies() (qos1, qos0 []float64) {
	limit := min(t.next.Load(), uint64(len(t.published)))
	for seq := range limit {
		if t.received[seq].Load() == 0 {
			continue
		}
		v := float64(math.Float32frombits(t.latencyMs[seq].Load()))
		if t.qosOf(seq) == 1 {
			qos1 = append(qos1, v)
		} else {
			qos0 = append(qos0, v)
		}
	}
	slices.Sort(qos1)
	slices.Sort(qos0)
	return qos1, qos0
}
