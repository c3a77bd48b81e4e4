package sites

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestSitesSmoke runs the smallest set-C configuration end to end — three
// real RabbitMQ sites (Berlin, Tunis, Montréal: 22 to 60 ms apart; two
// cannot absorb wq-balanced's busy site), the real luffymq
// binary and luffy-controller, a few seconds per scenario — on scenarios
// that together use every architecture, and checks sites.json: every
// architecture ran, the static ones lost nothing, every owed delivery is
// counted as delivered or lost, and no message crossed sites faster than
// the emulated one-way delay. The reconfig runs' losses are measured and
// logged, not asserted: loss-free moves are the bridge's guarantee, tested
// by bridge's own reconfiguration tests; this test checks that luffy-bench
// drives the controller (rounds happen) and counts.
func TestSitesSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts RabbitMQ nodes and luffymq; skipped with -short")
	}
	rabbitharness.SkipIfUnavailable(t)
	testenv.RequireBinary(t, "go", "golang-go")
	cfg := DefaultSitesConfig()
	cfg.Out = t.TempDir()
	cfg.Sites = []string{"berlin", "tunis", "montreal"}
	cfg.Scenarios = []string{SitesWQBalanced, SitesPSDynamic, SitesReconfig}
	cfg.WQDuration, cfg.PhaseDuration, cfg.ReconfigPeriod = 3*time.Second, time.Second, time.Second
	cfg.ProducerRate = 5
	cfg.DrainTimeout = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	require.NoError(t, RunSites(ctx, cfg))

	data, err := os.ReadFile(filepath.Join(cfg.Out, "sites.json"))
	require.NoError(t, err)
	var res SitesResults
	require.NoError(t, json.Unmarshal(data, &res))
	require.Equal(t, 50*time.Millisecond, res.Config.WQTTLPerMember, "luffymq's work-queue TTL per member, time-scaled")
	require.Equal(t, time.Second, res.Config.WQRetuneInterval)
	oneWay := harness.Millis(rabbitharness.CityDelay("berlin", "tunis")) // the shortest link
	seen := map[string]bool{}
	for _, sc := range cfg.Scenarios {
		for _, arch := range sitesArchitectures(sc) {
			seen[arch] = true
			r := findRun(res.Runs, sc, arch)
			require.NotNil(t, r, "%s on %s missing", arch, sc)
			require.Empty(t, r.Error, "%s on %s", arch, sc)
			require.Positive(t, r.Published, "%s on %s", arch, sc)
			require.Equal(t, r.Expected, r.Delivered+r.Lost, "%s on %s: every owed delivery is delivered or lost", arch, sc)
			if sc == SitesReconfig {
				t.Logf("%s: lost %d of %d deliveries; %+v; notes %v", arch, r.Lost, r.Expected, r.Reconfig, r.Notes)
			} else {
				require.Zero(t, r.Lost, "%s on %s: %v", arch, sc, r.Notes)
			}
			require.Positive(t, r.Remote, "%s on %s: some messages crossed sites", arch, sc)
			require.GreaterOrEqual(t, r.RemoteLatency.Min, oneWay-1, "%s on %s: nothing crosses sites faster than the %v ms link", arch, sc, oneWay)
			require.Less(t, r.Latency.P50, 2000.0, "%s on %s: median latency", arch, sc)
			require.Len(t, r.Quantiles, 101)
			require.Len(t, r.Overlay, len(cfg.Sites))
			if arch != ArchCloud && arch != ArchCloudDist {
				require.Positive(t, r.FederationLinks, "%s on %s", arch, sc)
				var msgs int64
				for _, o := range r.Overlay {
					msgs += o.MessagesOut
					require.Positive(t, o.BytesOut+o.BytesIn, "%s on %s: WAN bytes at %s", arch, sc, o.Site)
				}
				require.Positive(t, msgs, "%s on %s: overlay messages", arch, sc)
			} else {
				require.Zero(t, r.FederationLinks, "%s on %s", arch, sc)
			}
		}
	}
	for _, arch := range []string{ArchLuffyMQ, ArchLuffyMQRing, ArchLuffyMQTTLOnly, ArchQueueFederation, ArchFullMesh, ArchStar, ArchRandom, ArchCloud, ArchCloudDist, ArchReconfigConserve, ArchReconfigDiscard} {
		require.True(t, seen[arch], "architecture %s not covered", arch)
	}
	fm, lm := findRun(res.Runs, SitesPSDynamic, ArchFullMesh), findRun(res.Runs, SitesPSDynamic, ArchLuffyMQ)
	mesh, sync := 0, 0
	for _, wl := range res.Workloads {
		if wl.Scenario == SitesPSDynamic {
			for _, sites := range wl.PS.InstanceSites() {
				mesh += len(sites) * (len(sites) - 1)
				sync += 2 * (len(sites) - 1)
			}
		}
	}
	require.Equal(t, mesh, fm.FederationLinks, "full mesh: N·(N−1) links per exchange")
	require.Equal(t, sync, lm.FederationLinks, "luffymq: 2·(N−1) links per exchange")
	for _, arch := range []string{ArchReconfigConserve, ArchReconfigDiscard} {
		r := findRun(res.Runs, SitesReconfig, arch)
		require.NotNil(t, r.Reconfig)
		require.Positive(t, r.Reconfig.Rounds, arch)
	}
	for _, f := range []string{"summary.md", "sites-ps-dynamic-over-time.png", "sites-reconfig-over-time.png", "sites-wq-balanced-latency.png", "sites-ps-dynamic-overlay.png"} {
		info, err := os.Stat(filepath.Join(cfg.Out, f))
		require.NoError(t, err, f)
		require.Positive(t, info.Size(), f)
	}
}
