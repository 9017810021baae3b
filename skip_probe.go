package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Source fingerprints of the values as the extractor wrote them, and
// replays that decide "unchanged" from them without converting or
// spooling a chunk ([Job.SkipUnchanged] with a ChunkColumn).
//
// A chunk's source fingerprint is a multiset hash (rows, and two 64-bit
// lanes summing the SHA-256 of each row's encoding) of the rows the
// extractor passed to Write, encoded per Go type before any conversion
// (appendRawValue), and of the rows it passed to Reject. It is tagged
// with rawFingerprintVersion and a digest of what else decides the
// conversion of those values (rawContext: the library's build, the
// written columns' declared types and limits, Job.Zone); the skip key
// covers the job's code version, target shape and derived columns. The
// same Go values under the same context convert alike, so they stage the
// same rows and reject the same ones: the outcome of a merge is decided
// by them, as by the converted rows.
//
// A replay first looks up the chunk's base outside any transaction
// (probeCandidate); when the base recorded a fingerprint of this form and
// rejected no row, the chunk is extracted through a probeWriter, which
// only hashes. If the fingerprint is the base's, the chunk goes to its
// transaction not spooled, and skips there when the base and its target
// rows are still those (skipByProbe); otherwise, or when the probe meets
// a value of a type it does not encode, the chunk is extracted a second
// time through the row writer (convert, spool, fingerprint): the
// fingerprint recorded after a merge is that second pass's, so a source
// that changed between the passes is recorded as merged.

// rawFingerprintVersion tags a source fingerprint of this encoding: one
// recorded under another encoding (pgstore.SourceEncodingVersion's, of
// converted values) never equals one of this, so that chunk merges once
// and records this form.
const rawFingerprintVersion = "r1"

// Tags of appendRawValue: one byte per value, its Go type (and a bool's
// value), so that values of different types never encode alike.
const (
	rawNull     byte = 0
	rawString   byte = 's'
	rawBytes    byte = 'y'
	rawNilBytes byte = 'Y'
	rawInt      byte = 'I'
	rawInt64    byte = 'i'
	rawInt32    byte = 'j'
	rawInt16    byte = 'k'
	rawInt8     byte = 'l'
	rawUint     byte = 'U'
	rawUint64   byte = 'u'
	rawUint32   byte = 'v'
	rawUint16   byte = 'w'
	rawUint8    byte = 'x'
	rawFloat64  byte = 'f'
	rawFloat32  byte = 'g'
	rawFalse    byte = 'b'
	rawTrue     byte = 'B'
	rawTime     byte = 't'
	rawDuration byte = 'd'
	// rawConverted: a value of another type, encoded as converted
	// (pgstore.EncodeSourceRow of the one value); only the row writer,
	// which converts, can.
	rawConverted byte = 'c'
	// rawReject: a row passed to Reject (its raw JSON, column, reason).
	rawReject byte = 'R'
)

// appendRawValue appends to buf an unambiguous encoding of v, a value as
// an extractor wrote it, and reports whether v's type is one it encodes
// (nil, strings, byte slices, the integer and float types, bool,
// time.Time, time.Duration). Every part is self-delimiting; a time is
// its Unix seconds, nanoseconds and zone offset, all its conversion to
// any column reads (the instant, and the wall clock a date takes).
func appendRawValue(buf []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(buf, rawNull), true
	case string:
		buf = binary.AppendUvarint(append(buf, rawString), uint64(len(x)))
		return append(buf, x...), true
	case []byte:
		if x == nil {
			return append(buf, rawNilBytes), true
		}
		buf = binary.AppendUvarint(append(buf, rawBytes), uint64(len(x)))
		return append(buf, x...), true
	case int:
		return binary.AppendVarint(append(buf, rawInt), int64(x)), true
	case int64:
		return binary.AppendVarint(append(buf, rawInt64), x), true
	case int32:
		return binary.AppendVarint(append(buf, rawInt32), int64(x)), true
	case int16:
		return binary.AppendVarint(append(buf, rawInt16), int64(x)), true
	case int8:
		return binary.AppendVarint(append(buf, rawInt8), int64(x)), true
	case uint:
		return binary.AppendUvarint(append(buf, rawUint), uint64(x)), true
	case uint64:
		return binary.AppendUvarint(append(buf, rawUint64), x), true
	case uint32:
		return binary.AppendUvarint(append(buf, rawUint32), uint64(x)), true
	case uint16:
		return binary.AppendUvarint(append(buf, rawUint16), uint64(x)), true
	case uint8:
		return binary.AppendUvarint(append(buf, rawUint8), uint64(x)), true
	case float64:
		return binary.BigEndian.AppendUint64(append(buf, rawFloat64), math.Float64bits(x)), true
	case float32:
		return binary.BigEndian.AppendUint32(append(buf, rawFloat32), math.Float32bits(x)), true
	case bool:
		if x {
			return append(buf, rawTrue), true
		}
		return append(buf, rawFalse), true
	case time.Time:
		_, offset := x.Zone()
		buf = binary.AppendVarint(append(buf, rawTime), x.Unix())
		buf = binary.AppendVarint(buf, int64(x.Nanosecond()))
		return binary.AppendVarint(buf, int64(offset)), true
	case time.Duration:
		return binary.AppendVarint(append(buf, rawDuration), int64(x)), true
	}
	return buf, false
}

// rawFingerprint is the source fingerprint of a chunk's rows as written
// (see the top of this file).
type rawFingerprint struct {
	// context is rawContext's digest for the chunk's job and columns.
	context string
	rows    int64
	sum     [2]uint64
	buf     []byte
	// unusable: a row the fingerprint cannot stand for (a rejected row
	// with a value of a type appendRawValue does not encode): nothing is
	// recorded, the next replay merges.
	unusable bool
}

// String renders the fingerprint for the manifest: version, context,
// rows, lanes ("r1:<context>:3:1f…:a2…"); "" when it is unusable.
func (f *rawFingerprint) String() string {
	if f.unusable {
		return ""
	}
	return fmt.Sprintf("%s:%s:%d:%016x:%016x", rawFingerprintVersion, f.context, f.rows, f.sum[0], f.sum[1])
}

// add adds the row encoded in f.buf.
func (f *rawFingerprint) add() {
	sum := sha256.Sum256(f.buf)
	f.rows++
	f.sum[0] += binary.BigEndian.Uint64(sum[0:8])
	f.sum[1] += binary.BigEndian.Uint64(sum[8:16])
}

// encodeRaw encodes values into f.buf, and reports whether every value
// is of a type appendRawValue encodes.
func (f *rawFingerprint) encodeRaw(values []any) bool {
	f.buf = f.buf[:0]
	ok := true
	for _, v := range values {
		if f.buf, ok = appendRawValue(f.buf, v); !ok {
			return false
		}
	}
	return true
}

// addMixed adds a row with a value of a type appendRawValue does not
// encode: such values as converted (converted, of the written columns
// cols), the others as written. converted nil (the row was rejected
// before it was converted) makes f unusable.
func (f *rawFingerprint) addMixed(cols []Column, values, converted []any) {
	if converted == nil {
		f.unusable = true
		return
	}
	f.buf = f.buf[:0]
	for i, v := range values {
		var ok bool
		if f.buf, ok = appendRawValue(f.buf, v); !ok {
			f.buf = pgstore.EncodeSourceRow(append(f.buf, rawConverted), cols[i:i+1], converted[i:i+1])
		}
	}
	f.add()
}

// addReject adds a row passed to Reject: its raw JSON, column and reason.
func (f *rawFingerprint) addReject(raw []byte, column, reason string) {
	f.buf = append(f.buf[:0], rawReject)
	for _, s := range []string{string(raw), column, reason} {
		f.buf = binary.AppendUvarint(f.buf, uint64(len(s)))
		f.buf = append(f.buf, s...)
	}
	f.add()
}

// libraryBuild names the build of this library the process runs: its
// module version and checksum when it is a dependency, the main
// module's version (and VCS revision) when it is the main module.
var libraryBuild = sync.OnceValue(func() string {
	const path = "github.com/pgbackfill/backfill"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if bi.Main.Path == path {
		s := bi.Main.Version
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" || st.Key == "vcs.modified" {
				s += " " + st.Value
			}
		}
		return s
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				d = d.Replace
			}
			return d.Version + " " + d.Sum
		}
	}
	return "unknown"
})

// rawContext returns the digest of what, besides the values written,
// decides their conversion for chunks of job into the columns of info:
// the encoding's version, the library's build (its conversion code),
// Job.Zone, and each written column's name, declared and base type,
// limits and constraints, and collation.
func rawContext(job Job, info TableInfo) string {
	var b strings.Builder
	b.WriteString(rawFingerprintVersion)
	b.WriteByte(0)
	b.WriteString(libraryBuild())
	b.WriteByte(0)
	if job.Zone != nil {
		b.WriteString(job.Zone.String())
	}
	for _, col := range info.Columns[:info.Written] {
		fmt.Fprintf(&b, "\x00%q %+v %q", col.Collation, col.Conv(), col.Computed)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

// errProbeStopped is a probeWriter's answer to a row it cannot
// fingerprint: the probe ends, and the chunk is extracted by the row
// writer.
var errProbeStopped = errors.New("backfill: the chunk is extracted again to be converted")

// probeWriter is the RowWriter of a probe: it fingerprints the rows
// written as the row writer does (rawFingerprint), neither converting
// nor keeping them.
type probeWriter struct {
	fp      rawFingerprint
	written int
	closed  bool
	// stopped: a row it cannot fingerprint without converting it (or a
	// wrong number of values, which the row writer reports).
	stopped bool
}

func (p *probeWriter) Write(_ context.Context, values ...any) error {
	switch {
	case p.closed:
		return ErrWriterClosed
	case p.stopped:
		return errProbeStopped
	case len(values) != p.written || !p.fp.encodeRaw(values):
		p.stopped = true
		return errProbeStopped
	}
	p.fp.add()
	return nil
}

func (p *probeWriter) Reject(_ context.Context, raw any, column, reason string) error {
	switch {
	case p.closed:
		return ErrWriterClosed
	case p.stopped:
		return errProbeStopped
	}
	if reason == "" {
		reason = "rejected by extractor"
	}
	p.fp.addReject(pgstore.RawJSON(nil, nil, raw), column, reason)
	return nil
}

// baseOutside returns chunk c's base load, read in a read transaction
// of its own (the chunk's transaction reads it again before it skips).
func (ex *execution) baseOutside(ctx context.Context, c Chunk) (base backfilldriver.ChunkFingerprints, ok bool, err error) {
	err = pgstore.ReadTx(ctx, ex.r.db, func(tx sqlx.ExtContext) (err error) {
		base, ok, err = ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
		return err
	})
	return base, ok, err
}

// probeWorth reports whether chunks of this execution still look up
// their base for a probe: not once a lookup found no base at all while
// none found one (a first load, which would pay a lookup per chunk), nor
// once probeChangedMost probes found their chunk changed and those are
// most (a restatement of most chunks, which would extract each twice).
func (ex *execution) probeWorth() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	p := ex.probes
	return (p.found > 0 || p.missing == 0) && (p.changed < probeChangedMost || p.changed <= p.same)
}

// probeChangedMost is how many probes of an execution find their chunk
// changed before probeWorth compares them with those finding it
// unchanged.
const probeChangedMost = 4

// probeCounts count an execution's lookups of a base for a probe that
// found one (found) and none (missing), and its probes that found the
// chunk unchanged (same) and changed (changed).
type probeCounts struct {
	found, missing, same, changed int
}

// countProbe adds to the execution's probe counts.
func (ex *execution) countProbe(f func(*probeCounts)) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	f(&ex.probes)
}

// probeBase reports whether base (ok: found) lets a probe skip a chunk's
// conversion: a fingerprint of this encoding, a target fingerprint, no
// rejected row (a probe does not convert, so it cannot queue the rows
// conversion rejects).
func probeBase(base backfilldriver.ChunkFingerprints, ok bool) bool {
	return ok && strings.HasPrefix(base.Source, rawFingerprintVersion+":") && base.Target != "" && base.Counts.Rejected == 0
}

// probe is runChunk's extract step's probe of chunk c (extract): for a
// job with SkipUnchanged and a ChunkColumn, a chunk neither re-read nor
// open, not found by this call to need its extraction, without a
// version (a ChunkVersioner's, which its base did not have), whose base
// lets it (probeBase), it extracts the chunk through a probeWriter. It
// returns the chunk's skip state, not spooled, when the fingerprint is
// the base's (the chunk's transaction decides: skipByProbe); nil when
// the chunk is to be extracted by the row writer. version is the chunk's
// version read before, confirmed after the probe.
func (ex *execution) probe(ctx context.Context, c Chunk, reread bool, started time.Time, version string) (*chunkSkip, error) {
	if !ex.job.SkipUnchanged || ex.job.ChunkColumn == "" || reread || ex.open(c, started) || ex.versionMissed(c.Seq, false) || !ex.probeWorth() {
		return nil, nil
	}
	if version != "" {
		// A version other than its base's (versionCandidate): its rows
		// changed, as far as the ChunkVersioner tells.
		return nil, nil
	}
	ctx = pgstore.WithPurpose(ctx, "read the chunk's base load", ex.batchID)
	base, ok, err := ex.baseOutside(ctx, c)
	if err != nil {
		return nil, err
	}
	ex.countProbe(func(p *probeCounts) {
		if ok {
			p.found++
		} else {
			p.missing++
		}
	})
	if !probeBase(base, ok) {
		return nil, nil
	}
	info := ex.chunkInfo(ex.info, c)
	p := &probeWriter{fp: rawFingerprint{context: rawContext(ex.job, info)}, written: info.Written}
	xerr := extractSafely(ctx, ex.job.Extractor, c, p)
	p.closed = true
	switch {
	case p.stopped:
		return nil, nil
	case xerr != nil:
		return nil, fmt.Errorf("extract: %w", xerr)
	case p.fp.String() != base.Source:
		ex.countProbe(func(p *probeCounts) { p.changed++ })
		ex.logMerges(c, "its source rows changed since its last load")
		return nil, nil
	}
	ex.countProbe(func(p *probeCounts) { p.same++ })
	sk := &chunkSkip{probed: p.fp.String(), probedRows: p.fp.rows, version: version}
	if err := ex.confirmVersion(ctx, c, sk, false, started); err != nil {
		return nil, err
	}
	return sk, nil
}

// skipByProbe skips try t's chunk, fenced in t.tx and probed (not
// spooled) as unchanged: when its base (looked up in t.tx) is still one
// with the probe's fingerprint (probeBase) and its target rows within
// its bounds hash as the base's, it checkpoints and commits the chunk
// and returns true. Otherwise it returns false, and the chunk is to be
// extracted by the row writer.
func (ex *execution) skipByProbe(ctx context.Context, t *chunkTry) (bool, error) {
	c, tx, sk := t.c, t.tx, t.x.skip
	base, ok, err := ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
	if err != nil {
		return false, t.chunkErr(err)
	}
	if !probeBase(base, ok) || base.Source != sk.probed {
		return false, nil
	}
	tt, err := ex.targetText(ctx, t, base.Target)
	if err != nil {
		return false, t.chunkErr(err)
	}
	if tt != base.Target {
		ex.logMerges(c, "its target rows changed since its last load (or the target's shape)")
		return false, nil
	}
	// The base rejected none (probeBase), and the same values convert
	// alike: every row read is staged, unchanged.
	return ex.checkpointSkipped(ctx, t, skippedChunk{base: base, read: sk.probedRows, version: sk.version})
}
