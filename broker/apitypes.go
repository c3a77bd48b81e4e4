package broker

import "github.com/luffymq/luffymq/broker/api"

// The bodies of the HTTP API, defined in package api so that its clients
// (luffy-controller) need not link the broker.
type (
	GroupsResponse          = api.GroupsResponse
	GroupStatus             = api.GroupStatus
	MemberStatus            = api.MemberStatus
	OverviewResponse        = api.OverviewResponse
	ConnectionsRefused      = api.ConnectionsRefused
	ClientsResponse         = api.ClientsResponse
	ClientStatus            = api.ClientStatus
	HistoryPoint            = api.HistoryPoint
	MemberPoint             = api.MemberPoint
	HistoryEvent            = api.HistoryEvent
	SnapshotEvent           = api.SnapshotEvent
	RejectedReportStatus    = api.RejectedReportStatus
	RejectedReportsResponse = api.RejectedReportsResponse
	BridgeResponse          = api.BridgeResponse
	BridgeStatus            = api.BridgeStatus
	BridgeReconfig          = api.BridgeReconfig
	BridgeExchange          = api.BridgeExchange
	BridgeBinding           = api.BridgeBinding
	BridgeWorkQueue         = api.BridgeWorkQueue
	FederationLinkStatus    = api.FederationLinkStatus
	ClientDrops             = api.ClientDrops
)
