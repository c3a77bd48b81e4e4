package bridge

import (
	"testing"
	"time"

	"github.com/luffymq/luffymq/bridge/wqroute"
)

// A lease holder hears what its router cannot work out for itself at
// once, and otherwise only once a holder heartbeat has passed since its
// last state.
func TestStateSenderHolderReason(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(3000, 0)
	state := func(at time.Duration, taken uint64, waits ...time.Duration) wqroute.State {
		st := wqroute.State{Site: "tokyo", Broker: "tokyo-1", Boot: "b1", Sent: t0.Add(at).UnixNano(), Taken: map[string]uint64{"tunis": taken}}
		for _, w := range waits {
			st.Members = append(st.Members, wqroute.MemberState{Wait: w, Service: time.Second})
		}
		return st
	}
	s := stateSender{holderHeartbeat: time.Second}
	prev := sentState{st: state(0, 4, 0, 800*ms), at: t0}
	tol := 100 * ms
	// Tunis's message, sent to the idle member, was taken at 100 ms: at
	// 300 ms that member has 800 ms left, as tunis's router predicts.
	took := state(300*ms, 5, 800*ms, 500*ms)
	s.takes = []int64{t0.Add(100 * ms).UnixNano()}
	if why := s.holderReason(prev, took, "tunis", "change", t0.Add(300*ms), tol); why != "" {
		t.Errorf("a change the holder predicts goes out (%q)", why)
	}
	if why := s.holderReason(prev, took, "tunis", "change", t0.Add(1100*ms), tol); why != "heartbeat" {
		t.Errorf("after a holder heartbeat without a state: %q, want heartbeat", why)
	}
	// Without the take's time the member looks 200 ms ahead of plan.
	s.takes = nil
	if why := s.holderReason(prev, took, "tunis", "change", t0.Add(300*ms), tol); why != "change" {
		t.Errorf("a take placed at the state's send time: %q, want change", why)
	}
	// Berlin's router cannot know of tunis's message.
	s.takes = []int64{t0.Add(100 * ms).UnixNano()}
	if why := s.holderReason(prev, took, "berlin", "idle", t0.Add(300*ms), tol); why != "idle" {
		t.Errorf("another origin's take: %q, want idle", why)
	}
}
