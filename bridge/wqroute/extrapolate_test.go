package wqroute

import (
	"testing"
	"time"
)

func TestExtrapolates(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1000, 0)
	state := func(at time.Duration, intake int, taken map[string]uint64, waits ...time.Duration) State {
		st := State{Site: "tokyo", Broker: "tokyo-1", Boot: "b1", Sent: t0.Add(at).UnixNano(), Intake: intake, Taken: taken}
		for _, w := range waits {
			st.Members = append(st.Members, MemberState{Wait: w, Service: time.Second})
		}
		return st
	}
	last := state(0, 0, map[string]uint64{"tunis": 4}, 300*ms, 800*ms)
	tol := 100 * ms
	cases := []struct {
		name string
		cur  State
		want bool
	}{
		{"time passed, as predicted", state(200*ms, 0, map[string]uint64{"tunis": 4}, 100*ms, 600*ms), true},
		{"within the tolerance", state(200*ms, 0, map[string]uint64{"tunis": 4}, 150*ms, 560*ms), true},
		{"a member freed early", state(150*ms, 0, map[string]uint64{"tunis": 4}, 0, 650*ms), false},
		{"a member is late", state(500*ms, 0, map[string]uint64{"tunis": 4}, 250*ms, 300*ms), false},
		// The first member freed at 300 ms and took tunis's next message:
		// tunis's router placed it there itself.
		{"took the holder's message", state(400*ms, 0, map[string]uint64{"tunis": 5}, 900*ms, 400*ms), true},
		// The same wait from a local publish: tunis cannot know.
		{"took a local message", state(400*ms, 0, map[string]uint64{"tunis": 4}, 900*ms, 400*ms), false},
		{"took another origin's message", state(400*ms, 0, map[string]uint64{"tunis": 4, "berlin": 1}, 900*ms, 400*ms), false},
		{"the intake grew", state(200*ms, 1, map[string]uint64{"tunis": 4}, 100*ms, 600*ms), false},
		{"a member joined", state(200*ms, 0, map[string]uint64{"tunis": 4}, 100*ms, 600*ms, 0), false},
	}
	for _, c := range cases {
		if got := Extrapolates(last, c.cur, "tunis", nil, tol); got != c.want {
			t.Errorf("%s: Extrapolates = %v, want %v", c.name, got, c.want)
		}
	}
	restarted := state(200*ms, 0, map[string]uint64{"tunis": 4}, 100*ms, 600*ms)
	restarted.Boot = "b2"
	if Extrapolates(last, restarted, "tunis", nil, tol) {
		t.Error("a restarted broker's state extrapolates")
	}
	// A member without a service time takes one message, and then
	// nothing can be said of it.
	untimed := state(0, 0, map[string]uint64{"tunis": 0}, 0)
	untimed.Members[0].Service = 0
	took := state(100*ms, 0, map[string]uint64{"tunis": 1}, 0)
	took.Members[0].Service = 0
	if Extrapolates(untimed, took, "tunis", nil, tol) {
		t.Error("an untimed member's take extrapolates")
	}
	// A message taken long before the state: it started then, not at
	// the state's send time. Tunis's router, which counts it started on
	// arrival, predicts its member 400 ms into it.
	late := state(700*ms, 0, map[string]uint64{"tunis": 5}, 600*ms, 100*ms)
	takenAt := []int64{t0.Add(300 * ms).UnixNano()}
	if !Extrapolates(last, late, "tunis", takenAt, tol) {
		t.Error("a message taken 400 ms before the state, as predicted, does not extrapolate")
	}
	if Extrapolates(last, late, "tunis", nil, tol) {
		t.Error("without its take time, a message is placed at the state's send time, yet extrapolates 400 ms off")
	}
	// Taken while every member was busy: it starts when the first frees
	// (300 ms), not when it was taken (100 ms).
	queued := []int64{t0.Add(100 * ms).UnixNano()}
	if !Extrapolates(last, late, "tunis", queued, tol) {
		t.Error("a message taken while its member was busy does not start when the member frees")
	}
	if Extrapolates(last, state(700*ms, 0, map[string]uint64{"tunis": 5}, 800*ms, 100*ms), "tunis", queued, tol) {
		t.Error("a message started 200 ms late extrapolates")
	}
	if allocs := testing.AllocsPerRun(100, func() { Extrapolates(last, late, "tunis", takenAt, tol) }); allocs != 0 {
		t.Errorf("Extrapolates allocates %v times", allocs)
	}
}

func TestExtrapolationTolerance(t *testing.T) {
	ms := time.Millisecond
	members := []MemberState{{Service: time.Second}, {Service: 200 * ms}, {Service: 0}}
	if got := ExtrapolationTolerance(members, 100*ms); got != 50*ms {
		t.Errorf("tolerance = %v, want a quarter of the shortest service, 50ms", got)
	}
	if got := ExtrapolationTolerance(members[:1], 100*ms); got != 100*ms {
		t.Errorf("tolerance = %v, want the interval, 100ms", got)
	}
}
