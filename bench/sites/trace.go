package sites

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"time"
)

// writeWQTrace writes one line per receipt of a work-queue run to path, as
// CSV sorted by send time: the message ID in hex (the first 8 bytes of its
// payload, which luffymq's debug-level route lines show as the start of
// head), its origin site, when it was published and when a member of which
// site started it (milliseconds from the start of publishing), its wait,
// and which member (the run's receiver index: two lines with the same
// member are one after another on one consumer).
// A message started twice has two lines; a lost one has none.
func writeWQTrace(path string, sites []string, m measurement, receiverSite []int) error {
	rs := slices.Clone(m.receipts)
	slices.SortStableFunc(rs, func(a, b receipt) int { return a.Sent.Compare(b.Sent) })
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("work-queue trace: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "id,origin,sent_ms,site,started_ms,wait_ms,member")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	name := func(i int) string {
		if i >= 0 && i < len(sites) {
			return sites[i]
		}
		return "?"
	}
	for _, r := range rs {
		exp, ok := m.owed[r.ID]
		if !ok {
			continue
		}
		site := -1
		if r.Receiver >= 0 && r.Receiver < len(receiverSite) {
			site = receiverSite[r.Receiver]
		}
		fmt.Fprintf(w, "%016x,%s,%s,%s,%s,%s,%d\n", r.ID, name(exp.Origin), ms(r.Sent.Sub(m.start)), name(site), ms(r.At.Sub(m.start)), ms(r.At.Sub(r.Sent)), r.Receiver)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("work-queue trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("work-queue trace: %w", err)
	}
	return nil
}
