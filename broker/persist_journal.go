package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The publish journal closes a gap in Mochi 2.7.9's order of work for an
// inbound QoS 1/2 publish: Mochi writes the PUBACK (or PUBREC) to the
// publisher first and only then fans the message out, which is when the
// storage hook records each subscriber's in-flight copy (OnQosPublish). A
// broker killed between the two has acknowledged a message that no store
// holds. The journal records the message in OnPublish, which Mochi calls
// before the acknowledgement, and forgets it in OnPublished, which Mochi
// calls after the fan-out; whatever it still holds at start-up is published
// again.
//
// A journal is a directory of segment files journal-<n>.log. Each record is
// written with one write(2), so once the call returns the record is in the
// operating system's page cache and survives the process being killed; a
// record torn by a power loss fails its checksum and ends the segment's
// replay.
//
// With fsync, add returns only once a sync (fsync(2)) that began after the
// record was written has succeeded, so the record is on disk before the
// publisher's acknowledgement. Syncs are shared (group commit): records are
// written under the journal's lock, then each adder waits; one of the
// waiters, the leader, syncs without the lock every file holding unsynced
// records, which covers every record written so far, and then releases every
// waiter whose record that sync covered. Records written during a sync wait
// for the next one, which one of them leads. There is no background
// goroutine, so nothing is left running after Close.
//
// A failed sync is returned to every adder whose record it was to cover; their
// publishes are refused and marked done. The segments it was syncing are
// retired: the next record starts a new segment file. After a failed fsync
// the kernel may have dropped the unsynced pages and a later fsync of the same
// file can succeed without them, so a record written after them to the same
// file could be acknowledged and still be unreadable at replay, behind a torn
// record.

// journalRecordAdd and journalRecordDone are the record kinds.
const (
	journalRecordAdd  byte = 'A'
	journalRecordDone byte = 'D'
)

// journalHeaderSize is a record's length (4 bytes) and CRC-32C (4 bytes).
const journalHeaderSize = 8

// journalBodyHeaderSize is a record body's kind (1 byte) and sequence
// number (8 bytes).
const journalBodyHeaderSize = 9

// maxJournalRecord bounds a record's body when reading: larger lengths are
// taken as a torn or corrupt record.
const maxJournalRecord = 300 << 20

// defaultJournalSegmentSize is the size after which a new segment is begun.
const defaultJournalSegmentSize = 8 << 20

var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// errJournalClosed is returned by writes after Close.
var errJournalClosed = errors.New("publish journal closed")

// journalEntry is a publish the journal still holds.
type journalEntry struct {
	Seq     uint64
	Message storage.Message
}

// journalSegment is one segment file of a live journal.
type journalSegment struct {
	num    uint64
	path   string
	f      *os.File
	size   int64 // bytes written
	synced int64 // bytes covered by a successful sync
	open   int   // adds in this segment not yet done
	// retired segments take no more records: a write or sync of it failed.
	retired bool
	// dropped segments have been closed and removed; a sync of one that
	// was under way fails harmlessly.
	dropped bool
}

// journalSyncWaiter is an add waiting for a sync to cover its record.
type journalSyncWaiter struct {
	end      uint64 // the journal's written offset just after the record
	resolved bool
	err      error
}

// journalSyncTarget is one file a group sync covers, with the segment it
// belongs to (nil for the journal directory) and the size it had when the
// sync began.
type journalSyncTarget struct {
	seg  *journalSegment
	f    *os.File
	size int64
}

// publishJournal is a write-ahead log of accepted QoS 1/2 publishes that
// have not yet been handed to every subscriber. It is safe for concurrent
// use.
type publishJournal struct {
	dir          string
	segmentLimit int64
	fsync        bool // sync each add to disk before add returns
	// syncFile syncs one file to disk; (*os.File).Sync unless a test
	// replaces it before the first add.
	syncFile func(*os.File) error

	mu        sync.Mutex
	closed    bool
	segs      []*journalSegment // live segments, oldest first; the last is written
	bySeq     map[uint64]*journalSegment
	nextSeq   uint64
	recovered []string // segment files from before this start, removed by forgetRecovered

	// Group commit state (fsync only), guarded by mu.
	synced      *sync.Cond           // signalled when a group sync ends
	written     uint64               // bytes written to every segment of this run
	syncing     bool                 // a leader is syncing without mu
	dirDirty    bool                 // a segment was created since the directory was last synced
	waiters     []*journalSyncWaiter // adds whose record no finished sync covered yet
	syncCount   uint64               // group syncs finished, failed ones included
	syncFailed  uint64               // group syncs that failed
	syncedBytes uint64               // written offset the last successful sync covered
}

// openPublishJournal opens (creating if needed) the journal in dir, returns
// the publishes it still held, in the order they were accepted, and starts a
// new segment for this run. The old segments stay on disk until
// forgetRecovered, so a crash while they are replayed loses nothing.
func openPublishJournal(dir string, segmentLimit int64, fsync bool) (*publishJournal, []journalEntry, error) {
	if segmentLimit <= 0 {
		segmentLimit = defaultJournalSegmentSize
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("publish journal: %w", err)
	}
	nums, err := journalSegmentNumbers(dir)
	if err != nil {
		return nil, nil, err
	}
	j := &publishJournal{dir: dir, segmentLimit: segmentLimit, fsync: fsync, bySeq: map[uint64]*journalSegment{},
		syncFile: (*os.File).Sync}
	j.synced = sync.NewCond(&j.mu)
	added := map[uint64]storage.Message{}
	var maxSeq uint64
	for _, n := range nums {
		path := j.segmentPath(n)
		err := readJournalSegment(path, func(kind byte, seq uint64, data []byte) {
			maxSeq = max(maxSeq, seq)
			switch kind {
			case journalRecordAdd:
				var msg storage.Message
				if msg.UnmarshalBinary(data) == nil {
					added[seq] = msg
				}
			case journalRecordDone:
				delete(added, seq)
			}
		})
		if err != nil {
			return nil, nil, err
		}
		j.recovered = append(j.recovered, path)
	}
	pending := make([]journalEntry, 0, len(added))
	for seq, msg := range added {
		pending = append(pending, journalEntry{Seq: seq, Message: msg})
	}
	sort.Slice(pending, func(a, b int) bool { return pending[a].Seq < pending[b].Seq })
	j.nextSeq = maxSeq + 1
	next := uint64(1)
	if len(nums) > 0 {
		next = nums[len(nums)-1] + 1
	}
	if err := j.startSegment(next); err != nil {
		return nil, nil, err
	}
	return j, pending, nil
}

// journalSegmentNumbers lists the segment numbers in dir, ascending.
func journalSegmentNumbers(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("publish journal: %w", err)
	}
	var nums []uint64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "journal-") || !strings.HasSuffix(name, ".log") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, "journal-"), ".log"), 10, 64)
		if err == nil {
			nums = append(nums, n)
		}
	}
	sort.Slice(nums, func(a, b int) bool { return nums[a] < nums[b] })
	return nums, nil
}

// readJournalSegment calls visit for each intact record of the segment at
// path. A torn or corrupt record ends the segment: nothing after it was
// acknowledged, because a publish is acknowledged only after its record
// was written whole.
func readJournalSegment(path string, visit func(kind byte, seq uint64, data []byte)) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("publish journal: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("publish journal %s: %w", path, err)
	}
	for len(data) >= journalHeaderSize {
		n := binary.LittleEndian.Uint32(data[0:4])
		sum := binary.LittleEndian.Uint32(data[4:8])
		if n < journalBodyHeaderSize || n > maxJournalRecord || int64(len(data)-journalHeaderSize) < int64(n) {
			return nil
		}
		body := data[journalHeaderSize : journalHeaderSize+int(n)]
		if crc32.Checksum(body, journalCRC) != sum {
			return nil
		}
		visit(body[0], binary.LittleEndian.Uint64(body[1:9]), body[journalBodyHeaderSize:])
		data = data[journalHeaderSize+int(n):]
	}
	return nil
}

func (j *publishJournal) segmentPath(n uint64) string {
	return filepath.Join(j.dir, fmt.Sprintf("journal-%020d.log", n))
}

// startSegment creates segment n and makes it the one written. Callers
// hold j.mu or own j exclusively.
func (j *publishJournal) startSegment(n uint64) error {
	path := j.segmentPath(n)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("publish journal: %w", err)
	}
	j.segs = append(j.segs, &journalSegment{num: n, path: path, f: f})
	// The new file's directory entry must reach the disk too before a
	// record in it is acknowledged: the next group sync syncs the
	// directory.
	j.dirDirty = j.fsync
	return nil
}

// encodeJournalRecord frames a record.
func encodeJournalRecord(kind byte, seq uint64, data []byte) []byte {
	rec := make([]byte, journalHeaderSize+journalBodyHeaderSize+len(data))
	body := rec[journalHeaderSize:]
	body[0] = kind
	binary.LittleEndian.PutUint64(body[1:9], seq)
	copy(body[journalBodyHeaderSize:], data)
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(body)))
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(body, journalCRC))
	return rec
}

// add records msg and returns its sequence number. When add returns, the
// record has been handed to the operating system and, with fsync, a sync
// that covers it has succeeded.
func (j *publishJournal) add(msg *storage.Message) (uint64, error) {
	seq, _, err := j.addRecord(msg)
	return seq, err
}

// journalRecordPosition is where a record was written: the segment file
// and the file's size just after the record.
type journalRecordPosition struct {
	path string
	end  int64
}

// addRecord is add that also says where the record was written.
func (j *publishJournal) addRecord(msg *storage.Message) (uint64, journalRecordPosition, error) {
	data, err := msg.MarshalBinary()
	if err != nil {
		return 0, journalRecordPosition{}, fmt.Errorf("publish journal: encoding message: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, journalRecordPosition{}, errJournalClosed
	}
	seq := j.nextSeq
	seg, err := j.appendLocked(encodeJournalRecord(journalRecordAdd, seq, data))
	if err != nil {
		return 0, journalRecordPosition{}, err
	}
	j.nextSeq++
	seg.open++
	j.bySeq[seq] = seg
	pos := journalRecordPosition{path: seg.path, end: seg.size}
	if j.fsync {
		if err := j.awaitSyncLocked(j.written); err != nil {
			j.abandonLocked(seq)
			return 0, journalRecordPosition{}, err
		}
	}
	return seq, pos, nil
}

// awaitSyncLocked returns once a group sync has covered the journal up to
// written offset end, leading one when no other adder is. It returns the
// error of the sync that covered end if that failed. Callers hold j.mu; it
// is released while syncing and while waiting.
func (j *publishJournal) awaitSyncLocked(end uint64) error {
	w := &journalSyncWaiter{end: end}
	j.waiters = append(j.waiters, w)
	for !w.resolved {
		if j.syncing || j.closed {
			// The leader, or Close, resolves w or signals so that a
			// waiter leads the next sync.
			j.synced.Wait()
			continue
		}
		j.syncing = true
		targets, covered := j.syncTargetsLocked()
		j.mu.Unlock()
		errs := j.syncTargets(targets)
		j.mu.Lock()
		j.syncing = false
		j.finishSyncLocked(targets, covered, errs)
		j.synced.Broadcast()
	}
	return w.err
}

// syncTargetsLocked lists what a group sync starting now must sync: every
// segment with unsynced bytes, oldest first, and the directory when a
// segment was created since its last sync. covered is the written offset
// at this moment: the sync covers every record that ends at or before it.
func (j *publishJournal) syncTargetsLocked() (targets []journalSyncTarget, covered uint64) {
	for _, seg := range j.segs {
		if seg.size > seg.synced {
			targets = append(targets, journalSyncTarget{seg: seg, f: seg.f, size: seg.size})
		}
	}
	if j.dirDirty {
		targets = append(targets, journalSyncTarget{})
		j.dirDirty = false
	}
	return targets, j.written
}

// syncTargets syncs targets (a target without a segment is the journal
// directory) and returns each one's error, in the same order.
func (j *publishJournal) syncTargets(targets []journalSyncTarget) []error {
	errs := make([]error, len(targets))
	for i, t := range targets {
		if t.seg == nil {
			errs[i] = j.syncDir()
			continue
		}
		if err := j.syncFile(t.f); err != nil {
			errs[i] = fmt.Errorf("syncing %s: %w", t.seg.path, err)
		}
	}
	return errs
}

// syncDir syncs the journal directory, so the entries of new segment files
// are on disk.
func (j *publishJournal) syncDir() error {
	d, err := os.Open(j.dir)
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", j.dir, err)
	}
	err = j.syncFile(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", j.dir, err)
	}
	return nil
}

// finishSyncLocked records the outcome of a group sync of targets (errs
// holds each one's error) that covered the journal up to written offset
// covered, and resolves the waiters whose record it covered: with nil, or
// with the sync's error if any target failed. A failed segment is retired
// and not synced again (its waiters have their error); a failed directory
// sync retires the segment being written, whose directory entry may be
// lost. A segment dropped during the sync (every add in it done) need not
// reach the disk, so its error is ignored. Callers hold j.mu.
func (j *publishJournal) finishSyncLocked(targets []journalSyncTarget, covered uint64, errs []error) {
	var failed []error
	for i, t := range targets {
		if t.seg != nil {
			t.seg.synced = max(t.seg.synced, t.size)
		}
		if errs[i] == nil || (t.seg != nil && t.seg.dropped) {
			continue
		}
		failed = append(failed, errs[i])
		if t.seg != nil {
			t.seg.retired = true
		} else {
			j.segs[len(j.segs)-1].retired = true
		}
	}
	j.syncCount++
	var err error
	if len(failed) > 0 {
		j.syncFailed++
		err = fmt.Errorf("publish journal: %w", errors.Join(failed...))
	} else {
		j.syncedBytes = covered
	}
	kept := j.waiters[:0]
	for _, w := range j.waiters {
		if w.end <= covered {
			w.resolved, w.err = true, err
		} else {
			kept = append(kept, w)
		}
	}
	clear(j.waiters[len(kept):])
	j.waiters = kept
}

// abandonLocked forgets the add seq whose sync failed: the publish is
// refused, so it must not be published again at the next start. Its done
// record is written best effort (the file it goes to may fail too; the
// publish is then published again after a restart, a duplicate the
// publisher was told was refused). Callers hold j.mu.
func (j *publishJournal) abandonLocked(seq uint64) {
	seg, ok := j.bySeq[seq]
	if !ok {
		return
	}
	delete(j.bySeq, seq)
	seg.open--
	if j.closed {
		return
	}
	_, _ = j.appendLocked(encodeJournalRecord(journalRecordDone, seq, nil))
	j.dropFinishedLocked()
}

// journalSyncStats are counts of the group syncs of a journal.
type journalSyncStats struct {
	Syncs       uint64 // group syncs finished, failed ones included
	Failed      uint64 // group syncs that failed
	SyncedBytes uint64 // written offset the last successful sync covered
	Written     uint64 // bytes written in this run
}

// syncStats returns the journal's group sync counts.
func (j *publishJournal) syncStats() journalSyncStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return journalSyncStats{Syncs: j.syncCount, Failed: j.syncFailed, SyncedBytes: j.syncedBytes, Written: j.written}
}

// done forgets the publish with sequence number seq.
func (j *publishJournal) done(seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return errJournalClosed
	}
	seg, ok := j.bySeq[seq]
	if !ok {
		return nil
	}
	delete(j.bySeq, seq)
	seg.open--
	if _, err := j.appendLocked(encodeJournalRecord(journalRecordDone, seq, nil)); err != nil {
		return err
	}
	j.dropFinishedLocked()
	return nil
}

// appendLocked writes rec to the current segment, starting a new one when
// it is full or retired, and returns the segment written. A failed write
// retires the segment: a partly written record would end its replay, hiding
// the records written after it.
func (j *publishJournal) appendLocked(rec []byte) (*journalSegment, error) {
	seg := j.segs[len(j.segs)-1]
	if seg.size >= j.segmentLimit || seg.retired {
		if err := j.startSegment(seg.num + 1); err != nil {
			return nil, err
		}
		seg = j.segs[len(j.segs)-1]
	}
	n, err := seg.f.Write(rec)
	seg.size += int64(n)
	j.written += uint64(n)
	if err != nil {
		seg.retired = true
		return nil, fmt.Errorf("publish journal: %w", err)
	}
	return seg, nil
}

// dropFinishedLocked removes the oldest segments while every add in them is
// done. Segments go oldest first so a done record is never removed while the
// add it answers is still on disk.
func (j *publishJournal) dropFinishedLocked() {
	for len(j.segs) > 1 && j.segs[0].open == 0 {
		seg := j.segs[0]
		seg.dropped = true
		_ = seg.f.Close()
		_ = os.Remove(seg.path)
		j.segs = j.segs[1:]
	}
}

// forgetRecovered removes the segments that were on disk at open; call it
// once their pending publishes have been published again.
func (j *publishJournal) forgetRecovered() error {
	j.mu.Lock()
	paths := j.recovered
	j.recovered = nil
	j.mu.Unlock()
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pendingCount is the number of publishes recorded and not yet done in this
// run.
func (j *publishJournal) pendingCount() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.bySeq)
}

// Close closes the segment files; later writes fail. With fsync, adds still
// waiting for a sync are first synced (or given the sync's error).
func (j *publishJournal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	for j.syncing {
		j.synced.Wait()
	}
	if len(j.waiters) > 0 {
		targets, covered := j.syncTargetsLocked()
		j.finishSyncLocked(targets, covered, j.syncTargets(targets))
		j.synced.Broadcast()
	}
	var errs []error
	for _, seg := range j.segs {
		errs = append(errs, seg.f.Close())
	}
	return errors.Join(errs...)
}

// journalMessage is the storable form of an inbound publish.
func journalMessage(clientID string, pk packets.Packet) storage.Message {
	props := pk.Properties.Copy(false)
	return storage.Message{
		T:           "journal",
		Client:      clientID,
		Origin:      pk.Origin,
		FixedHeader: pk.FixedHeader,
		TopicName:   pk.TopicName,
		Payload:     pk.Payload,
		Created:     pk.Created,
		Properties: storage.MessageProperties{
			PayloadFormat:         props.PayloadFormat,
			PayloadFormatFlag:     props.PayloadFormatFlag,
			MessageExpiryInterval: props.MessageExpiryInterval,
			ContentType:           props.ContentType,
			ResponseTopic:         props.ResponseTopic,
			CorrelationData:       props.CorrelationData,
			User:                  props.User,
		},
	}
}
