package shared

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"time"
)

// writeDeliveryTrace writes one CSV line per message a member took of a
// live run, in publish order: the message's sequence number, the member
// (1-based, as in scenarios.md), and in milliseconds from the start of
// publishing its scheduled publish, its receipt at the member, the start
// and the end of its (virtual) service. With the SDK's load reports in the
// client log, it is enough to replay what the broker knew at each choice.
func writeDeliveryTrace(path string, s Scenario, ds []Delivery) error {
	sorted := slices.Clone(ds)
	slices.SortStableFunc(sorted, func(a, b Delivery) int { return a.Seq - b.Seq })
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("delivery trace: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "seq,member,sent_ms,ready_ms,start_ms,end_ms")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
	for _, d := range sorted {
		end := d.Start + s.ServiceTime(d.Member, d.Seq, d.Start)
		fmt.Fprintf(w, "%d,%d,%s,%s,%s,%s\n", d.Seq, d.Member+1, ms(d.Sent), ms(d.Ready), ms(d.Start), ms(end))
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("delivery trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("delivery trace: %w", err)
	}
	return nil
}
