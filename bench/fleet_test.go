package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFleetScenarios(t *testing.T) {
	for _, size := range []int{6, 20, 100} {
		for _, rho := range []float64{0.70, 0.85, 0.95} {
			s := FleetScenario(size, rho, false, fleetSeed)
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
	require.Equal(t, FleetScenario(20, 0.85, false, fleetSeed).Members, FleetScenario(20, 0.85, false, fleetSeed).Members, "seeded: the same fleet every run")

	churn, err := ScenarioByID("fleet-20-rho85-churn")
	require.NoError(t, err)
	require.InDelta(t, 16.0/20, churn.Capacity(5*time.Second)/churn.Capacity(15*time.Second), 0.3, "4 of 20 join at 10 s")
	require.Less(t, churn.Capacity(25*time.Second), churn.Capacity(15*time.Second), "4 are killed at 20 s")
}
