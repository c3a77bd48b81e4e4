package bridge

import (
	"testing"
	"time"
)

// SetConservationForTest makes downstreams wait at most replyWait for the
// answer to a conservation request, and calls hook (when not nil) as the
// agent of any node takes a request, with the requesting site and the
// upstream exchange, until t ends. Tests that call it do not run in
// parallel.
func SetConservationForTest(t testing.TB, replyWait time.Duration, hook func(site, exchange string)) {
	t.Helper()
	tm := defaultConserveTimings()
	tm.ReplyWait = replyWait
	conserveTimingsNow.Store(tm)
	if hook != nil {
		f := func(r conserveRequest) { hook(r.Site, r.Exchange) }
		conserveTakeHook.Store(&f)
	}
	t.Cleanup(func() {
		conserveTimingsNow.Store(nil)
		conserveTakeHook.Store(nil)
	})
}
