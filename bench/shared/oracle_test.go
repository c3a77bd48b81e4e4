package shared

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

func TestOracleHandComputedTraces(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		members []Member
		trace   []time.Duration
		want    []Delivery // Seq, Member, Sent, Start
	}{
		{
			name:    "ties go to the member idle longest, then the lowest index",
			members: []Member{{Service: 10 * ms}, {Service: 10 * ms}},
			trace:   []time.Duration{0, 0, 0, 5 * ms},
			want: []Delivery{
				{0, 0, 0, 0, 0},
				{1, 1, 0, 0, 0},
				{2, 0, 0, 10 * ms, 0},
				{3, 1, 5 * ms, 10 * ms, 0},
			},
		},
		{
			name:    "a member is eligible only once it has joined",
			members: []Member{{Service: 30 * ms}, {Service: 10 * ms, JoinAt: 20 * ms}},
			trace:   []time.Duration{0, 10 * ms, 20 * ms},
			want: []Delivery{
				{0, 0, 0, 0, 0},
				{1, 0, 10 * ms, 30 * ms, 0},
				{2, 1, 20 * ms, 20 * ms, 0},
			},
		},
		{
			name:    "a crashing member takes only what it finishes before the crash",
			members: []Member{{Service: 10 * ms, CrashAt: 15 * ms}, {Service: 10 * ms}},
			trace:   []time.Duration{0, 0, 0},
			want: []Delivery{
				{0, 0, 0, 0, 0},
				{1, 1, 0, 0, 0},
				{2, 1, 0, 10 * ms, 0},
			},
		},
		{
			name:    "the service time that applies is the one at the service start",
			members: []Member{{Service: 10 * ms, ChangeAt: 20 * ms, NewService: 30 * ms}},
			trace:   []time.Duration{0, 10 * ms, 20 * ms, 25 * ms},
			want: []Delivery{
				{0, 0, 0, 0, 0},
				{1, 0, 10 * ms, 10 * ms, 0},
				{2, 0, 20 * ms, 20 * ms, 0},
				{3, 0, 25 * ms, 50 * ms, 0},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Oracle(Scenario{Members: tt.members}, tt.trace)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestOracleThesis2IsStableAtFullUtilisation(t *testing.T) {
	s, err := ScenarioByID("thesis-2")
	require.NoError(t, err)
	trace := s.Trace(1)
	require.Len(t, trace, 1500)
	ds := Oracle(s, trace)
	require.Len(t, ds, 1500)
	r := buildResult(s, KindSDK, harness.SystemOracle, 1, trace, len(trace), 1, ds)
	// Capacity equals the arrival rate: the earliest-start policy keeps the
	// queueing delay bounded by one slow service time.
	require.LessOrEqual(t, r.Overall.Max, 50.0)
	require.Equal(t, 0, r.Lost)
	require.InDelta(t, 100.0, s.Capacity(0), 1e-9)
}

func TestPoissonTraceIsReproducible(t *testing.T) {
	s, err := ScenarioByID("poisson")
	require.NoError(t, err)
	a, b := s.Trace(7), s.Trace(7)
	require.Equal(t, a, b)
	require.NotEqual(t, a, s.Trace(8))
	// Mean gap 8 ms over 30 s: about 3750 messages.
	require.InDelta(t, 3750, len(a), 300)
}

func TestParseSystems(t *testing.T) {
	got, err := harness.ParseSystems("oracle,adaptive,mosquitto,luffymq-thesis")
	require.NoError(t, err)
	require.Equal(t, []string{"luffymq-adaptive", "luffymq-thesis", "mosquitto", "oracle"}, got)
	_, err = harness.ParseSystems("adaptive,rabbit")
	require.ErrorContains(t, err, `unknown system "rabbit"`)
	all, err := harness.ParseSystems("")
	require.NoError(t, err)
	require.Equal(t, harness.AllSystems(), all)
}

func TestOracleWithDelays(t *testing.T) {
	ms := time.Millisecond
	s := Scenario{Members: []Member{{Service: 10 * ms}, {Service: 10 * ms}}}

	t.Run("no delays is the plain oracle", func(t *testing.T) {
		trace := []time.Duration{0, 0, 5 * ms, 12 * ms}
		require.Equal(t, Oracle(s, trace), OracleWithDelays(s, trace, nil))
		require.Equal(t, Oracle(s, trace), OracleWithDelays(s, trace, make([]time.Duration, len(trace))))
	})

	t.Run("a late arrival at an idle member delays what it takes next", func(t *testing.T) {
		// One member, fully used: message 0 arrives 3 ms late, so the
		// member is busy until 13 ms, and message 1, sent at 10 ms with no
		// delay, waits 3 ms: at full utilisation the delay is kept.
		one := Scenario{Members: []Member{{Service: 10 * ms}}}
		got := OracleWithDelays(one, []time.Duration{0, 10 * ms, 20 * ms}, []time.Duration{3 * ms})
		require.Equal(t, []Delivery{
			{Seq: 0, Member: 0, Sent: 0, Start: 3 * ms},
			{Seq: 1, Member: 0, Sent: 10 * ms, Start: 13 * ms},
			{Seq: 2, Member: 0, Sent: 20 * ms, Start: 23 * ms},
		}, got)
	})

	t.Run("thesis-2 with a constant delay is shifted by it", func(t *testing.T) {
		th, err := ScenarioByID("thesis-2")
		require.NoError(t, err)
		trace := th.Trace(1)
		delays := make([]time.Duration, len(trace))
		for i := range delays {
			delays[i] = ms
		}
		plain, late := Oracle(th, trace), OracleWithDelays(th, trace, delays)
		require.Len(t, late, len(plain))
		for i := range plain {
			require.Equal(t, plain[i].Member, late[i].Member, "message %d", i)
			require.Equal(t, plain[i].Latency()+ms, late[i].Latency(), "message %d", i)
		}
	})
}

func TestDeliveryDelays(t *testing.T) {
	ms := time.Millisecond
	ds := []Delivery{
		{Seq: 2, Sent: 20 * ms, Start: 25 * ms, Ready: 21 * ms},
		{Seq: 0, Sent: 0, Start: 2 * ms, Ready: 2 * ms},
		{Seq: 1, Sent: 10 * ms, Start: 10 * ms},                 // not measured
		{Seq: 7, Sent: 70 * ms, Start: 71 * ms, Ready: 71 * ms}, // out of range
	}
	require.Equal(t, []time.Duration{2 * ms, 0, ms, 0}, DeliveryDelays(ds, 4))
}
