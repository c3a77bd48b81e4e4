package shared

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFleetScenarios(t *testing.T) {
	for _, size := range []int{6, 20, 100} {
		for _, rho := range []float64{0.70, 0.85, 0.95} {
			s := FleetScenario(size, rho, false, "", fleetSeed)
			require.Len(t, s.Members, size)
			lo, hi := time.Hour, time.Duration(0)
			for _, m := range s.Members {
				lo, hi = min(lo, m.Service), max(hi, m.Service)
				require.GreaterOrEqual(t, m.Service, 10*time.Millisecond)
				require.LessOrEqual(t, m.Service, 100*time.Millisecond)
			}
			if size >= 20 {
				require.Greater(t, hi, 5*lo, "%s: speeds spread over most of 10×", s.ID)
			}
			// The Poisson gap puts the offered load at rho of capacity.
			got := float64(time.Second) / float64(s.Gap) / s.Capacity(0)
			require.InDelta(t, rho, got, 0.01, s.ID)
			_, err := ScenarioByID(s.ID)
			require.NoError(t, err, "%s is selectable with --scenario", s.ID)
		}
	}
	require.Equal(t, FleetScenario(20, 0.85, false, "", fleetSeed).Members, FleetScenario(20, 0.85, false, "", fleetSeed).Members, "seeded: the same fleet every run")

	churn, err := ScenarioByID("fleet-20-rho85-churn")
	require.NoError(t, err)
	require.InDelta(t, 16.0/20, churn.Capacity(5*time.Second)/churn.Capacity(15*time.Second), 0.3, "4 of 20 join at 10 s")
	require.Less(t, churn.Capacity(25*time.Second), churn.Capacity(15*time.Second), "4 are killed at 20 s")
}

func TestServiceNoise(t *testing.T) {
	for _, noise := range []string{NoiseExponential, NoiseUniform20} {
		s, err := ScenarioByID("fleet-20-rho85-" + noise)
		require.NoError(t, err)
		run := s.ForRun(1)
		n := len(run.Trace(1))
		require.Len(t, run.work, n, "a work size per message")
		var sum float64
		lo, hi := 1.0, 1.0
		for _, w := range run.work {
			sum += w
			lo, hi = min(lo, w), max(hi, w)
		}
		require.InDelta(t, 1, sum/float64(n), 0.1, "%s: work sizes have mean 1", noise)
		if noise == NoiseUniform20 {
			require.GreaterOrEqual(t, lo, 0.8)
			require.Less(t, hi, 1.2)
		} else {
			require.Greater(t, hi, 3.0, "exponential work has a long tail")
		}
		require.Equal(t, run.work, s.ForRun(1).work, "the same seed, the same work")
		require.NotEqual(t, run.work, s.ForRun(2).work)
		require.Equal(t, time.Duration(float64(s.Members[3].Service)*run.work[7]), run.ServiceTime(3, 7, 0))

		// The oracle and the members see the same service times.
		trace := run.Trace(1)
		for _, d := range Oracle(run, trace)[:50] {
			require.GreaterOrEqual(t, d.Start, trace[d.Seq])
		}
	}
	fixed, err := ScenarioByID("fleet-20-rho85")
	require.NoError(t, err)
	require.Nil(t, fixed.ForRun(1).work, "no noise, no work sizes")
	require.Equal(t, fixed.Members[3].Service, fixed.ForRun(1).ServiceTime(3, 7, 0))
}
