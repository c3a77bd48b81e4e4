package sites

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The trace has a line per start, in send order, with the receiver's site:
// a message started twice has two lines, a lost one none.
func TestWriteWQTrace(t *testing.T) {
	start := time.Unix(1000, 0)
	a, b, lost := sitesMsgID(false, 1, 1), sitesMsgID(false, 0, 1), sitesMsgID(false, 0, 2)
	m := measurement{
		start: start,
		owed: map[uint64]sitesExpectation{
			a: {Origin: 1}, b: {Origin: 0}, lost: {Origin: 0},
		},
		receipts: []receipt{
			{ID: a, Receiver: 0, Sent: start.Add(20 * time.Millisecond), At: start.Add(70 * time.Millisecond)},
			{ID: b, Receiver: 1, Sent: start.Add(10 * time.Millisecond), At: start.Add(15500 * time.Microsecond)},
			{ID: a, Receiver: 1, Sent: start.Add(20 * time.Millisecond), At: start.Add(90 * time.Millisecond)},
		},
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := writeWQTrace(path, []string{"berlin", "tunis"}, m, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"id,origin,sent_ms,site,started_ms,wait_ms,member",
		"0000000000000001,berlin,10.0,tunis,15.5,5.5,1",
		"0000000100000001,tunis,20.0,berlin,70.0,50.0,0",
		"0000000100000001,tunis,20.0,tunis,90.0,70.0,1",
	}, "\n") + "\n"
	if string(got) != want {
		t.Fatalf("trace:\n%s\nwant:\n%s", got, want)
	}
}
