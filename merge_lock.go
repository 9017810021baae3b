package backfill

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Key locks: merges that touch the same business keys run one after the
// other.
//
// A chunk's merge decides what to write from what its statements see of
// the target. Under READ COMMITTED (PostgreSQL docs, 13.2.1) that is the
// committed state when each statement starts: two chunks merging the
// same key at once both decide from the state before the other, and the
// later commit overwrites the earlier one's decision (a lower version
// wins under NewerVersionWins; in History both add an open version, or
// close intervals the other one changed). So before its first statement
// that reads the target, a merge takes transaction-level advisory locks
// (pg_advisory_xact_lock, PostgreSQL docs, 9.27.10 "Advisory Lock
// Functions") on its business keys, held until the chunk's transaction
// ends. A merge of the same keys in another transaction (another worker,
// another process, another job on the same target) waits for it to commit
// or roll back; its statements, which take their snapshots after the
// wait, then see the first merge's rows. Merges of disjoint keys do not
// wait for each other.
//
// Locks are two-int advisory locks (PostgreSQL lock key space 2, apart
// from the bigint locks elsewhere in the library) in a namespace per
// target table. A chunk of at most mergeLockKeys distinct key hashes
// takes the target's lock -1 in shared mode, then one exclusive lock per
// key hash, all in one statement in ascending order: two merges never wait
// for each other's locks in a cycle. The hash is 31 bits of
// hash_array_extended of each key column, which hashes values as their
// type's equality compares them, collations included; a single integer
// key is hashed by ranges of 4,096 values, so that a chunk of neighbouring
// ids takes few locks however large, and chunks of disjoint id ranges do
// not wait for each other.
//
// A larger chunk (more key hashes, or more rows than are worth reading
// for them), or one whose key type has no hash function, takes lock -1
// exclusively: it waits for, and blocks, every other merge into the
// target. A transaction thus never holds more than mergeLockKeys+1 of
// these locks, whatever the chunk's size (the lock table is shared and
// sized by max_locks_per_transaction, PostgreSQL docs, 20.12), and such a
// chunk costs one statement that reads nothing. The price: at
// Concurrency > 1, the merges (not the extraction and staging) of large
// chunks with other keys than a single integer run one at a time.
//
// The merge relies on READ COMMITTED: the runner's transactions use it.

// mergeLockKeys is the most key locks one chunk takes; a chunk with more
// distinct key hashes locks the whole target.
const mergeLockKeys = 64

// mergeLockScanRows: a chunk of more staged rows locks the whole target
// without reading its keys (it most likely has more than mergeLockKeys).
const mergeLockScanRows int64 = 4096

// An integer key is locked by ranges of 1<<mergeLockRangeBits values; a
// chunk of more than mergeLockRangeScanRows rows locks the whole target
// without reading its keys.
const (
	mergeLockRangeBits           = 12
	mergeLockRangeScanRows int64 = 1 << 18
)

// wholeTarget is the lock that stands for every key of the target.
const wholeTarget = -1

// lockNamespace is the first key of the target's advisory locks: a 32-bit
// FNV-1a hash of its canonical name.
func lockNamespace(table string) int32 {
	h := fnv.New32a()
	h.Write([]byte("backfill.merge:" + table))
	return int32(h.Sum32())
}

// keyHashable reports whether every key column's type has an extended hash
// function (PostgreSQL's type cache decides: a type without a default hash
// operator class, or an array or composite of one, has none). Probed once
// per target and key types, in a savepoint of tx.
func (s *pgStager) keyHashable(ctx context.Context) (bool, error) {
	types := make([]string, len(s.info.Target.Key))
	for i, k := range s.info.Target.Key {
		for _, c := range s.info.Columns {
			if c.Name == k {
				types[i] = c.Type
			}
		}
		if types[i] == "" {
			return false, nil // a TableInfo not from Prepare: no type to hash by
		}
	}
	sig := s.info.Target.Table + "\x00" + strings.Join(types, "\x00")
	s.m.mu.Lock()
	ok, known := s.m.hashable[sig]
	s.m.mu.Unlock()
	if known {
		return ok, nil
	}
	probes := make([]string, len(types))
	for i, ty := range types {
		probes[i] = fmt.Sprintf("hash_array_extended(ARRAY[]::%s[], 0)", ty)
	}
	if _, err := s.tx.ExecContext(ctx, `SAVEPOINT backfill_hash_probe`); err != nil {
		return false, err
	}
	_, err := s.tx.ExecContext(ctx, `SELECT `+strings.Join(probes, ", "))
	var pe *pq.Error
	switch {
	case err == nil:
		ok = true
		_, err = s.tx.ExecContext(ctx, `RELEASE SAVEPOINT backfill_hash_probe`)
	case errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42704" || pe.Code == "42846"):
		// undefined_function (no hash function), undefined_object (no
		// array type), cannot_coerce: lock the whole target.
		ok = false
		_, err = s.tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT backfill_hash_probe`)
	}
	if err != nil {
		return false, err
	}
	s.m.mu.Lock()
	if s.m.hashable == nil {
		s.m.hashable = map[string]bool{}
	}
	s.m.hashable[sig] = ok
	s.m.mu.Unlock()
	return ok, nil
}

// lockKeys takes the key locks of the staged rows in the chunk's
// transaction (see above). It must run before the merge's first read of
// the target.
func (s *pgStager) lockKeys(ctx context.Context) error {
	t := s.info.Target
	// A partition and its partitioned parent share one namespace: merges
	// through either lock the same keys (merge_decide.go).
	ns := lockNamespace(cmpOr(s.info.lockRoot, t.Table))
	whole := func() error {
		_, err := s.tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1::int, $2::int) WHERE `+noLockTimeout, ns, wholeTarget)
		return err
	}
	if s.lockWhole {
		return whole()
	}
	var bucket string
	if k, ok := s.rangeKey(); ok {
		// One lock per mergeLockRange consecutive values: a chunk of
		// neighbouring ids (a range of ids, or of time with ids that grow
		// with it) takes a few locks, however large.
		if s.staged > mergeLockRangeScanRows {
			return whole()
		}
		bucket = fmt.Sprintf("hashint8extended(s.%s::int8 >> %d, 0)", sqlgen.Ident(k), mergeLockRangeBits)
	} else {
		// Known without reading staging: too many rows to be worth
		// counting the keys of, or (Go saw every identity, no repeats,
		// and the identity is the key) more keys than locks.
		distinct := t.Mode != History && s.track && !s.maybeDup
		if s.staged > mergeLockScanRows || distinct && s.staged > int64(mergeLockKeys) {
			return whole()
		}
		ok, err := s.keyHashable(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return whole()
		}
		parts := make([]string, len(t.Key))
		for i, k := range t.Key {
			parts[i] = fmt.Sprintf("hash_array_extended(ARRAY[s.%s], %d)", sqlgen.Ident(k), i)
		}
		bucket = strings.Join(parts, " # ")
	}
	// Without parameters (the bound is the library's constant): one
	// round trip.
	var buckets []int64
	if err := sqlx.SelectContext(ctx, s.tx, &buckets, fmt.Sprintf(`SELECT b FROM (SELECT DISTINCT ((%s) & 2147483647)::int AS b FROM %s s) x ORDER BY b LIMIT %d`,
		bucket, s.q.stage, mergeLockKeys+1)); err != nil {
		return err
	}
	if len(buckets) > mergeLockKeys {
		return whole()
	}
	// Lock -1 shared first, then the keys in ascending order (unnest keeps
	// the array's order, the aggregate consumes it in that order), in one
	// statement: the shared lock (and noLockTimeout) is an uncorrelated
	// subquery in a condition without columns, which PostgreSQL evaluates
	// once, as a one-time filter, before the first row of unnest.
	_, err := s.tx.ExecContext(ctx, `SELECT count(pg_advisory_xact_lock($1::int, b)) FROM unnest($2::int[]) AS b
		WHERE (SELECT pg_advisory_xact_lock_shared($1::int, $3::int) WHERE `+noLockTimeout+`) IS NOT NULL`, ns, pq.Array(buckets), wholeTarget)
	return err
}

// noLockTimeout is a condition that sets lock_timeout 0 for the rest of
// the chunk's transaction, keeping the try's value in
// backfill.lock_timeout (unless kept already) for the merge's planner
// settings to put back: the key locks wait only for other merges of the
// same keys, whatever the try's lock_timeout (backfill_timeouts.go). In
// the WHERE clause of a statement without FROM it is evaluated before
// the statement's lock function.
const noLockTimeout = `set_config('lock_timeout', CASE WHEN set_config('backfill.lock_timeout',
	coalesce(nullif(current_setting('backfill.lock_timeout', true), ''), current_setting('lock_timeout')), true) IS NOT NULL THEN '0' END, true) IS NOT NULL`

// rangeKey returns the business key's column when it is a single integer
// column, whose locks cover ranges of values.
func (s *pgStager) rangeKey() (string, bool) {
	t := s.info.Target
	if len(t.Key) != 1 {
		return "", false
	}
	for _, c := range s.info.Columns {
		if c.Name == t.Key[0] {
			switch c.BaseType {
			case "int2", "int4", "int8":
				return c.Name, true
			}
		}
	}
	return "", false
}
