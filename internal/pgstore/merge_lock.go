package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Key locks: merges that touch the same business keys run one after the
// other. Before its first read of the target, a merge takes
// transaction-level two-int advisory locks in the target's namespace
// ([LockNamespace]): [WholeTarget] shared, then one exclusive lock per
// key hash in ascending order, in one statement, so that no two merges
// wait in a cycle. A chunk with more than [MergeLockKeys] key hashes, or
// whose key type has no hash function, takes WholeTarget exclusively, so a
// transaction never holds more than MergeLockKeys+1 of these locks. A
// single integer key is locked by ranges of values. The merge relies on
// READ COMMITTED. The design note docs/design/merge.md explains the
// alternatives.

// MergeLockKeys is the most key locks one chunk takes; a chunk with more
// distinct key hashes locks the whole target.
const MergeLockKeys = 64

// mergeLockScanRows: a chunk of more staged rows locks the whole target
// without reading its keys (it most likely has more than MergeLockKeys).
const mergeLockScanRows int64 = 4096

// An integer key is locked by ranges of 1<<mergeLockRangeBits values; a
// chunk of more than mergeLockRangeScanRows rows locks the whole target
// without reading its keys.
const (
	mergeLockRangeBits           = 12
	mergeLockRangeScanRows int64 = 1 << 18
)

// WholeTarget is the lock that stands for every key of the target.
const WholeTarget = -1

// LockNamespace is the first key of the target's advisory locks: a 32-bit
// FNV-1a hash of its canonical name.
func LockNamespace(table string) int32 {
	h := fnv.New32a()
	h.Write([]byte("backfill.merge:" + table))
	return int32(h.Sum32())
}

// keyHashable reports whether every key column's type has an extended hash
// function (PostgreSQL's type cache decides: a type without a default hash
// operator class, or an array or composite of one, has none). Probed once
// per target and key types, in a savepoint of tx.
func (s *PGStager) keyHashable(ctx context.Context) (bool, error) {
	types := make([]string, len(s.Info.Target.Key))
	for i, k := range s.Info.Target.Key {
		for _, c := range s.Info.Columns {
			if c.Name == k {
				types[i] = c.Type
			}
		}
		if types[i] == "" {
			return false, nil // a TableInfo not from Prepare: no type to hash by
		}
	}
	sig := s.Info.Target.Table + "\x00" + strings.Join(types, "\x00")
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
// transaction (see above), with WaitLock: in steps, each wait reported
// to the context's LockWaiting (the Runner's fences a stale worker
// holding them). It must run before the merge's first read of the
// target.
func (s *PGStager) lockKeys(ctx context.Context) error {
	t := s.Info.Target
	// A partition and its partitioned parent share one namespace: merges
	// through either lock the same keys (prepareDecide).
	ns := LockNamespace(cmp.Or(s.Info.LockRoot, t.Table))
	what := "key locks of " + t.Table
	whole := func() error {
		return WaitLock(ctx, s.tx, what, LockSpec{Namespace: ns, Whole: true}, func(cond string) string {
			return fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d, %d) WHERE %s`, ns, WholeTarget, cond)
		})
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
		distinct := t.Mode != backfilltype.History && s.track && !s.maybeDup
		if s.staged > mergeLockScanRows || distinct && s.staged > int64(MergeLockKeys) {
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
		bucket, s.Q.Stage, MergeLockKeys+1)); err != nil {
		return err
	}
	if len(buckets) > MergeLockKeys {
		return whole()
	}
	// Lock -1 shared first, then the keys in ascending order (unnest keeps
	// the array's order, the aggregate consumes it in that order), in one
	// statement: the shared lock (and WaitLock's condition) is an
	// uncorrelated subquery in a condition without columns, which
	// PostgreSQL evaluates once, as a one-time filter, before the first
	// row of unnest. The numbers are the library's (hashes and its
	// constant), written into the statement: without parameters it goes
	// with WaitLock's savepoint in one round trip.
	keys := make([]string, len(buckets))
	for i, b := range buckets {
		keys[i] = fmt.Sprint(b)
	}
	return WaitLock(ctx, s.tx, what, LockSpec{Namespace: ns, Keys: buckets}, func(cond string) string {
		return fmt.Sprintf(`SELECT count(pg_advisory_xact_lock(%[1]d, b)) FROM unnest('{%[2]s}'::int[]) AS b
		WHERE (SELECT pg_advisory_xact_lock_shared(%[1]d, %[3]d) WHERE %[4]s) IS NOT NULL`, ns, strings.Join(keys, ","), WholeTarget, cond)
	})
}

// rangeKey returns the business key's column when it is a single integer
// column, whose locks cover ranges of values.
func (s *PGStager) rangeKey() (string, bool) {
	t := s.Info.Target
	if len(t.Key) != 1 {
		return "", false
	}
	for _, c := range s.Info.Columns {
		if c.Name == t.Key[0] {
			switch c.BaseType {
			case "int2", "int4", "int8":
				return c.Name, true
			}
		}
	}
	return "", false
}
