package broker

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/luffymq/luffymq/broker/pingreq"
)

// Paging of GET /api/v1/clients.
const (
	// DefaultClientsLimit is the page size when ?limit= is absent.
	DefaultClientsLimit = 100
	// MaxClientsLimit is the largest page size accepted.
	MaxClientsLimit = 1000
)

// writeStatsSource is implemented by connections that count what their
// outbox dropped (broker/pingreq.Conn).
type writeStatsSource interface {
	WriteStats() pingreq.WriteStats
}

// Clients returns the page of clients starting at offset (clamped to
// [0, total]) with at most limit entries (clamped to [1, MaxClientsLimit]).
func (b *Broker) Clients(offset, limit int) ClientsResponse {
	limit = min(max(limit, 1), MaxClientsLimit)
	all := b.server.Clients.GetAll()
	ids := make([]string, 0, len(all))
	for id, cl := range all {
		if !cl.Net.Inline {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	offset = min(max(offset, 0), len(ids))
	end := min(offset+limit, len(ids))
	resp := ClientsResponse{Total: len(ids), Offset: offset, Limit: limit, Clients: make([]ClientStatus, 0, end-offset)}
	for _, id := range ids[offset:end] {
		resp.Clients = append(resp.Clients, b.clientStatus(all[id]))
	}
	return resp
}

func (b *Broker) clientStatus(cl *mqtt.Client) ClientStatus {
	subs := cl.State.Subscriptions.GetAll()
	s := ClientStatus{
		ClientID:        cl.ID,
		Connected:       !cl.Closed(),
		RemoteAddr:      cl.Net.Remote,
		Listener:        cl.Net.Listener,
		ProtocolVersion: int(cl.Properties.ProtocolVersion),
		Subscriptions:   len(subs),
		InFlight:        cl.State.Inflight.Len(),
		Groups:          []string{},
	}
	for filter := range subs {
		if mqtt.IsSharedFilter(filter) {
			s.Groups = append(s.Groups, filter)
		}
	}
	sort.Strings(s.Groups)
	if ws, ok := cl.Net.Conn.(writeStatsSource); ok {
		st := ws.WriteStats()
		s.QoS0Dropped, s.WriteQueueDropped = &st.DroppedQoS0, &st.DroppedWriteQueue
	}
	if since, ok := b.live.sessions.connectedSince(cl); ok && s.Connected {
		t := since.UTC().Format(time.RFC3339)
		s.ConnectedSince = &t
	}
	return s
}

// serveClients answers GET /api/v1/clients?offset=&limit=.
func (b *Broker) serveClients(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	param := func(name string, def int) (int, bool) {
		v := q.Get(name)
		if v == "" {
			return def, true
		}
		n, err := strconv.Atoi(v)
		return n, err == nil && n >= 0
	}
	offset, ok1 := param("offset", 0)
	limit, ok2 := param("limit", DefaultClientsLimit)
	if !ok1 || !ok2 || limit == 0 || limit > MaxClientsLimit {
		http.Error(w, "offset must be a number ≥ 0 and limit a number from 1 to "+strconv.Itoa(MaxClientsLimit), http.StatusBadRequest)
		return
	}
	writeStatusJSON(w, b.Clients(offset, limit))
}

// writeStatusJSON writes v as an indented JSON response.
func writeStatusJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
