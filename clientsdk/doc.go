// Package clientsdk is LuffyMQ's Go client SDK, built on paho.golang's
// autopaho: a load-reporting shared-subscription Subscriber, a Publisher,
// and a drift-free ServiceEmulator for benchmarks and demos.
//
// A Subscriber joins the shared group $share/<group>/<filter>, runs a
// Handler on a fixed number of workers and tells the broker how loaded it
// is: pending messages, mean processing time and its own estimate of the
// wait before a new message would start (see package report for the wire
// format). Reports travel in extended PINGREQs by default, or as PUBLISHes
// to report.LoadTopic, which any broker accepts. A load-aware broker such as
// LuffyMQ uses them to send each message to the member that will start it
// soonest.
//
// Information is latency: while the broker does not know how fast members
// are it can only guess, and at high utilisation the backlog built in that
// blind time never drains. So the Subscriber reports as soon as it has
// measured its first processing time, whenever its pending count jumps
// (at most every 100 ms), when it goes idle after receiving work since its
// last report (at most every 10 ms), and otherwise every report interval,
// which it takes from the broker's CONNACK unless configured.
//
// An application that keeps its own autopaho (or paho) client reports its
// load with a LoadReporter instead: LoadReporter.Adopt sets its Pinger on
// the autopaho.ClientConfig and measures the OnPublishReceived handlers;
// Received, Start and Done report messages processed off paho's goroutine.
// A Subscriber can also be built from an existing autopaho.ClientConfig
// (SubscriberConfig.Autopaho), keeping its Will message, TLS, WebSocket,
// session and callbacks, and join several groups on one connection.
//
// Against a broker that closes the connection on an extended PINGREQ, or
// leaves it unanswered, the Subscriber switches to PUBLISH reports for the
// rest of its life and logs it once. (Mosquitto 2.0.11 and vanilla Mochi
// answer extended PINGREQs and ignore the payload.)
package clientsdk
