package bridge

import (
	"testing"
	"time"

	"github.com/luffymq/luffymq/scoring"
)

func member(wait, service time.Duration) scoring.MemberSnapshot {
	return scoring.MemberSnapshot{Online: true, PredictedWait: wait, ServiceEstimate: service}
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
		{"no service estimate: no prediction", []scoring.MemberSnapshot{member(0, 100*ms), {Online: true}}, 0, 0, long, 0, false},
		{"no member online: no prediction", []scoring.MemberSnapshot{{Online: false, ServiceEstimate: ms}}, 0, 0, long, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := predictStart(tt.members, tt.elapsed, tt.ahead, tt.limit)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("predictStart = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
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
	got, ok := predictStart(members, 0, 640, time.Hour)
	if !ok || got != time.Second {
		t.Fatalf("predictStart = %v, %v; want 1s, true", got, ok)
	}
}

func TestOverflowViewDecide(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	var v overflowView
	// Before the consume loop has read the members nothing overflows, and
	// what stays is counted as ready.
	if v.decide(now) {
		t.Fatal("overflowed without members")
	}
	// One member free in 20 ms, 100 ms a message, TTL 150 ms: with one
	// message ready ahead (the one above) the new one would start at
	// 120 ms and stays; the next would start at 220 ms and leaves.
	v.setMembers([]scoring.MemberSnapshot{member(20*ms, 100*ms)}, 150*ms, now)
	if v.decide(now) {
		t.Fatal("a publish that starts within the TTL overflowed")
	}
	if !v.decide(now) {
		t.Fatal("a publish that would wait past the TTL stayed")
	}
	if v.readyWork != 2 {
		t.Fatalf("readyWork = %d, want 2 (the publishes that stayed)", v.readyWork)
	}
	// A basic.get tells what is really ready; -1 leaves a count as it is.
	v.setReady(0, -1)
	if v.readyWork != 0 || v.readyIntake != 0 {
		t.Fatalf("ready = %d, %d", v.readyWork, v.readyIntake)
	}
	v.setReady(-1, 3) // three other sites' messages are served first
	if !v.decide(now) {
		t.Fatal("stayed behind three intake messages")
	}
	if n := v.takeOverflowed(); n != 2 {
		t.Fatalf("takeOverflowed = %d, want 2", n)
	}
	if n := v.takeOverflowed(); n != 0 {
		t.Fatalf("takeOverflowed again = %d, want 0", n)
	}
}

func TestIntakeWeightMatters(t *testing.T) {
	tests := []struct {
		old, w int
		want   bool
	}{
		{100, 100, false},
		{0, 1, true},    // starts taking overflow
		{6000, 0, true}, // stops
		{6000, 1, true}, // saturated
		{1, 6000, true}, // room again
		{6000, 4000, false},
		{6000, 3000, true},
		{3000, 5999, false},
		{3000, 6000, true},
	}
	for _, tt := range tests {
		if got := intakeWeightMatters(tt.old, tt.w); got != tt.want {
			t.Errorf("intakeWeightMatters(%d, %d) = %v, want %v", tt.old, tt.w, got, tt.want)
		}
	}
}

// BenchmarkOverflowDecide is the per-publish cost of overflow at publish
// for an exported group of 8 busy members with a backlog: it must not
// allocate.
func BenchmarkOverflowDecide(b *testing.B) {
	members := make([]scoring.MemberSnapshot, 8)
	for i := range members {
		members[i] = member(time.Duration(i)*10*time.Millisecond, 100*time.Millisecond)
	}
	var v overflowView
	now := time.Now()
	v.setMembers(members, 200*time.Millisecond, now)
	b.ReportAllocs()
	for b.Loop() {
		v.setReady(10, 2)
		v.decide(now)
	}
}

func TestIntakePollInterval(t *testing.T) {
	if got := intakePollInterval(time.Second); got != 10*time.Millisecond {
		t.Errorf("right after intake traffic: %v, want 10ms", got)
	}
	if got := intakePollInterval(time.Minute); got != 50*time.Millisecond {
		t.Errorf("after a quiet minute: %v, want 50ms", got)
	}
}
