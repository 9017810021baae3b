package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/internal/textcap"
)

// table writes aligned columns for people.
type table struct{ w *tabwriter.Writer }

// newTable starts a table on out with the column headers.
func newTable(out io.Writer, headers ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)}
	t.row(headers...)
	return t
}

// row writes one row; tabs and newlines in cells are replaced so that
// each row stays one line.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = oneLine(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

// flush writes the table out.
func (t *table) flush() error { return t.w.Flush() }

// oneLine replaces tabs, carriage returns and newlines by spaces.
func oneLine(s string) string {
	return strings.NewReplacer("\t", " ", "\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// clip is s on one line, cut to its first n characters when longer and
// then followed by its full length: "abc … (52,428,800 characters)"
// (--json shows the whole text).
func clip(s string, n int) string {
	return oneLine(textcap.Clip(s, n, ""))
}

// thousands formats n with thousands separators: 1234567 -> "1,234,567".
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// utc formats t in UTC to the second, "-" for none.
func utc(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// human formats d for people: "850ms", "12.3s", "4m05s", "2h07m",
// "3d04h"; "-" for a negative duration.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// span is the human duration from start to end (to now when end is
// nil), "-" without a start.
func span(start, end *time.Time, now time.Time) string {
	if start == nil || start.IsZero() {
		return "-"
	}
	if end != nil {
		return human(end.Sub(*start))
	}
	return human(now.Sub(*start))
}

// seconds is d in seconds for JSON, nil for none.
func seconds(start, end *time.Time) *float64 {
	if start == nil || end == nil {
		return nil
	}
	s := end.Sub(*start).Seconds()
	return &s
}

// utcTime is t in UTC (JSON prints times in UTC, as the tables do).
func utcTime(t time.Time) time.Time { return t.UTC() }

// utcPtr is *t in UTC, nil for nil.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// plural is "n thing" or "n things", n with thousands separators.
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return thousands(n) + " " + thing + "s"
}

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneOf refuses a value of flag that is not among allowed ("" passes).
func oneOf(flag, value string, allowed []string) error {
	if value == "" {
		return nil
	}
	for _, a := range allowed {
		if value == a {
			return nil
		}
	}
	return fmt.Errorf("%w: --%s %q: want one of %s", errUsage, flag, value, strings.Join(allowed, ", "))
}

// checkLimit refuses a negative --limit.
func checkLimit(n int) error {
	if n < 0 {
		return fmt.Errorf("%w: --limit %d: want 0 (no limit) or more", errUsage, n)
	}
	return nil
}

// secondsDuration is s seconds as a duration.
func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// visible returns s with its control characters (C0 but tab and, when
// keepNewlines, newline; DEL; C1) written as \xNN or \uNNNN, so that
// text from the data (a job name, an exception's reason or value) cannot
// move the cursor, retitle the terminal or clear the screen.
func visible(s string, keepNewlines bool) string {
	clean := true
	for _, r := range s {
		if unicode.IsControl(r) && r != '\t' && !(keepNewlines && r == '\n') {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			// Not UTF-8 (or a rune cut by the writer's chunks): as it is.
			b.WriteByte(s[i])
		case r == '\t', keepNewlines && r == '\n', !unicode.IsControl(r):
			b.WriteString(s[i : i+size])
		case r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
		i += size
	}
	return b.String()
}

// visibleWriter writes through visible (newlines kept).
type visibleWriter struct{ w io.Writer }

func (v visibleWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(v.w, visible(string(p), true)); err != nil {
		return 0, err
	}
	return len(p), nil
}
