package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
)

// DefaultConnBudget is how long the manifest transactions of a database
// handle that no Runner configured retry transient faults (TxSettings.ConnBudget).
const DefaultConnBudget = 60 * time.Second

// ErrFaultBound marks the error of a manifest transaction whose transient
// faults lasted its bound (TxSettings.ConnBudget): the caller does not
// retry it again.
var ErrFaultBound = errors.New("transient faults outlasted the bound")

// txPurpose names a manifest transaction in logs and errors: what it
// does, the batch it is for (0: none), and the manifest's schema.
type txPurpose struct {
	what   string
	batch  int64
	schema string
}

type txPurposeKey struct{}

// purpose returns ctx naming the manifest transactions run under it:
// what they do and for which batch (0: the batch ctx names, if any).
func (m *Manifest) purpose(ctx context.Context, what string, batch int64) context.Context {
	p := purposeIn(ctx, what, batch)
	p.schema = m.SchemaName
	return context.WithValue(ctx, txPurposeKey{}, p)
}

// WithPurpose returns ctx naming the transactions of the library run
// under it (InTx, InShortTx, InBoundedTx, ReadTx) in logs and errors:
// what they do and for which batch (0: the batch ctx names, if any).
// A run's calls carry its batch so.
func WithPurpose(ctx context.Context, what string, batch int64) context.Context {
	return context.WithValue(ctx, txPurposeKey{}, purposeIn(ctx, what, batch))
}

// purposeIn is the purpose (what, batch) under the one ctx carries: its
// batch and schema kept where what and batch name none.
func purposeIn(ctx context.Context, what string, batch int64) txPurpose {
	p, _ := ctx.Value(txPurposeKey{}).(txPurpose)
	p.what = cmp.Or(what, p.what)
	p.batch = cmp.Or(batch, p.batch)
	return p
}

func purposeOf(ctx context.Context) txPurpose {
	p, _ := ctx.Value(txPurposeKey{}).(txPurpose)
	p.what = cmp.Or(p.what, "manifest transaction")
	return p
}

// attrs are p's log attributes.
func (p txPurpose) attrs() []any {
	a := []any{"what", p.what}
	if p.batch != 0 {
		a = append(a, "batch_id", p.batch)
	}
	return a
}

// TransientCode returns the SQLSTATE (or "connection" for a connection
// lost without one: driver.ErrBadConn, io.ErrUnexpectedEOF, a network
// error) of err when it is a transient fault of the connection or the
// server (backfilltype.IsConnectionError: class 08, 53300, 57P01-57P03)
// while ctx is not done. A pooler in statement mode (ErrStatementPooler)
// drops every BEGIN: a configuration to fix, never transient.
func TransientCode(ctx context.Context, err error) (string, bool) {
	if err == nil || ctx.Err() != nil || !backfilltype.IsConnectionError(err) || errors.Is(err, ErrStatementPooler) {
		return "", false
	}
	var pe *pq.Error
	if errors.As(err, &pe) {
		return string(pe.Code), true
	}
	return "connection", true
}

// ConnBackoff is the sleep after the n-th (1-based) transient fault of a
// transaction (a manifest transaction's, or a chunk's): 100 ms doubled per
// fault, at most 5 s, jittered.
func ConnBackoff(n int) time.Duration {
	return Jitter(min(100*time.Millisecond<<min(n-1, 6), 5*time.Second))
}

// retryTransient runs try until it returns nil, an error that is not
// transient (TransientCode), or transient faults have lasted budget since
// the first one; each fault is logged at WARN with p's purpose and batch,
// the SQLSTATE, the try and the sleep. A transaction cut at its COMMIT
// may have committed: try must then find its effect and not apply it
// twice (each caller documents how). The error past the budget says so
// and wraps the last fault, which IsRetryable accepts.
func retryTransient(ctx context.Context, log *slog.Logger, p txPurpose, budget time.Duration, try func() error) error {
	var first time.Time
	for n := 1; ; n++ {
		err := try()
		code, ok := TransientCode(ctx, err)
		if !ok {
			if err == nil && n > 1 {
				log.Info("backfill: manifest transaction done after transient faults", append(p.attrs(), "tries", n, "faulty_for", time.Since(first).Round(time.Millisecond))...)
			}
			return err
		}
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) >= budget {
			return fmt.Errorf("the database was unreachable or refused connections for %s (%d tries, %w); restart later to resume: %w",
				time.Since(first).Round(time.Millisecond), n, ErrFaultBound, err)
		}
		sleep := ConnBackoff(n)
		log.Warn("backfill: a manifest transaction hit a transient fault; retrying after a pause",
			append(p.attrs(), "sqlstate", code, "try", n, "sleep", sleep, "error", err)...)
		if !sleepCtx(ctx, sleep) {
			return err
		}
	}
}

// schemaMissing returns err explained when it is a statement that found
// no manifest schema p.schema, or no table or function of it (3F000,
// 42P01, 42883 naming the schema): it wraps backfilltype.ErrSchemaMissing
// (which errors.Is reports as backfilltype.ErrSchemaBehind too). Other
// errors are returned as they are.
func (p txPurpose) schemaMissing(err error) error {
	var pe *pq.Error
	if p.schema == "" || !errors.As(err, &pe) || errors.Is(err, backfilltype.ErrSchemaMissing) {
		return err
	}
	switch pe.Code {
	case "3F000", "42P01", "42883":
	default:
		return err
	}
	if !strings.Contains(pe.Message, `"`+p.schema+`"`) && !strings.Contains(pe.Message, `"`+p.schema+`.`) && !strings.Contains(pe.Message, p.schema+".") {
		return err
	}
	return fmt.Errorf("manifest schema %q is missing or incomplete (dropped, or never migrated); an administrator must create it: run backfill migrate (Manifest.Migrate): %w: %w",
		p.schema, backfilltype.ErrSchemaMissing, err)
}

// SchemaMissing returns err explained as the manifest schema's absence
// (wrapping backfilltype.ErrSchemaMissing) when it is a statement of a
// chunk's transaction that found no manifest schema schema, or no table
// or function of it; other errors as they are.
func SchemaMissing(schema string, err error) error {
	return txPurpose{schema: schema}.schemaMissing(err)
}
