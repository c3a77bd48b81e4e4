package wqroute

import (
	"testing"
	"time"

	"github.com/luffymq/luffymq/scoring"
)

func member(wait, service time.Duration) scoring.MemberSnapshot {
	return scoring.MemberSnapshot{Online: true, PredictedWait: wait, ServiceEstimate: service}
}

// newcomer is an online member that has finished nothing yet: no service
// estimate, idle.
func newcomer() scoring.MemberSnapshot {
	return scoring.MemberSnapshot{Online: true, AcksAreFinishes: true}
}

func TestPredictStart(t *testing.T) {
	ms := time.Millisecond
	long := time.Hour
	tests := []struct {
		name    string
		members []scoring.MemberSnapshot
		elapsed time.Duration
		ahead   int
		limit   time.Duration
		want    time.Duration
		ok      bool
	}{
		{"an idle member starts it at once", []scoring.MemberSnapshot{member(0, 100*ms)}, 0, 0, long, 0, true},
		{"the member that frees first takes it", []scoring.MemberSnapshot{member(80*ms, 100*ms), member(30*ms, 100*ms)}, 0, 0, long, 30 * ms, true},
		// Free at 30 and 80 ms: the messages ahead go at 30 (to b, then
		// free at 130) and 80 (to a, then free at 180); the new one at 130.
		{"messages ahead go first, each to the member free first", []scoring.MemberSnapshot{member(80*ms, 100*ms), member(30*ms, 100*ms)}, 0, 2, long, 130 * ms, true},
		{"a fast member takes several while a slow one works", []scoring.MemberSnapshot{member(0, 10*ms), member(0, time.Second)}, 0, 5, long, 40 * ms, true},
		{"time since the reading counts", []scoring.MemberSnapshot{member(80*ms, 100*ms)}, 50 * ms, 0, long, 30 * ms, true},
		{"a wait read long ago is over", []scoring.MemberSnapshot{member(80*ms, 100*ms)}, time.Second, 1, long, 100 * ms, true},
		{"offline members take nothing", []scoring.MemberSnapshot{{Online: false}, member(20*ms, 100*ms)}, 0, 0, long, 20 * ms, true},
		{"stops once above the limit", []scoring.MemberSnapshot{member(0, 100*ms)}, 0, 1_000_000, 250 * ms, 300 * ms, true},
		{"an idle member without an estimate takes one", []scoring.MemberSnapshot{member(50*ms, 100*ms), newcomer()}, 0, 0, long, 0, true},
		{"and only one", []scoring.MemberSnapshot{member(50*ms, 100*ms), newcomer()}, 0, 2, long, 150 * ms, true},
		{"newcomers alone: one message each, then nothing to predict", []scoring.MemberSnapshot{newcomer(), newcomer()}, 0, 2, long, 0, false},
		{"a busy member without an estimate takes none", []scoring.MemberSnapshot{{Online: true, InFlight: 1, AcksAreFinishes: true}}, 0, 0, long, 0, false},
		{"nor one that acknowledges on receipt", []scoring.MemberSnapshot{{Online: true}}, 0, 0, long, 0, false},
		{"no member online: no prediction", []scoring.MemberSnapshot{{Online: false, ServiceEstimate: ms}}, 0, 0, long, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := PredictStart(tt.members, tt.elapsed, tt.ahead, tt.limit)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("PredictStart = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// A group larger than maxSimulatedMembers is predicted as a fluid: 64
// idle members of 100 ms get through 640 messages in 1 s.
func TestPredictStartFluid(t *testing.T) {
	members := make([]scoring.MemberSnapshot, 64)
	for i := range members {
		members[i] = member(0, 100*time.Millisecond)
	}
	got, ok := PredictStart(members, 0, 640, time.Hour)
	if !ok || got != time.Second {
		t.Fatalf("PredictStart = %v, %v; want 1s, true", got, ok)
	}
}

// In the fluid model, idle newcomers take one message each at once.
func TestPredictStartFluidWithNewcomers(t *testing.T) {
	members := make([]scoring.MemberSnapshot, 40)
	for i := range members {
		members[i] = member(0, 100*time.Millisecond)
	}
	members = append(members, newcomer(), newcomer())
	if got, ok := PredictStart(members, 0, 1, time.Hour); !ok || got != 0 {
		t.Fatalf("PredictStart behind one = %v, %v; want 0, true", got, ok)
	}
	if got, ok := PredictStart(members, 0, 402, time.Hour); !ok || got != time.Second {
		t.Fatalf("PredictStart behind 402 = %v, %v; want 1s, true", got, ok)
	}
}
