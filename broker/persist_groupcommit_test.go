package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// syncRecorder replaces a journal's syncFile. Before each sync it notes
// what the file holds at that moment (a segment's size, a directory's
// entries); once the sync succeeds, everything noted is on disk. It can
// delay, hold or fail syncs.
type syncRecorder struct {
	delay time.Duration
	// before, if set, runs before each sync of a segment file (not of
	// the directory) with the call's number, from 1; a non-nil error is
	// returned instead of syncing.
	before func(call int, f *os.File) error

	mu        sync.Mutex
	fileSyncs int
	dirSyncs  int
	durable   map[string]int64    // segment path → size covered by a successful sync
	dirNames  map[string]struct{} // entries covered by a successful directory sync
}

func newSyncRecorder() *syncRecorder {
	return &syncRecorder{durable: map[string]int64{}, dirNames: map[string]struct{}{}}
}

func (r *syncRecorder) sync(f *os.File) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.IsDir() {
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.dirSyncs++
		for _, n := range names {
			r.dirNames[n] = struct{}{}
		}
		return nil
	}
	r.mu.Lock()
	r.fileSyncs++
	call := r.fileSyncs
	r.mu.Unlock()
	if r.before != nil {
		if err := r.before(call, f); err != nil {
			return err
		}
	}
	time.Sleep(r.delay)
	if err := f.Sync(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.durable[f.Name()] = max(r.durable[f.Name()], info.Size())
	return nil
}

// covers says whether a successful sync began after the record ending at
// pos was written, to its file and to the directory.
func (r *syncRecorder) covers(pos journalRecordPosition) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.durable[pos.path]; got < pos.end {
		return fmt.Errorf("record ends at %d of %s, synced only up to %d", pos.end, filepath.Base(pos.path), got)
	}
	if _, ok := r.dirNames[filepath.Base(pos.path)]; !ok {
		return fmt.Errorf("directory entry of %s never synced", filepath.Base(pos.path))
	}
	return nil
}

func (r *syncRecorder) segmentSyncs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fileSyncs
}

func journalTestMessage(payload string) *storage.Message {
	return &storage.Message{TopicName: "t", Payload: []byte(payload), FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}}
}

// awaitClosed fails the test unless ch is closed within five seconds.
func awaitClosed(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
	}
}

// waitersOf is how many adds wait for a sync.
func waitersOf(j *publishJournal) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.waiters)
}

// TestPublishJournalGroupCommit: many goroutines add at once to an fsync
// journal whose segments are small (so it rolls over to new files while
// they add). Each add returns only after a sync that began once its record
// was written, of its segment file and of the directory entry of that file;
// the syncs are far fewer than the records; every record is there at reopen.
func TestPublishJournalGroupCommit(t *testing.T) {
	dir := t.TempDir()
	j, _, err := openPublishJournal(dir, 4096, true)
	require.NoError(t, err)
	rec := newSyncRecorder()
	rec.delay = time.Millisecond
	j.syncFile = rec.sync

	const adders, each = 32, 16
	var wg sync.WaitGroup
	errs := make(chan error, adders*each)
	for a := range adders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, pos, err := j.addRecord(journalTestMessage(fmt.Sprintf("a%d-%d", a, i)))
				if err == nil {
					err = rec.covers(pos)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	stats := j.syncStats()
	records := adders * each
	t.Logf("%d records, %d group syncs (%d segment file syncs, %d directory syncs)", records, stats.Syncs, rec.segmentSyncs(), rec.dirSyncs)
	require.Less(t, stats.Syncs, uint64(records), "no sync was shared")
	require.Zero(t, stats.Failed)
	require.Equal(t, stats.Written, stats.SyncedBytes, "the last add returned before the end of the journal was synced")
	nums, err := journalSegmentNumbers(dir)
	require.NoError(t, err)
	require.Greater(t, len(nums), 2, "the journal never rolled over to a new segment")
	require.Equal(t, records, j.pendingCount())
	require.NoError(t, j.Close())

	j2, pending, err := openPublishJournal(dir, 4096, true)
	require.NoError(t, err)
	require.Len(t, pending, records)
	require.NoError(t, j2.Close())
}

// TestPublishJournalSyncErrorReachesEveryWaiter: a failed sync is returned
// to every add it was to cover, and to no other; those publishes are
// forgotten (not published again at the next start), the failed segment
// takes no more records, and later adds succeed in a new segment.
func TestPublishJournalSyncErrorReachesEveryWaiter(t *testing.T) {
	dir := t.TempDir()
	j, _, err := openPublishJournal(dir, 0, true)
	require.NoError(t, err)
	rec := newSyncRecorder()
	injected := fmt.Errorf("injected: %w", syscall.EIO)
	firstSyncing := make(chan struct{})
	releaseFirst := make(chan struct{})
	rec.before = func(call int, _ *os.File) error {
		switch call {
		case 1:
			close(firstSyncing)
			<-releaseFirst
			return nil
		case 2:
			return injected
		}
		return nil
	}
	j.syncFile = rec.sync

	// The first add leads the first sync, which is held.
	firstDone := make(chan error, 1)
	var firstPos journalRecordPosition
	go func() {
		var err error
		_, firstPos, err = j.addRecord(journalTestMessage("first"))
		firstDone <- err
	}()
	awaitClosed(t, firstSyncing, "the first add never synced")

	// These are written while it is held, so the second sync covers them.
	const covered = 8
	results := make(chan error, covered)
	for i := range covered {
		go func() {
			_, _, err := j.addRecord(journalTestMessage(fmt.Sprintf("covered-%d", i)))
			results <- err
		}()
	}
	eventually(t, 5*time.Second, func() bool { return waitersOf(j) == covered+1 }, "the adds did not all wait")
	close(releaseFirst)

	select {
	case err := <-firstDone:
		require.NoError(t, err, "the first sync succeeded; its add must not see the second one's error")
	case <-time.After(5 * time.Second):
		t.Fatal("the first add never returned")
	}
	for range covered {
		select {
		case err := <-results:
			require.ErrorIs(t, err, syscall.EIO, "an add covered by the failed sync did not get its error")
		case <-time.After(5 * time.Second):
			t.Fatal("an add covered by the failed sync never returned")
		}
	}
	stats := j.syncStats()
	require.Equal(t, uint64(2), stats.Syncs)
	require.Equal(t, uint64(1), stats.Failed)
	require.Equal(t, 1, j.pendingCount(), "refused publishes are still held")

	// The next add goes to a new segment and succeeds.
	_, pos, err := j.addRecord(journalTestMessage("after"))
	require.NoError(t, err)
	require.NotEqual(t, firstPos.path, pos.path, "the segment whose sync failed took another record")
	require.NoError(t, rec.covers(pos))
	require.NoError(t, j.Close())

	j2, pending, err := openPublishJournal(dir, 0, true)
	require.NoError(t, err)
	var payloads []string
	for _, e := range pending {
		payloads = append(payloads, string(e.Message.Payload))
	}
	require.Equal(t, []string{"first", "after"}, payloads, "what the journal gives back at the next start")
	require.NoError(t, j2.Close())
}

// TestPublishJournalCloseReleasesWaiters: Close waits for a sync under way,
// syncs what adds still wait for, and returns them all; nothing keeps
// running and later adds fail.
func TestPublishJournalCloseReleasesWaiters(t *testing.T) {
	dir := t.TempDir()
	j, _, err := openPublishJournal(dir, 0, true)
	require.NoError(t, err)
	rec := newSyncRecorder()
	syncing := make(chan struct{})
	release := make(chan struct{})
	rec.before = func(call int, _ *os.File) error {
		if call == 1 {
			close(syncing)
			<-release
		}
		return nil
	}
	j.syncFile = rec.sync

	const adders = 6
	type result struct {
		pos journalRecordPosition
		err error
	}
	results := make(chan result, adders)
	add := func(i int) {
		_, pos, err := j.addRecord(journalTestMessage(fmt.Sprintf("m%d", i)))
		results <- result{pos, err}
	}
	go add(0)
	awaitClosed(t, syncing, "the first add never synced")
	for i := 1; i < adders; i++ {
		go add(i)
	}
	eventually(t, 5*time.Second, func() bool { return waitersOf(j) == adders }, "the adds did not all wait")

	closed := make(chan error, 1)
	go func() { closed <- j.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a sync was under way", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close never returned")
	}
	for range adders {
		select {
		case r := <-results:
			require.NoError(t, r.err)
			require.NoError(t, rec.covers(r.pos))
		case <-time.After(5 * time.Second):
			t.Fatal("an add waiting at Close never returned")
		}
	}
	_, err = j.add(journalTestMessage("late"))
	require.True(t, errors.Is(err, errJournalClosed), "add after Close: %v", err)
	require.Zero(t, waitersOf(j))
}

// TestPersistFsyncGroupCommitBroker: a broker with --fsync and four
// publishers on their own connections acknowledges every publish with
// fewer journal syncs than publishes, and every PUBACK follows a journal
// sync that began after its publish was sent (TestPublishJournalGroupCommit
// checks that the sync covers the very record).
func TestPersistFsyncGroupCommitBroker(t *testing.T) {
	dir := t.TempDir()
	rec := newSyncRecorder()
	rec.delay = 2 * time.Millisecond
	b := startPersistentBrokerSync(t, dir, true, func(b *Broker) { b.persist.journal.syncFile = rec.sync })

	const publishers, each = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, publishers*each)
	for p := range publishers {
		pub := connectPaho(t, b.MQTTAddr(), fmt.Sprintf("group-pub-%d", p), nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				before := b.persist.journal.syncStats().Written
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := pub.Publish(ctx, &paho.Publish{Topic: persistTopic, QoS: 1, Payload: []byte(fmt.Sprintf("p%d-%d", p, i))})
				cancel()
				if err == nil && resp.ReasonCode >= 0x80 {
					err = fmt.Errorf("PUBACK reason code 0x%02x", resp.ReasonCode)
				}
				// A sync that covered the journal past before began
				// after the publish was sent.
				if err == nil {
					if synced := b.persist.journal.syncStats().SyncedBytes; synced <= before {
						err = fmt.Errorf("PUBACK before a sync covered the record: synced %d, journal was %d before the publish", synced, before)
					}
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	stats := b.persist.journal.syncStats()
	t.Logf("%d publishes acknowledged after %d journal syncs", publishers*each, stats.Syncs)
	require.Less(t, stats.Syncs, uint64(publishers*each), "no journal sync was shared")
	require.Zero(t, stats.Failed)
}
