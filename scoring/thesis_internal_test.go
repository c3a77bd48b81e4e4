package scoring

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests read the thesis score itself, so they live inside the
// package; the selections they check are the public ones.

const ms = time.Millisecond

func newThesisEngine(t *testing.T) (*Engine, *ManualClock) {
	t.Helper()
	clock := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, err := NewEngine(Config{Strategy: "thesis", Clock: clock})
	require.NoError(t, err)
	return e, clock
}

func selectOne(t *testing.T, e *Engine, group string) string {
	t.Helper()
	id, ok := e.SelectMember(group, Message{PublisherID: "p", Topic: "t"})
	require.True(t, ok)
	return id
}

// TestThesisHandComputedScores follows algorithms.md §1.4 by hand:
//
//	t1 = t_n − t_s;  t2 = t_n − t_r;  back = max((m_q + m_s)·t_p − t2, 0);  score = t1 − back
//
// Timeline (ms): A and B connect at 0 (t_s = t_r = 0), C at 5 (t_s = t_r = 5).
// At 10 A reports m_q = 3, t_p = 20; at 20 B reports m_q = 0, t_p = 40.
// C never reports, so it uses the group mean t_p = (20 + 40) / 2 = 30.
func TestThesisHandComputedScores(t *testing.T) {
	e, clock := newThesisEngine(t)
	const g = "$share/g/t"
	e.Connect("A")
	e.Join(g, "A")
	e.Connect("B")
	e.Join(g, "B")
	clock.Advance(5 * ms) // 5
	e.Connect("C")
	e.Join(g, "C")
	clock.Advance(5 * ms) // 10
	require.True(t, e.Report("A", Load{Pending: 3, ProcessingTime: 20 * ms}))
	clock.Advance(10 * ms) // 20
	require.True(t, e.Report("B", Load{Pending: 0, ProcessingTime: 40 * ms}))

	const groupMean = 30 * ms
	steps := []struct {
		at     time.Duration // since the epoch
		scores map[string]time.Duration
		want   string
	}{
		// t_n = 30:
		//   A: t1 = 30−0 = 30, t2 = 30−10 = 20, back = max((3+0)·20 − 20, 0) = 40, score = −10
		//   B: t1 = 30−0 = 30, t2 = 30−20 = 10, back = max((0+0)·40 − 10, 0) = 0,  score = 30
		//   C: t1 = 30−5 = 25, t2 = 30−5 = 25,  back = max((0+0)·30 − 25, 0) = 0,  score = 25
		// → B (m_s = 1, t_s = 30)
		{30 * ms, map[string]time.Duration{"A": -10 * ms, "B": 30 * ms, "C": 25 * ms}, "B"},
		// t_n = 40:
		//   A: t1 = 40, t2 = 30, back = max(3·20 − 30, 0) = 30,       score = 10
		//   B: t1 = 10, t2 = 20, back = max((0+1)·40 − 20, 0) = 20,   score = −10
		//   C: t1 = 35, t2 = 35, back = max(0·30 − 35, 0) = 0,        score = 35
		// → C (m_s = 1, t_s = 40)
		{40 * ms, map[string]time.Duration{"A": 10 * ms, "B": -10 * ms, "C": 35 * ms}, "C"},
		// t_n = 50:
		//   A: t1 = 50, t2 = 40, back = max(3·20 − 40, 0) = 20,       score = 30
		//   B: t1 = 20, t2 = 30, back = max(1·40 − 30, 0) = 10,       score = 10
		//   C: t1 = 10, t2 = 45, back = max((0+1)·30 − 45, 0) = 0,    score = 10
		// → A (m_s = 1, t_s = 50)
		{50 * ms, map[string]time.Duration{"A": 30 * ms, "B": 10 * ms, "C": 10 * ms}, "A"},
		// t_n = 55:
		//   A: t1 = 5,  t2 = 45, back = max((3+1)·20 − 45, 0) = 35,   score = −30
		//   B: t1 = 25, t2 = 35, back = max(1·40 − 35, 0) = 5,        score = 20
		//   C: t1 = 15, t2 = 50, back = max(1·30 − 50, 0) = 0,        score = 15
		// → B
		{55 * ms, map[string]time.Duration{"A": -30 * ms, "B": 20 * ms, "C": 15 * ms}, "B"},
	}
	for _, st := range steps {
		clock.Advance(st.at - e.now())
		for id, want := range st.scores {
			require.Equal(t, want, thesisScore(e.members[id], e.now(), groupMean), "score of %s at %v", id, st.at)
		}
		require.Equal(t, st.want, selectOne(t, e, g), "selection at %v", st.at)
	}

	// A report clears m_s and re-anchors t_r (§1.3).
	require.True(t, e.Report("B", Load{Pending: 1, ProcessingTime: 40 * ms}))
	b := e.members["B"]
	require.Equal(t, 0, b.sentSinceReport)
	require.Equal(t, 1, b.reportedPending)
	require.Equal(t, 55*ms, b.lastReport)
	require.Equal(t, 55*ms, b.lastSend)
	require.Equal(t, 40*ms, b.thesisProcessingTime())
}

// TestThesisGroupMeanForMembersWithoutReports: C never reports, so its t_p
// is the mean of the others' (5 and 55 → 30). The selections below only
// come out this way for a t_p of C strictly between 25 and 40: not 0 (no
// fallback), not 20 (a mean counting C's zero), not 55 (the upper median).
func TestThesisGroupMeanForMembersWithoutReports(t *testing.T) {
	e, clock := newThesisEngine(t)
	const g = "$share/g/t"
	for _, id := range []string{"A", "B", "C"} {
		e.Connect(id)
		e.Join(g, id)
	}
	// t = 0: A has m_q = 4, t_p = 5; B has m_q = 0, t_p = 55.
	require.True(t, e.Report("A", Load{Pending: 4, ProcessingTime: 5 * ms}))
	require.True(t, e.Report("B", Load{Pending: 0, ProcessingTime: 55 * ms}))
	// Three selections at t = 0 (all t1 = t2 = 0):
	//   1st: A −(4·5) = −20, B −0 = 0, C −0 = 0 → B (first of the tie)
	//   2nd: A −20, B −(1·55) = −55, C 0 → C
	//   3rd: A −20, B −55, C −(1·30) = −30 → A
	require.Equal(t, "B", selectOne(t, e, g))
	require.Equal(t, "C", selectOne(t, e, g))
	require.Equal(t, "A", selectOne(t, e, g))
	// t = 10: A: 10 − max(5·5 − 10, 0) = −5; B: 10 − (55 − 10) = −35;
	// C: 10 − max(1·t_p − 10, 0) = 20 − t_p → −10 with t_p = 30 → A
	// (C would win with t_p < 25).
	clock.Advance(10 * ms)
	require.Equal(t, -10*ms, thesisScore(e.members["C"], e.now(), 30*ms))
	require.Equal(t, "A", selectOne(t, e, g))
	// t = 22: A: t1 = 12, back = max(6·5 − 22, 0) = 8 → 4;
	// B: 22 − 33 = −11; C: 22 − max(t_p − 22, 0) = 14 with t_p = 30 → C
	// (A would win with t_p ≥ 40).
	clock.Advance(12 * ms)
	require.Equal(t, 14*ms, thesisScore(e.members["C"], e.now(), 30*ms))
	require.Equal(t, "C", selectOne(t, e, g))
}

func TestThesisIsRoundRobinWithoutReports(t *testing.T) {
	tests := []struct {
		members []string
		want    []string
	}{
		{[]string{"a", "b"}, []string{"a", "b", "a", "b", "a", "b"}},
		{[]string{"a", "b", "c"}, []string{"a", "b", "c", "a", "b", "c", "a"}},
		{[]string{"a", "b", "c", "d"}, []string{"a", "b", "c", "d", "a", "b", "c", "d"}},
	}
	for _, tt := range tests {
		e, clock := newThesisEngine(t)
		for _, id := range tt.members {
			e.Connect(id)
			e.Join("$share/g/t", id)
		}
		var got []string
		for range tt.want {
			clock.Advance(10 * ms) // longest since its last message wins
			got = append(got, selectOne(t, e, "$share/g/t"))
		}
		require.Equal(t, tt.want, got)
	}
}

// TestThesisIsRoundRobinWithoutBacklog: reports with no pending messages and
// processing done long ago leave back = 0 for everyone.
func TestThesisIsRoundRobinWithoutBacklog(t *testing.T) {
	e, clock := newThesisEngine(t)
	for _, id := range []string{"a", "b", "c"} {
		e.Connect(id)
		e.Join("$share/g/t", id)
		require.True(t, e.Report(id, Load{Pending: 0, ProcessingTime: 5 * ms}))
	}
	var got []string
	for i := 0; i < 6; i++ {
		clock.Advance(10 * ms) // each member is sent one message per 30 ms, 5 ms of work
		got = append(got, selectOne(t, e, "$share/g/t"))
	}
	require.Equal(t, []string{"a", "b", "c", "a", "b", "c"}, got)
}

// TestThesisReportWindow: t_p is the mean of the last 5 reported values,
// zeros included; the adaptive estimate ignores zeros.
func TestThesisReportWindow(t *testing.T) {
	e, _ := newThesisEngine(t)
	e.Connect("a")
	e.Join("$share/g/t", "a")
	steps := []struct {
		report      time.Duration
		wantThesis  time.Duration
		wantService time.Duration
	}{
		{10 * ms, 10 * ms, 10 * ms},
		{20 * ms, 15 * ms, 15 * ms},
		{30 * ms, 20 * ms, 20 * ms},
		{40 * ms, 25 * ms, 25 * ms},
		{50 * ms, 30 * ms, 30 * ms},  // [10 20 30 40 50]
		{0, 28 * ms, 30 * ms},        // [20 30 40 50 0]
		{0, 24 * ms, 30 * ms},        // [30 40 50 0 0]
		{60 * ms, 30 * ms, 40 * ms},  // [40 50 0 0 60]; service [20 30 40 50 60]
		{0, 22 * ms, 40 * ms},        // [50 0 0 60 0]
		{0, 12 * ms, 40 * ms},        // [0 0 60 0 0]
		{0, 12 * ms, 40 * ms},        // [0 60 0 0 0]
		{0, 12 * ms, 40 * ms},        // [60 0 0 0 0]
		{0, 0, 40 * ms},              // [0 0 0 0 0]
		{100 * ms, 20 * ms, 56 * ms}, // [0 0 0 0 100]; service [30 40 50 60 100]
	}
	for i, st := range steps {
		require.True(t, e.Report("a", Load{ProcessingTime: st.report}))
		snap := e.Snapshot()[0].Members[0]
		require.Equal(t, st.wantThesis, snap.ProcessingTime, "thesis t_p after report %d", i)
		require.Equal(t, st.wantService, snap.ServiceEstimate, "service estimate after report %d", i)
	}
}

// TestThesisZeroWindowFallsBackToGroupMean: a member whose last five reports
// were all 0 counts as having no t_p, and takes the group mean.
func TestThesisZeroWindowFallsBackToGroupMean(t *testing.T) {
	e, _ := newThesisEngine(t)
	const g = "$share/g/t"
	for _, id := range []string{"b", "a"} { // b first: it would win a tie
		e.Connect(id)
		e.Join(g, id)
	}
	require.True(t, e.Report("a", Load{ProcessingTime: 50 * ms}))
	for i := 0; i < reportWindow; i++ {
		require.True(t, e.Report("b", Load{ProcessingTime: 10 * ms}))
	}
	for i := 0; i < reportWindow; i++ {
		require.True(t, e.Report("b", Load{ProcessingTime: 0, Pending: 2}))
	}
	require.Zero(t, e.members["b"].thesisProcessingTime())
	// b: t1 = 0, t2 = 0, back = (2 + 0)·50 (a's, the only t_p) = 100 → −100;
	// a: t1 = 0, back = 0 → 0. With a t_p of 0, b would score 0 and win.
	require.Equal(t, -100*ms, thesisScore(e.members["b"], e.now(), 50*ms))
	require.Equal(t, "a", selectOne(t, e, g))
}
