package shared

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBuildResultCountsLostAndDuplicates(t *testing.T) {
	s := Scenario{ID: "x", Members: []Member{{Service: time.Millisecond}, {Service: time.Millisecond}}}
	ds := []Delivery{
		{Seq: 0, Member: 0, Sent: 0, Start: time.Millisecond},
		{Seq: 1, Member: 1, Sent: 0, Start: 2 * time.Millisecond},
		{Seq: 1, Member: 0, Sent: 0, Start: 5 * time.Millisecond}, // redelivery
	}
	r := buildResult(s, KindSDK, "luffymq-adaptive", 1, nil, 4, 1, ds)
	require.Equal(t, 2, r.Dequeued)
	require.Equal(t, 2, r.Lost)
	require.Equal(t, 1, r.Duplicated)
	require.Equal(t, 1, r.PerSub[0].Count)
	require.Equal(t, 1, r.PerSub[1].Count)
	require.Equal(t, 1.5, r.Overall.Mean)
}
