package shared

import (
	"fmt"
	"strings"
)

// Subscriber kinds accepted by --subscriber: how the shared-subscription
// members of a live run are written (docs/scenarios.md, "Subscriber kinds").
const (
	// KindSDK is LuffyMQ's Go SDK subscriber (clientsdk.Subscriber), which
	// reports early and with its extra keys.
	KindSDK = "sdk"
	// KindThesisReporter is a plain paho.golang client that sends extended
	// PINGREQs carrying only the two thesis keys, every report interval and
	// once right after its first processed message.
	KindThesisReporter = "thesis-reporter"
	// KindTimerReporter is the same client reporting on the timer only, as
	// the thesis's Java client did.
	KindTimerReporter = "timer-reporter"
	// KindReceiptReporter is KindThesisReporter timing each message from
	// its receipt to its end, its wait in the client's own FIFO included,
	// as a client written from the paper may.
	KindReceiptReporter = "receipt-reporter"
	// KindPahoQoS1AckAfter is a plain paho.golang client at QoS 1 that
	// acknowledges each message after processing it and sends no load
	// reports at all (plain PINGREQs).
	KindPahoQoS1AckAfter = "paho-qos1-ackafter"
)

// SubscriberKinds lists every subscriber kind in report order.
var SubscriberKinds = []string{KindSDK, KindThesisReporter, KindTimerReporter, KindReceiptReporter, KindPahoQoS1AckAfter}

// sendsThesisReports says whether members of kind send thesis-format load
// reports (the two keys only, every report interval).
func sendsThesisReports(kind string) bool {
	return kind == KindThesisReporter || kind == KindTimerReporter || kind == KindReceiptReporter
}

// ParseSubscriberKinds turns a comma-separated list ("all" means every
// kind; empty means sdk) into kinds in report order, without duplicates.
func ParseSubscriberKinds(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return []string{KindSDK}, nil
	}
	if list == "all" {
		return append([]string(nil), SubscriberKinds...), nil
	}
	want := map[string]bool{}
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if kindOrder(f) == len(SubscriberKinds) {
			return nil, fmt.Errorf("unknown subscriber kind %q; choose from %s or all", f, strings.Join(SubscriberKinds, ", "))
		}
		want[f] = true
	}
	var out []string
	for _, k := range SubscriberKinds {
		if want[k] {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--subscriber %q names no kind", list)
	}
	return out, nil
}

// kindOrder returns the position of kind in SubscriberKinds, or
// len(SubscriberKinds) for an unknown one.
func kindOrder(kind string) int {
	for i, k := range SubscriberKinds {
		if k == kind {
			return i
		}
	}
	return len(SubscriberKinds)
}

// normKind maps the empty kind of results written before kinds existed to
// KindSDK, the only subscriber then.
func normKind(kind string) string {
	if kind == "" {
		return KindSDK
	}
	return kind
}

// kindQoS is the QoS a scenario runs at with subscribers of kind: the
// scenario's own, except that paho-qos1-ackafter always uses QoS 1 (for
// the subscription and the publisher).
func kindQoS(s Scenario, kind string) byte {
	if kind == KindPahoQoS1AckAfter {
		return 1
	}
	return s.QoS
}

// kindDescription describes a subscriber kind for summaries.
func kindDescription(kind string) string {
	switch kind {
	case KindSDK:
		return "LuffyMQ Go SDK subscribers (clientsdk.Subscriber: reports as soon as it has a first measurement and whenever its pending count jumps, with its extra keys, by extended PINGREQ)"
	case KindThesisReporter:
		return "plain paho.golang clients with their own FIFO and one worker, sending extended PINGREQs with only msgsInQueue and processingTimePerMsg every report interval and once right after the first processed message"
	case KindTimerReporter:
		return "plain paho.golang clients with their own FIFO and one worker, sending extended PINGREQs with only msgsInQueue and processingTimePerMsg every report interval (timer only, as the thesis's Java client)"
	case KindReceiptReporter:
		return "thesis-reporter clients whose processingTimePerMsg is timed from each message's receipt to its end, their own FIFO's wait included"
	case KindPahoQoS1AckAfter:
		return "plain paho.golang clients at QoS 1 (subscription and publisher) with manual acknowledgement after processing and no load reports (plain PINGREQs): the broker can learn only from the acknowledgements"
	}
	return kind
}
