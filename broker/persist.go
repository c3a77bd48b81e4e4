package broker

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	badgerdb "github.com/dgraph-io/badger/v4"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/hooks/storage/badger"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/hooks"
)

// Persistence (--data-dir) keeps sessions, subscriptions, retained messages
// and in-flight QoS 1/2 messages across restarts. It has two parts, both
// Mochi hooks:
//
//   - Mochi's Badger storage hook, in DataDir/store. It writes on Mochi's
//     hook events (session established, subscribed, retained, each QoS
//     delivery and its completion) and Mochi reads it back at Serve. Badger
//     is opened with SyncWrites off unless --fsync: a write returns once
//     it is copied into Badger's memory-mapped log, that is into the
//     operating system's page cache, which a killed process does not lose
//     (a power cut can). With --fsync every write is synced to disk.
//   - the publish journal (persist_journal.go), in DataDir/journal, which
//     covers the moment Mochi has acknowledged a publish but not yet stored
//     the subscribers' copies. With --fsync each accepted publish is synced
//     to disk before the publisher's PUBACK (its "done" record is not: a
//     done record lost to a power cut only delivers the publish again).
//     Concurrent publishers share their syncs (group commit): one fsync
//     covers every record written before it began.
//
// Badger batches concurrent writes itself, one value-log write and one sync
// per batch, so its SyncWrites is a group commit too. It stays on with
// --fsync: a subscriber's in-flight copy must be on disk before the
// journal's done record for the publish, which an unsynced write can reach
// the disk ahead of.
//
// persistStoreDir and persistJournalDir name the two parts inside DataDir.
const (
	persistStoreDir   = "store"
	persistJournalDir = "journal"
)

// persistence is the storage of a broker with a data directory.
type persistence struct {
	store   *orderedStore
	journal *publishJournal
	hook    *journalHook
	log     *slog.Logger

	closeOnce sync.Once
}

// prepareDataDir creates dir if needed and checks that the broker can
// write in it.
func prepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: data-dir %s: %w", ErrInvalidConfig, dir, err)
	}
	probe, err := os.CreateTemp(dir, ".write-test-*")
	if err != nil {
		return fmt.Errorf("%w: data-dir %s is not writable: %w", ErrInvalidConfig, dir, err)
	}
	name := probe.Name()
	_ = probe.Close()
	_ = os.Remove(name)
	return nil
}

// badgerOptions are Badger's defaults with smaller memory tables and value
// log files: a broker's records are small, and the defaults (64 MiB tables,
// 1 GiB log files, 256 MiB block cache) are sized for databases.
func badgerOptions(dir string, fsync bool) *badgerdb.Options {
	opts := badgerdb.DefaultOptions(dir).
		WithSyncWrites(fsync).
		WithMemTableSize(16 << 20).
		WithValueLogFileSize(64 << 20).
		WithBlockCacheSize(16 << 20).
		WithIndexCacheSize(8 << 20).
		WithNumVersionsToKeep(1)
	return &opts
}

// attachPersistence opens the store and the journal in dataDir and adds
// their hooks to server. Call it after every other hook that provides
// OnPublish, so the journal records the publish as they left it.
func attachPersistence(server *mqtt.Server, dataDir string, fsync bool, order *hooks.DeliveryOrder, log *slog.Logger) (*persistence, error) {
	p := &persistence{store: &orderedStore{Hook: new(badger.Hook), order: order}, log: log}
	if err := server.AddHook(p.store, &badger.Options{
		Path:    filepath.Join(dataDir, persistStoreDir),
		Options: badgerOptions(filepath.Join(dataDir, persistStoreDir), fsync),
	}); err != nil {
		return nil, fmt.Errorf("%w: data-dir %s: opening the store: %w", ErrInvalidConfig, dataDir, err)
	}
	journal, pending, err := openPublishJournal(filepath.Join(dataDir, persistJournalDir), 0, fsync)
	if err != nil {
		_ = p.store.Stop()
		return nil, fmt.Errorf("%w: data-dir %s: %w", ErrInvalidConfig, dataDir, err)
	}
	p.journal = journal
	p.hook = &journalHook{journal: journal, server: server, pending: pending, inProgress: map[string]uint64{}, replayed: make(chan struct{})}
	if len(pending) == 0 {
		p.hook.endReplay()
	}
	if err := server.AddHook(p.hook, nil); err != nil {
		_ = journal.Close()
		_ = p.store.Stop()
		return nil, fmt.Errorf("adding publish journal hook: %w", err)
	}
	if len(pending) > 0 {
		log.Info("publish journal holds publishes accepted before the last stop; they are published again at start", "count", len(pending))
	}
	return p, nil
}

// close stops the store and the journal. Mochi's server.Close stops them
// too (it stops every hook); close is for a broker that never started.
func (p *persistence) close() error {
	var err error
	p.closeOnce.Do(func() {
		err = errors.Join(p.journal.Close(), p.store.Stop())
	})
	return err
}

// journalHook records each QoS 1/2 publish from a client in the publish
// journal before Mochi acknowledges it, forgets it after Mochi has handed it
// to every subscriber, and at start publishes again what the journal held.
type journalHook struct {
	mqtt.HookBase
	journal *publishJournal
	server  *mqtt.Server

	mu sync.Mutex
	// inProgress maps a client to the journal entry of the publish Mochi
	// is processing for it. Mochi processes one client's packets one at a
	// time, so a client has at most one.
	inProgress map[string]uint64
	// pending are the publishes the journal held at open.
	pending []journalEntry
	// replayed is closed once pending has been published again (or the
	// journal closed); connections wait for it (see OnConnect).
	replayed   chan struct{}
	replayOnce sync.Once
}

// endReplay lets waiting connections proceed.
func (h *journalHook) endReplay() { h.replayOnce.Do(func() { close(h.replayed) }) }

// ID names the hook.
func (h *journalHook) ID() string { return "luffymq-publish-journal" }

// Provides says which events the hook handles.
func (h *journalHook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnect, mqtt.OnPublish, mqtt.OnPublished, mqtt.OnDisconnect, mqtt.OnStarted}, []byte{b})
}

// OnConnect holds a connecting client until the journal's publishes have
// been published again. Mochi 2.7.9 accepts connections before it calls
// OnStarted, and a session resumed while a replayed publish is delivered to
// it can lose the publish: Mochi copies the old session's in-flight
// messages to the new connection and then clears the old ones, so a
// delivery to the old session in between is on neither (a kill -9 test
// lost exactly that message in CI). With an empty journal nothing waits.
func (h *journalHook) OnConnect(*mqtt.Client, packets.Packet) error {
	<-h.replayed
	return nil
}

// OnPublish records a client's QoS 1/2 publish. Mochi calls it before it
// writes the PUBACK or PUBREC. If the record cannot be written the publish
// is refused: an MQTT v5 client gets a PUBACK with reason code 0x80, an
// older one no acknowledgement (it sends the publish again).
func (h *journalHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Qos == 0 || cl.Net.Inline {
		return pk, nil // no acknowledgement to keep a promise for
	}
	msg := journalMessage(cl.ID, pk)
	seq, err := h.journal.add(&msg)
	if err != nil {
		h.Log.Error("publish journal write failed; publish refused", "client", cl.ID, "topic", pk.TopicName, "error", err)
		if cl.Properties.ProtocolVersion == 5 {
			return pk, packets.ErrUnspecifiedError
		}
		return pk, packets.ErrRejectPacket
	}
	h.mu.Lock()
	previous, had := h.inProgress[cl.ID]
	h.inProgress[cl.ID] = seq
	h.mu.Unlock()
	if had {
		// Mochi abandoned the client's previous publish (the
		// acknowledgement could not be written); the client sends it again.
		h.finish(previous)
	}
	return pk, nil
}

// OnPublished forgets the publish: Mochi has handed it to every subscriber
// and the store has recorded their in-flight copies.
func (h *journalHook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Qos == 0 || cl.Net.Inline {
		return
	}
	h.forgetClient(cl.ID)
}

// OnDisconnect forgets a publish Mochi abandoned when the client's
// connection failed during it.
func (h *journalHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.forgetClient(cl.ID)
}

func (h *journalHook) forgetClient(id string) {
	h.mu.Lock()
	seq, ok := h.inProgress[id]
	delete(h.inProgress, id)
	h.mu.Unlock()
	if ok {
		h.finish(seq)
	}
}

func (h *journalHook) finish(seq uint64) {
	if err := h.journal.done(seq); err != nil && !errors.Is(err, errJournalClosed) {
		h.Log.Error("publish journal write failed", "error", err)
	}
}

// OnStarted publishes again what the journal held at open. Mochi calls it
// after it has restored clients, subscriptions and in-flight messages from
// the store, so the publishes reach the restored sessions. Their retain
// flag is cleared: Mochi stores a retained message before acknowledging it.
func (h *journalHook) OnStarted() {
	defer h.endReplay()
	h.mu.Lock()
	pending := h.pending
	h.pending = nil
	h.mu.Unlock()
	if len(pending) == 0 {
		_ = h.journal.forgetRecovered()
		return
	}
	replay := h.server.NewClient(nil, "local", "luffymq-journal-replay", true)
	replay.Properties.ProtocolVersion = 5
	failed := 0
	for _, e := range pending {
		pk := e.Message.ToPacket()
		pk.FixedHeader.Type = packets.Publish
		pk.FixedHeader.Retain = false
		pk.FixedHeader.Dup = false
		pk.PacketID = 1 // Mochi's validation wants one for QoS > 0; an inline publish never uses it
		if err := h.server.InjectPacket(replay, pk); err != nil {
			failed++
			h.Log.Error("publishing a journaled message again failed", "topic", pk.TopicName, "error", err)
		}
	}
	h.Log.Info("published again the publishes the journal held", "count", len(pending), "failed", failed)
	if failed > 0 {
		return // keep the old segments for the next start
	}
	if err := h.journal.forgetRecovered(); err != nil {
		h.Log.Error("removing replayed journal segments", "error", err)
	}
}

// Stop closes the journal (Mochi stops every hook in server.Close).
func (h *journalHook) Stop() error {
	h.endReplay()
	return h.journal.Close()
}

// orderedStore is Mochi's Badger storage hook, keeping with each in-flight
// delivery its place in the client's delivery order, so that a session
// resumed after a restart gets its messages in the order they were
// delivered (see hooks.DeliveryOrder). The place is stored in the record's
// Sent field, which Mochi writes but never reads back.
type orderedStore struct {
	*badger.Hook
	order *hooks.DeliveryOrder
}

// OnQosPublish stores the delivery with its sequence number.
func (s *orderedStore) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, resends int) {
	if pk.FixedHeader.Type == packets.Publish {
		if seq, ok := s.order.Seq(cl.ID, pk.PacketID); ok {
			sent = int64(seq)
		}
	}
	s.Hook.OnQosPublish(cl, pk, sent, resends)
}

// OnQosDropped deletes a dropped delivery from the store, except one
// dropped from a client object taken over by a connection resuming the
// session: Mochi 2.7.9 drops the old object's deliveries after copying them
// to the new one, under the same client ID and packet identifiers, that is
// the same store keys, and stores them again only when it resends them;
// deleting them would leave a moment in which a crash loses them.
func (s *orderedStore) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	s.Hook.OnQosDropped(cl, pk)
}

// StoredInflightMessages returns the stored in-flight messages for Mochi
// to load, and restores their delivery order.
func (s *orderedStore) StoredInflightMessages() ([]storage.Message, error) {
	msgs, err := s.Hook.StoredInflightMessages()
	if err != nil {
		return msgs, err
	}
	byOrder := slices.Clone(msgs)
	slices.SortStableFunc(byOrder, func(a, b storage.Message) int { return cmp.Compare(a.Sent, b.Sent) })
	for _, m := range byOrder {
		if m.FixedHeader.Type == packets.Publish && m.Sent > 0 {
			s.order.Restore(m.Client, m.PacketID, uint64(m.Sent))
		}
	}
	return msgs, nil
}
