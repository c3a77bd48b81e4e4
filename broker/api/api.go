// Package api holds the JSON bodies of luffymq's HTTP API (GET /api/v1/…
// and the /api/v1/events stream). It imports nothing but the standard
// library, so a client such as luffy-controller decodes what a broker
// serves without linking the broker. Field names are the API's stable
// contract: durations are in milliseconds (…_ms), times in Unix
// milliseconds (time_ms) or RFC 3339, and counters count since the broker
// started.
package api

// GroupsResponse is the body of GET /api/v1/groups.
type GroupsResponse struct {
	Groups []GroupStatus `json:"groups"`
}

// GroupStatus describes one shared group.
type GroupStatus struct {
	Filter   string         `json:"filter"`
	Strategy string         `json:"strategy"`
	Members  []MemberStatus `json:"members"`
}

// MemberStatus describes one member of a shared group. Durations are in
// milliseconds; LastReportAgeMs is null until the member reports.
type MemberStatus struct {
	ClientID         string   `json:"client_id"`
	Online           bool     `json:"online"`
	Stale            bool     `json:"stale"`
	Selections       uint64   `json:"selections"`
	ReportedPending  int      `json:"reported_pending"`
	ProcessingTimeMs float64  `json:"processing_time_ms"`
	ServiceTimeMs    float64  `json:"service_time_ms"`
	Workers          int      `json:"workers"`
	InFlight         int      `json:"inflight"`
	PredictedWaitMs  float64  `json:"predicted_wait_ms"`
	Reports          uint64   `json:"reports"`
	LastReportAgeMs  *float64 `json:"last_report_age_ms"`
	// Completions counts the acknowledgements the service estimate learnt
	// from; AcksAreCompletions is false once the member was found to
	// acknowledge on receipt.
	Completions        uint64 `json:"completions"`
	AcksAreCompletions bool   `json:"acks_are_completions"`
}

// OverviewResponse is the body of GET /api/v1/overview: broker-wide
// figures for the dashboard. Counters count since the broker started.
type OverviewResponse struct {
	Strategy         string  `json:"strategy"`
	ReportIntervalMs float64 `json:"report_interval_ms"`
	StaleAfterMs     float64 `json:"stale_after_ms"`
	UptimeSeconds    int64   `json:"uptime_s"`
	ClientsConnected int64   `json:"clients_connected"`
	MessagesReceived int64   `json:"messages_received"`
	MessagesSent     int64   `json:"messages_sent"`
	MessagesDropped  int64   `json:"messages_dropped"`
	ReportsAccepted  uint64  `json:"reports_accepted"`
	ReportsMalformed uint64  `json:"reports_malformed"`
	ReportsOversized uint64  `json:"reports_oversized"`
	// ConnectTimeouts counts connections closed for not sending their
	// CONNECT within the connect timeout; ConnectionsRefused those closed
	// at accept because a connection limit was reached.
	ConnectTimeouts    uint64             `json:"connect_timeouts"`
	ConnectionsRefused ConnectionsRefused `json:"connections_refused"`
	// QoS0Dropped counts QoS 0 publishes dropped for clients whose outbox
	// was full; SlowClientsDisconnected clients ended for not reading.
	QoS0Dropped             uint64 `json:"qos0_dropped_slow_client"`
	SlowClientsDisconnected uint64 `json:"slow_clients_disconnected"`
	// Redispatched counts departed members' unacknowledged messages given
	// to the rest of their group; RedispatchParked those waiting for a
	// member now.
	Redispatched     uint64 `json:"redispatched"`
	RedispatchParked int    `json:"redispatch_parked"`
}

// ConnectionsRefused counts connections closed at accept, by the limit
// that was reached.
type ConnectionsRefused struct {
	ListenerLimit uint64 `json:"listener_limit"`
	IPLimit       uint64 `json:"ip_limit"`
}

// ClientsResponse is the body of GET /api/v1/clients: one page of the
// broker's clients (connected, or disconnected with a surviving session),
// sorted by client ID.
type ClientsResponse struct {
	// Total is the number of clients on all pages.
	Total   int            `json:"total"`
	Offset  int            `json:"offset"`
	Limit   int            `json:"limit"`
	Clients []ClientStatus `json:"clients"`
}

// ClientStatus describes one client.
type ClientStatus struct {
	ClientID   string `json:"client_id"`
	Connected  bool   `json:"connected"`
	RemoteAddr string `json:"remote_addr"`
	Listener   string `json:"listener"`
	// ProtocolVersion is 3 (MQTT 3.1), 4 (3.1.1) or 5.
	ProtocolVersion int `json:"protocol_version"`
	Subscriptions   int `json:"subscriptions"`
	// InFlight counts QoS 1/2 messages not yet acknowledged.
	InFlight int `json:"inflight"`
	// Groups are the shared subscriptions ($share/…) among its
	// subscriptions, sorted.
	Groups []string `json:"groups"`
	// QoS0Dropped counts QoS 0 publishes dropped because the client did
	// not read fast enough; null when its connection does not count them.
	QoS0Dropped *uint64 `json:"qos0_dropped"`
	// WriteQueueDropped counts publishes (any QoS) dropped because the
	// client's write queue was full (--max-pending-writes); null when its
	// connection does not count them.
	WriteQueueDropped *uint64 `json:"write_queue_dropped"`
	// ConnectedSince is when its current connection established its
	// session (RFC 3339); null while disconnected.
	ConnectedSince *string `json:"connected_since"`
}

// HistoryPoint is one sample of the broker's rates. Rates are per second
// over the interval since the previous sample.
type HistoryPoint struct {
	// TimeMs is when the sample was taken, in Unix milliseconds.
	TimeMs int64 `json:"time_ms"`
	// MessagesInPerSec counts PUBLISH packets received from clients.
	MessagesInPerSec float64 `json:"msgs_in_per_s"`
	// MessagesOutPerSec counts PUBLISH packets sent to clients.
	MessagesOutPerSec float64 `json:"msgs_out_per_s"`
	// DroppedPerSec counts messages dropped for clients that could not
	// take them (Mochi's full write queue and full outboxes' QoS 0).
	DroppedPerSec float64 `json:"dropped_per_s"`
	// Members holds up to broker.MaxMemberSeries shared-group members.
	Members []MemberPoint `json:"members"`
}

// MemberPoint is one shared-group member in a HistoryPoint.
type MemberPoint struct {
	Group            string  `json:"group"`
	ClientID         string  `json:"client_id"`
	SelectionsPerSec float64 `json:"selections_per_s"`
	PredictedWaitMs  float64 `json:"predicted_wait_ms"`
}

// HistoryEvent is the data of the "history" event sent when an event
// stream opens: the samples of the last minutes, oldest first.
type HistoryEvent struct {
	IntervalMs float64        `json:"interval_ms"`
	Points     []HistoryPoint `json:"points"`
}

// SnapshotEvent is the data of a "snapshot" event, sent every
// broker.SampleInterval: the broker's figures now.
type SnapshotEvent struct {
	TimeMs   int64            `json:"time_ms"`
	Overview OverviewResponse `json:"overview"`
	Groups   []GroupStatus    `json:"groups"`
	// Rates is the newest history sample (null before the first).
	Rates *HistoryPoint `json:"rates"`
	// RejectedReports are the most recent refused load reports.
	RejectedReports []RejectedReportStatus `json:"rejected_reports"`
	// DroppingClients lists, as of the last sample, up to
	// broker.MaxDroppingClients connected clients that lost messages since they
	// connected, by reason, those that lost the most first.
	DroppingClients []ClientDrops `json:"dropping_clients"`
	// Bridge is null when the site bridge is off.
	Bridge *BridgeStatus `json:"bridge"`
}

// RejectedReportStatus is a load report the broker refused, as shown by
// GET /api/v1/rejected-reports and the event stream.
type RejectedReportStatus struct {
	TimeMs   int64  `json:"time_ms"`
	ClientID string `json:"client_id"`
	Channel  string `json:"channel"`
	Reason   string `json:"reason"`
}

// RejectedReportsResponse is the body of GET /api/v1/rejected-reports.
type RejectedReportsResponse struct {
	RejectedReports []RejectedReportStatus `json:"rejected_reports"`
}

// BridgeResponse is the body of GET /api/v1/bridge.
type BridgeResponse struct {
	// Bridge is null when the site bridge is off.
	Bridge *BridgeStatus `json:"bridge"`
}

// BridgeStatus is the site bridge as the dashboard shows it.
type BridgeStatus struct {
	Site string `json:"site"`
	// Connected is true while the bridge has a RabbitMQ connection.
	Connected   bool              `json:"connected"`
	ImportQueue string            `json:"import_queue"`
	Exports     []string          `json:"exports"`
	Exchanges   []BridgeExchange  `json:"exchanges"`
	Bindings    []BridgeBinding   `json:"bindings"`
	WorkQueues  []BridgeWorkQueue `json:"work_queues"`
	// FederationLinks are read from the site's RabbitMQ management API
	// every 10 s; null without --amqp-management-url.
	FederationLinks []FederationLinkStatus `json:"federation_links"`
	// FederationError is why the last read of the links failed ("" if it
	// did not).
	FederationError string `json:"federation_error"`
	// Reconfig counts the site agent's loss-free moves of federation links
	// and what the removed links held (see bridge.ReconfigStats).
	Reconfig BridgeReconfig `json:"reconfig"`
}

// BridgeReconfig is bridge.ReconfigStats as the API shows it.
type BridgeReconfig struct {
	// Moves counts configuration messages that removed links;
	// LinksAdded and LinksRemoved the links they changed.
	Moves        uint64 `json:"moves"`
	LinksAdded   uint64 `json:"links_added"`
	LinksRemoved uint64 `json:"links_removed"`
	// RequestsSent counts conservation requests delivered to the
	// upstreams of removed links, RequestsPending those waiting for an
	// unreachable upstream, RequestsHandled those this site's node served.
	RequestsSent    uint64 `json:"conservation_requests_sent"`
	RequestsPending int64  `json:"conservation_requests_pending"`
	RequestsHandled uint64 `json:"conservation_requests_handled"`
	// Conserved and Discarded count messages removed links left on this
	// site's node: re-published into their exchange, or deleted
	// (--federation-discard-held).
	Conserved uint64 `json:"held_conserved"`
	Discarded uint64 `json:"held_discarded"`
}

// BridgeExchange is a pub/sub exchange: messages this site exported to it
// and imported from it (from other sites), in total and per second.
type BridgeExchange struct {
	Name             string  `json:"name"`
	Exported         uint64  `json:"exported"`
	Imported         uint64  `json:"imported"`
	ExportedPerSec   float64 `json:"exported_per_s"`
	ImportedPerSec   float64 `json:"imported_per_s"`
	ImportedBindings int     `json:"import_bindings"`
}

// BridgeBinding is one binding of the site's import queue.
type BridgeBinding struct {
	Exchange string `json:"exchange"`
	Key      string `json:"key"`
}

// BridgeWorkQueue is an exported shared group's work queue at this site.
type BridgeWorkQueue struct {
	Group string `json:"group"`
	// Depth is the queue length the site computed at its last retune
	// (messages it expects in wq.<group>).
	Depth     int     `json:"depth"`
	MaxLength int     `json:"max_length"`
	TTLMs     float64 `json:"ttl_ms"`
	Weight    int     `json:"weight"`
	// Taken from RabbitMQ: from wq.<group>, from the site's own overflow,
	// from other sites' overflow (FromSite splits the last by site).
	Local       uint64 `json:"local"`
	OwnOverflow uint64 `json:"own_overflow"`
	// OverflowAtPublish counts local publishes sent to the dead-letter
	// exchange at once (the members would not start them within the TTL).
	OverflowAtPublish uint64 `json:"overflow_at_publish"`
	// RoutedTo counts, by site, local publishes sent straight to another
	// site that would start them sooner (--wq-route nearest);
	// StatesFresh counts the other sites whose group state is fresh;
	// StatesWanted is true while the broker asks for their states (they
	// come on demand: a site that keeps up hears none).
	RoutedTo       map[string]uint64 `json:"routed_to"`
	StatesFresh    int               `json:"states_fresh"`
	StatesWanted   bool              `json:"states_wanted"`
	FromOtherSites uint64            `json:"from_other_sites"`
	FromSite       map[string]uint64 `json:"from_site"`
	Completed      uint64            `json:"completed"`
	Requeued       uint64            `json:"requeued"`
	Duplicates     uint64            `json:"duplicates"`
}

// FederationLinkStatus is one federation link of the site's RabbitMQ.
type FederationLinkStatus struct {
	Upstream string `json:"upstream"`
	Exchange string `json:"exchange"`
	Status   string `json:"status"`
	Error    string `json:"error"`
}

// ClientDrops is what one connected client lost since it connected.
type ClientDrops struct {
	ClientID string `json:"client_id"`
	// WriteQueueFull counts publishes dropped because the client's write
	// queue was full (--max-pending-writes), any QoS.
	WriteQueueFull uint64 `json:"write_queue_full"`
	// QoS0OutboxFull counts QoS 0 publishes dropped because the client's
	// unsent bytes were over --max-queued-bytes.
	QoS0OutboxFull uint64 `json:"qos0_outbox_full"`
}

// Total is everything the client lost, whatever the reason.
func (d ClientDrops) Total() uint64 { return d.WriteQueueFull + d.QoS0OutboxFull }
