package main

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/spf13/cobra"
)

// exceptionsResult is what exceptions prints with --json.
type exceptionsResult struct {
	BatchID int64  `json:"batch_id"`
	Job     string `json:"job"`
	// Total counts the exceptions that match the filters, before --limit.
	Total      int64          `json:"total"`
	Exceptions []exceptionRow `json:"exceptions"`
}

// exceptionRow is one row of the exception queue.
type exceptionRow struct {
	ChunkID string `json:"chunk_id" db:"chunk_id"`
	// Row is the 1-based row number within the chunk, in extraction order.
	Row    int64  `json:"row" db:"row_number"`
	Reason string `json:"reason" db:"reason"`
	Column string `json:"column" db:"column_name"`
	Value  string `json:"value" db:"value"`
	// Raw is the row as the extractor gave it, as JSON (null if none).
	Raw       json.RawMessage `json:"raw" db:"-"`
	RawText   sql.NullString  `json:"-" db:"raw_text"`
	CreatedAt time.Time       `json:"created_at" db:"created_at"`
}

// exceptionsCSVHeader is the header line of exceptions --csv.
var exceptionsCSVHeader = []string{"batch_id", "chunk_id", "row", "reason", "column", "value", "raw", "created_at"}

func newExceptionsCmd(g *globals) *cobra.Command {
	var (
		sel                   selection
		reason, column, chunk string
		limit                 int
		asCSV                 bool
	)
	cmd := &cobra.Command{
		Use:   "exceptions [JOB | --job NAME | --batch N]",
		Short: "List a run's exception queue: the rows not loaded, with the reason and the raw row",
		Long: `exceptions lists the exception queue of one run: the rows that were not
loaded, in chunk order and row order within the chunk, each with its chunk,
row number (1-based, in extraction order), reason, offending column and
value, and the raw row as the extractor gave it (JSON). The queue holds
the rows of committed chunk attempts only (not the evidence of attempts
that a failed quality gate rolled back).

Filters: --reason TEXT (reasons containing TEXT, case-insensitive),
--column NAME (exactly), --chunk ID (exactly), --limit N (default 100;
0 for all).

Output: a table (each text cut to one line and a few dozen characters),
or --csv: RFC 4180, a header line (batch_id, chunk_id, row, reason,
column, value, raw, created_at), then one record per exception with the
raw row as JSON text; every field is quoted, quotes doubled. The CSV is
safe to open in a spreadsheet (OWASP's defence against CSV injection): a
field that begins with =, +, -, @, a tab or a carriage return is written
with a single quote (') before it, so that no cell is read as a formula.
A value such as -5 is therefore written '-5: the exception queue keeps
values as text, and telling a number from a formula such as -2+3 is what
the rule must not guess. --json gives every value exactly as stored.

With --json: {"batch_id", "job", "total", "exceptions": [{"chunk_id",
"row", "reason", "column", "value", "raw", "created_at"}]}, total
counting the matches before --limit.`,
		Example: `  backfill exceptions --job flights --reason "outside chunk"
  backfill exceptions --batch 12 --column fare --limit 0 --csv > fares.csv`,
		Args: sel.args("exceptions"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asCSV && g.json {
				return fmt.Errorf("%w: --csv and --json are exclusive", errUsage)
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, run, err := sel.open(ctx, g)
			if err != nil {
				return err
			}
			defer db.Close()
			s := pq.QuoteIdentifier(m.Schema())
			where := ` FROM ` + s + `.exceptions e JOIN ` + s + `.chunks c ON c.batch_id = e.batch_id AND c.chunk_id = e.chunk_id
				WHERE e.batch_id = $1 AND e.failed_attempt IS NULL
				AND ($2 = '' OR strpos(lower(e.reason), lower($2)) > 0) AND ($3 = '' OR e.column_name = $3) AND ($4 = '' OR e.chunk_id = $4)`
			res := exceptionsResult{BatchID: run.BatchID, Job: run.Job, Exceptions: []exceptionRow{}}
			err = readTx(ctx, db, func(tx *sqlxTx) error {
				if err := tx.GetContext(ctx, &res.Total, `SELECT count(*)`+where, run.BatchID, reason, column, chunk); err != nil {
					return err
				}
				return tx.SelectContext(ctx, &res.Exceptions, `SELECT e.chunk_id, e.row_number, e.reason, e.column_name, e.value, e.raw::text AS raw_text, e.created_at`+
					where+` ORDER BY c.seq, e.row_number, e.id LIMIT nullif($5, 0)`, run.BatchID, reason, column, chunk, limit)
			})
			if err != nil {
				return fmt.Errorf("exceptions of batch %d: %w", run.BatchID, err)
			}
			for i := range res.Exceptions {
				e := &res.Exceptions[i]
				e.CreatedAt = utcTime(e.CreatedAt)
				if e.RawText.Valid {
					e.Raw = json.RawMessage(e.RawText.String)
				} else {
					e.Raw = json.RawMessage("null")
				}
			}
			switch {
			case g.json:
				return g.printJSON(res)
			case asCSV:
				w := bufio.NewWriter(g.raw)
				writeCSVRecord(w, exceptionsCSVHeader)
				for _, e := range res.Exceptions {
					raw := ""
					if e.RawText.Valid {
						raw = e.RawText.String
					}
					writeCSVRecord(w, []string{strconv.FormatInt(run.BatchID, 10), e.ChunkID, strconv.FormatInt(e.Row, 10), e.Reason, e.Column, e.Value, raw,
						e.CreatedAt.UTC().Format(time.RFC3339Nano)})
				}
				return w.Flush()
			}
			fmt.Fprintf(g.out, "batch %d of job %q: %s%s\n", run.BatchID, run.Job, plural(res.Total, "exception"), exceptionFilters(reason, column, chunk))
			if len(res.Exceptions) == 0 {
				return nil
			}
			t := newTable(g.out, "CHUNK", "ROW", "REASON", "COLUMN", "VALUE", "RAW")
			for _, e := range res.Exceptions {
				t.row(e.ChunkID, thousands(e.Row), clip(e.Reason, 60), orDash(e.Column), clip(e.Value, 30), clip(string(e.Raw), 80))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if int64(len(res.Exceptions)) < res.Total {
				_, err := fmt.Fprintf(g.out, "(%s of %s shown: --limit %d; --limit 0 shows all, --csv or --json the whole raw rows)\n",
					thousands(int64(len(res.Exceptions))), thousands(res.Total), limit)
				return err
			}
			return nil
		},
	}
	sel.flags(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&reason, "reason", "", "only exceptions whose reason contains this text (case-insensitive)")
	f.StringVar(&column, "column", "", "only exceptions of this column")
	f.StringVar(&chunk, "chunk", "", "only exceptions of this chunk ID (see \"backfill chunks\")")
	f.IntVar(&limit, "limit", 100, "at most this many exceptions, in chunk and row order (0: all)")
	f.BoolVar(&asCSV, "csv", false, "print CSV (RFC 4180) with a header line")
	return cmd
}

// exceptionFilters describes the filters of exceptions.
func exceptionFilters(reason, column, chunk string) string {
	s := ""
	if reason != "" {
		s += fmt.Sprintf(" with a reason containing %q", reason)
	}
	if column != "" {
		s += fmt.Sprintf(" in column %q", column)
	}
	if chunk != "" {
		s += fmt.Sprintf(" of chunk %q", chunk)
	}
	return s
}

// writeCSVRecord writes fields as one CSV record (RFC 4180, "\n" ending
// the record) that a spreadsheet opens without running anything, as
// OWASP recommends against CSV injection: every field is quoted, its
// quotes doubled, and a field that begins with a character a spreadsheet
// reads as the start of a formula ([csvFormulaStart]) gets a single quote
// before it. The errors are the writer's, reported by its Flush.
func writeCSVRecord(w *bufio.Writer, fields []string) {
	for i, f := range fields {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteByte('"')
		if f != "" && strings.ContainsRune(csvFormulaStart, rune(f[0])) {
			w.WriteByte('\'')
		}
		w.WriteString(strings.ReplaceAll(f, `"`, `""`))
		w.WriteByte('"')
	}
	w.WriteByte('\n')
}

// csvFormulaStart are the first characters that make a spreadsheet read
// a cell as a formula (OWASP, CSV injection): =, +, -, @, tab and
// carriage return.
const csvFormulaStart = "=+-@\t\r"
