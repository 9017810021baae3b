// Package copyerr reads where PostgreSQL says a COPY FROM failed: the
// line of the COPY data, the column and the value it refused (from the
// error's context), and maps those lines back to the rows that were
// staged, so that a refused value can be found again in the source rows.
package copyerr

import (
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// Reject is a value PostgreSQL refused while reading COPY data.
type Reject struct {
	// Column is the column PostgreSQL named, "" when it named none (an
	// error of a whole line).
	Column string
	// Value is the refused value's text as PostgreSQL showed it.
	Value string
	// Reason is PostgreSQL's message with its SQLSTATE.
	Reason string
	// Null: the refused value is NULL (a domain's NOT NULL).
	Null bool
	// Truncated: PostgreSQL shortened the value in its message; Value is
	// a prefix of the refused text.
	Truncated bool
}

// copyLine is the start of the context PostgreSQL gives a COPY FROM
// error: "COPY name, line N, column col: "value"" or "..., column col:
// null input" (CopyFromErrorCallback in src/backend/commands/copyfrom.c);
// the column part is absent for errors of a whole line. A value longer
// than the message allows ends in "...".
var copyLine = regexp.MustCompile(`^COPY [^,]+, line (\d+)`)

// MaxDisplay is PostgreSQL's MAX_COPY_DATA_DISPLAY
// (src/backend/commands/copyfrom.c): the bytes of a value an error's
// context shows.
const MaxDisplay = 100

// Parse reports whether err is PostgreSQL refusing a value of COPY data:
// a data exception (SQLSTATE class 22), or a domain's CHECK (23514) or
// NOT NULL (23502) constraint, raised while reading COPY data. It returns
// the line of the COPY data (1 for the first row), the column (one of
// columns, which may contain any character) and value when PostgreSQL
// names them, and the reason.
func Parse(err error, columns []string) (line int64, rej Reject, ok bool) {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return 0, rej, false
	}
	if code := string(pe.Code); !strings.HasPrefix(code, "22") && code != "23514" && code != "23502" {
		return 0, rej, false
	}
	m := copyLine.FindStringSubmatchIndex(pe.Where)
	if m == nil {
		return 0, rej, false
	}
	line, perr := strconv.ParseInt(pe.Where[m[2]:m[3]], 10, 64)
	if perr != nil || line < 1 {
		return 0, rej, false
	}
	rej.Reason = fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	rest := pe.Where[m[1]:]
	for _, c := range columns {
		switch {
		case len(c) < len(rej.Column):
		case strings.HasPrefix(rest, ", column "+c+`: "`) && strings.HasSuffix(rest, `"`):
			rej.Column, rej.Null = c, false
			rej.Value = rest[len(", column "+c+`: "`) : len(rest)-1]
		case rest == ", column "+c+": null input":
			rej.Column, rej.Value, rej.Null = c, "", true
		}
	}
	// PostgreSQL shortens a value longer than 100 bytes to its first 100
	// bytes, cut back to a whole character (at most 3 bytes less), and
	// appends "..." (limit_printout_length, MAX_COPY_DATA_DISPLAY); a
	// shorter value that ends in "..." is the value itself.
	if p := len(rej.Value) - len("..."); strings.HasSuffix(rej.Value, "...") && p >= MaxDisplay-3 && p <= MaxDisplay {
		rej.Value, rej.Truncated = rej.Value[:p], true
	}
	return line, rej, true
}

// Matches reports whether v, the value a row's column would be staged
// as, is the value PostgreSQL refused: its text as lib/pq sends it in COPY
// data (or NULL), equal to the value PostgreSQL named, or starting with it
// when PostgreSQL shortened it.
func (r Reject) Matches(v any) bool {
	if v == nil || r.Null {
		return v == nil && r.Null
	}
	text, ok := Text(v)
	if !ok {
		return false
	}
	if r.Truncated {
		return strings.HasPrefix(text, r.Value)
	}
	return text == r.Value
}

// Text returns the text lib/pq's COPY encoding sends for v, a converted
// value (encode.go, appendEncodedText), before COPY's escapes; false for
// a type lib/pq encodes otherwise.
func Text(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	case []byte:
		return `\x` + hex.EncodeToString(v), true
	case time.Time:
		return string(pq.FormatTimestamp(v)), true
	}
	return "", false
}

// Lines maps the lines of a COPY's data to the rows they came from: runs
// of consecutive rows, a new run after each row that was not staged. The
// zero value is empty and ready to use.
type Lines struct {
	runs    []struct{ line, row int64 }
	line    int64
	lastRow int64
}

// Add records that row was staged as the next line.
func (l *Lines) Add(row int64) {
	l.line++
	if len(l.runs) == 0 || row != l.lastRow+1 {
		l.runs = append(l.runs, struct{ line, row int64 }{l.line, row})
	}
	l.lastRow = row
}

// Row returns the row staged as line, or 0 when no such line was staged.
func (l *Lines) Row(line int64) int64 {
	if line < 1 || line > l.line {
		return 0
	}
	for i := len(l.runs) - 1; i >= 0; i-- {
		if r := l.runs[i]; r.line <= line {
			return r.row + (line - r.line)
		}
	}
	return 0
}
