package shared

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWriteDeliveryTrace(t *testing.T) {
	s, err := ScenarioByID("thesis-2")
	require.NoError(t, err)
	ms := time.Millisecond
	ds := []Delivery{
		{Seq: 1, Member: 2, Sent: 10 * ms, Ready: 11 * ms, Start: 11 * ms},
		{Seq: 0, Member: 0, Sent: 0, Ready: 1500 * time.Microsecond, Start: 1500 * time.Microsecond},
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	require.NoError(t, writeDeliveryTrace(path, s, ds))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, []string{
		"seq,member,sent_ms,ready_ms,start_ms,end_ms",
		"0,1,0.000,1.500,1.500,26.500",    // member 1 takes 25 ms
		"1,3,10.000,11.000,11.000,61.000", // member 3 takes 50 ms
	}, strings.Split(strings.TrimSpace(string(b)), "\n"), "in publish order, members 1-based")

	require.Error(t, writeDeliveryTrace(filepath.Join(t.TempDir(), "no", "such", "dir.csv"), s, ds))
}
