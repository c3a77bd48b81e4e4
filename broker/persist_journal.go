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
	num  uint64
	path string
	f    *os.File
	size int64
	open int // adds in this segment not yet done
}

// publishJournal is a write-ahead log of accepted QoS 1/2 publishes that
// have not yet been handed to every subscriber. It is safe for concurrent
// use.
type publishJournal struct {
	dir          string
	segmentLimit int64
	fsync        bool // sync each add to disk before add returns

	mu        sync.Mutex
	closed    bool
	segs      []*journalSegment // live segments, oldest first; the last is written
	bySeq     map[uint64]*journalSegment
	nextSeq   uint64
	recovered []string // segment files from before this start, removed by forgetRecovered
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
	j := &publishJournal{dir: dir, segmentLimit: segmentLimit, fsync: fsync, bySeq: map[uint64]*journalSegment{}}
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
// record has been handed to the operating system.
func (j *publishJournal) add(msg *storage.Message) (uint64, error) {
	data, err := msg.MarshalBinary()
	if err != nil {
		return 0, fmt.Errorf("publish journal: encoding message: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, errJournalClosed
	}
	seq := j.nextSeq
	seg, err := j.appendLocked(encodeJournalRecord(journalRecordAdd, seq, data))
	if err != nil {
		return 0, err
	}
	if j.fsync {
		if err := seg.f.Sync(); err != nil {
			return 0, fmt.Errorf("publish journal: %w", err)
		}
	}
	j.nextSeq++
	seg.open++
	j.bySeq[seq] = seg
	return seq, nil
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
// it is full, and returns the segment written.
func (j *publishJournal) appendLocked(rec []byte) (*journalSegment, error) {
	seg := j.segs[len(j.segs)-1]
	if seg.size >= j.segmentLimit {
		if err := j.startSegment(seg.num + 1); err != nil {
			return nil, err
		}
		seg = j.segs[len(j.segs)-1]
	}
	n, err := seg.f.Write(rec)
	seg.size += int64(n)
	if err != nil {
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

// Close closes the segment files; later writes fail.
func (j *publishJournal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
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
