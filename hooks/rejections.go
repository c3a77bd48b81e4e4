package hooks

import (
	"sync"
	"time"
	"unicode/utf8"
)

// RecentRejectionsKept is how many rejected load reports a SelectionHook
// remembers; older ones are forgotten (the counters keep counting).
const RecentRejectionsKept = 50

// maxRejectionText bounds the client ID and reason kept per rejection, so
// the list's memory stays bounded whatever clients send.
const maxRejectionText = 200

// RejectedReport is a load report the selection hook refused: malformed
// (counted and ignored) or oversized (the client was disconnected).
type RejectedReport struct {
	// Time is when the report arrived.
	Time time.Time
	// ClientID is the sender (truncated to 200 bytes).
	ClientID string
	// Channel is "pingreq" or "publish".
	Channel string
	// Reason says what was wrong with it (truncated to 200 bytes).
	Reason string
}

// rejectionLog is a ring of the most recent rejected reports.
type rejectionLog struct {
	mu   sync.Mutex
	buf  [RecentRejectionsKept]RejectedReport
	next int // index the next rejection is written to
	n    int // rejections held, at most RecentRejectionsKept
}

func (l *rejectionLog) add(clientID string, via ReportChannel, reason string) {
	r := RejectedReport{
		Time:     time.Now(),
		ClientID: truncateUTF8(clientID, maxRejectionText),
		Channel:  via.String(),
		Reason:   truncateUTF8(reason, maxRejectionText),
	}
	l.mu.Lock()
	l.buf[l.next] = r
	l.next = (l.next + 1) % RecentRejectionsKept
	l.n = min(l.n+1, RecentRejectionsKept)
	l.mu.Unlock()
}

// list returns the rejections held, newest first.
func (l *rejectionLog) list() []RejectedReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]RejectedReport, 0, l.n)
	for i := 1; i <= l.n; i++ {
		out = append(out, l.buf[(l.next-i+RecentRejectionsKept)%RecentRejectionsKept])
	}
	return out
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// RecentRejections returns the most recent rejected load reports (at most
// RecentRejectionsKept), newest first.
func (h *SelectionHook) RecentRejections() []RejectedReport { return h.rejections.list() }
