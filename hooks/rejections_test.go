package hooks

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestRejectionLogKeepsNewestFirstBounded(t *testing.T) {
	var l rejectionLog
	require.Empty(t, l.list())
	for i := range RecentRejectionsKept + 7 {
		l.add(fmt.Sprintf("c%d", i), ViaPublish, "bad")
	}
	got := l.list()
	require.Len(t, got, RecentRejectionsKept)
	require.Equal(t, fmt.Sprintf("c%d", RecentRejectionsKept+6), got[0].ClientID, "newest first")
	require.Equal(t, "c7", got[len(got)-1].ClientID, "the oldest seven forgotten")
	require.Equal(t, "publish", got[0].Channel)
}

func TestRejectionLogTruncatesWithoutSplittingRunes(t *testing.T) {
	var l rejectionLog
	long := strings.Repeat("é", maxRejectionText) // two bytes each
	l.add(long, ViaPingreq, long+"x")
	r := l.list()[0]
	require.LessOrEqual(t, len(r.ClientID), maxRejectionText)
	require.LessOrEqual(t, len(r.Reason), maxRejectionText)
	require.True(t, utf8.ValidString(r.ClientID))
	require.True(t, utf8.ValidString(r.Reason))
	require.Equal(t, "pingreq", r.Channel)
	require.Equal(t, strings.Repeat("é", maxRejectionText/2), r.ClientID)
}
