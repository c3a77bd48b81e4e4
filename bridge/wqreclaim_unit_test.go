package bridge

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge/wqroute"
)

// What is taken back is counted by site, and what a sibling had booked is
// counted for it too, so that this broker's states tell it to unbook
// (State.Unbooked); a change of that count publishes a state at once.
func TestReclaimCounts(t *testing.T) {
	s := newStats(&Bridge{cfg: Config{Site: "tunis"}})
	s.wqReclaimed("jobs", "berlin", false, "")
	s.wqReclaimed("jobs", "berlin", true, "tunis-2")
	s.wqReclaimed("jobs", "berlin", false, "tunis-2")
	s.wqReclaimed("jobs", "montreal", false, "tunis-3")
	require.Equal(t, map[string]uint64{"berlin": 3, "montreal": 1}, s.wq["jobs"].reclaimed)
	require.Equal(t, map[string]uint64{"berlin": 1}, s.wq["jobs"].reclaimedRedelivered, "the one its link had given back")
	got := s.wqSiblingsReclaimed("jobs")
	require.Equal(t, map[string]map[string]uint64{"tunis-2": {"berlin": 2}, "tunis-3": {"montreal": 1}}, got)
	got["tunis-2"]["berlin"] = 99 // a copy
	require.Equal(t, uint64(2), s.wqSiblingsReclaimed("jobs")["tunis-2"]["berlin"])
	require.Empty(t, s.wqSiblingsReclaimed("other"))

	st := wqroute.State{Unbooked: s.wqSiblingsReclaimed("jobs")}
	before := changeOf(st, 0)
	s.wqReclaimed("jobs", "berlin", false, "tunis-2")
	st.Unbooked = s.wqSiblingsReclaimed("jobs")
	require.NotEqual(t, before, changeOf(st, 0))
	require.Equal(t, uint64(4), changeOf(st, 0).unbooked)
}
