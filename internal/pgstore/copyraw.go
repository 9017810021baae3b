package pgstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
)

// The COPY of staging on lib/pq's connection itself.
//
// database/sql checks and converts every argument of every Exec of a
// prepared statement (driverArgsConnLocked), and takes the statement's and
// the connection's locks each time: for a COPY, whose Exec per row only
// appends the row to a buffer, that is most of the client's cost of
// staging a row. A chunk's transaction begun on a connection of its own
// ([PGDB.BeginChunk]) lets [PGStager.CopyRows] run the whole COPY inside
// one [sql.Conn.Raw] call: the COPY is prepared on lib/pq's connection,
// every row goes to its Exec with the values database/sql would pass, and
// the COPY ends before Raw returns, so database/sql never sees the
// connection in the middle of a COPY.

// RawCopies counts the COPYs of staging run on lib/pq's connection
// (CopyRows); tests read it.
var RawCopies atomic.Int64

// ChunkBeginner is a DB that begins a chunk's transaction on a connection
// of its own ([PGDB]).
type ChunkBeginner interface {
	// BeginChunk begins a chunk's transaction, as Begin.
	BeginChunk(ctx context.Context) (backfilldriver.Tx, error)
}

// rawConner is a transaction whose connection database/sql hands out
// (connTx).
type rawConner interface {
	Raw(f func(driverConn any) error) error
}

// connTx is a READ COMMITTED transaction on a connection taken from the
// pool for it alone, given back when the transaction ends.
type connTx struct {
	*sqlx.Tx
	conn *sqlx.Conn
	once sync.Once
}

// Raw runs f with lib/pq's connection ([sql.Conn.Raw]).
func (t *connTx) Raw(f func(driverConn any) error) error { return t.conn.Raw(f) }

// Commit commits, then gives the connection back to the pool.
func (t *connTx) Commit() error {
	err := t.Tx.Commit()
	t.release()
	return err
}

// Rollback rolls back, then gives the connection back to the pool.
func (t *connTx) Rollback() error {
	err := t.Tx.Rollback()
	t.release()
	return err
}

func (t *connTx) release() { t.once.Do(func() { _ = t.conn.Close() }) }

// BeginChunk begins a READ COMMITTED transaction, as [PGDB.Begin], on a
// connection of its own, so that the COPY of staging can run on lib/pq's
// connection ([PGStager.CopyRows]). A BEGIN on a connection found broken
// (driver.ErrBadConn: the server restarted since the pool last used it)
// falls back to Begin, which retries on other connections as
// database/sql does.
func (d PGDB) BeginChunk(ctx context.Context) (backfilldriver.Tx, error) {
	conn, err := d.DB.Connx(ctx)
	if err != nil {
		if errors.Is(err, driver.ErrBadConn) {
			return d.Begin(ctx)
		}
		return nil, err
	}
	tx, err := conn.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		_ = conn.Close()
		if errors.Is(err, driver.ErrBadConn) {
			return d.Begin(ctx)
		}
		return nil, err
	}
	return &connTx{Tx: tx, conn: conn}, nil
}

// rawConnOf returns the connection of tx when tx, or the transaction a
// BatchTx wraps, hands it out.
func rawConnOf(tx sqlx.ExtContext) rawConner {
	if b, ok := tx.(*BatchTx); ok {
		rc, _ := b.Tx.(rawConner)
		return rc
	}
	rc, _ := tx.(rawConner)
	return rc
}

// rawCopy is a COPY prepared on lib/pq's connection, open while
// CopyRows runs.
type rawCopy struct {
	stmt  driver.Stmt
	check driver.NamedValueChecker // nil: none
	vals  []driver.Value
}

// CopyRows runs f, which Adds the chunk's rows, and ends the COPY. When the
// chunk's transaction has a connection of its own ([PGDB.BeginChunk]), f
// runs inside [sql.Conn.Raw] with the COPY on lib/pq's connection, and
// the COPY's own error (a value PostgreSQL refused) is the next EndCopy's;
// otherwise f runs as it is, the COPY through database/sql. It returns
// f's error.
func (s *PGStager) CopyRows(ctx context.Context, f func() error) error {
	if s.rawConn == nil || s.copy != nil || s.done || s.copied {
		return f()
	}
	s.copied = true
	if b, ok := s.tx.(*BatchTx); ok {
		if err := b.flush(ctx); err != nil {
			return fmt.Errorf("backfill: stage %s: copy: %w", s.Info.Target.Table, err)
		}
	}
	var ferr error
	ran := false
	err := s.rawConn.Raw(func(dc any) error {
		cp, ok := dc.(driver.Conn)
		if !ok {
			return nil
		}
		ran = true
		RawCopies.Add(1)
		var stmt driver.Stmt
		var err error
		if pc, ok := cp.(driver.ConnPrepareContext); ok {
			stmt, err = pc.PrepareContext(ctx, s.Q.copyIn)
		} else {
			stmt, err = cp.Prepare(s.Q.copyIn)
		}
		if err != nil {
			ferr = fmt.Errorf("backfill: stage %s: copy: %w", s.Info.Target.Table, err)
			return nil
		}
		check, _ := dc.(driver.NamedValueChecker)
		s.raw = &rawCopy{stmt: stmt, check: check, vals: make([]driver.Value, len(s.buf))}
		ferr = f()
		s.raw = nil
		// The end of the COPY: the server's verdict on every row.
		//lint:ignore SA1019 lib/pq's COPY statement implements Exec only
		_, s.copyErr = stmt.Exec(nil)
		if cerr := stmt.Close(); s.copyErr == nil {
			s.copyErr = cerr
		}
		return nil
	})
	if err != nil {
		return errors.Join(ferr, fmt.Errorf("backfill: stage %s: copy: %w", s.Info.Target.Table, err))
	}
	if !ran {
		return f()
	}
	return ferr
}

// addRaw adds a row to the COPY on lib/pq's connection, its values
// converted as database/sql converts a statement's arguments.
func (s *PGStager) addRaw(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := s.raw
	for i, v := range s.buf {
		switch v.(type) {
		case nil, int64, float64, bool, string, []byte, time.Time:
			r.vals[i] = v
		default:
			x, err := driverValue(r.check, i, v)
			if err != nil {
				return err
			}
			r.vals[i] = x
		}
	}
	//lint:ignore SA1019 lib/pq's COPY statement implements Exec only
	_, err := r.stmt.Exec(r.vals)
	clear(r.vals)
	return err
}

// driverValue converts v as database/sql converts an argument: the
// driver's NamedValueChecker, then the default converter (which calls a
// driver.Valuer).
func driverValue(check driver.NamedValueChecker, i int, v any) (driver.Value, error) {
	if check != nil {
		nv := driver.NamedValue{Ordinal: i + 1, Value: v}
		switch err := check.CheckNamedValue(&nv); {
		case err == nil:
			return nv.Value, nil
		case !errors.Is(err, driver.ErrSkip):
			return nil, fmt.Errorf("converting argument $%d type %T: %w", i+1, v, err)
		}
	}
	x, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return nil, fmt.Errorf("converting argument $%d type %T: %w", i+1, v, err)
	}
	return x, nil
}
