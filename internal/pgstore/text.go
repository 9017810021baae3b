package pgstore

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/textcap"
)

// nulSymbol replaces NUL characters in manifest text: U+2400 SYMBOL FOR
// NULL, visibly not the character it stands for.
const nulSymbol = "\u2400"

// ManifestText returns s as a manifest stores free text: every byte
// sequence that is not valid UTF-8 replaced by U+FFFD (the Unicode
// replacement character), and every NUL character by U+2400 (SYMBOL FOR
// NULL). Text that is valid UTF-8 without NUL, the common case, is
// returned unchanged, without allocating. Manifest implementations store
// every free-text field (exception column, value and reason, errors,
// worker ids, actors, reasons) through it.
func ManifestText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\ufffd"), "\x00", nulSymbol)
}

// ManifestJSON returns b, a JSON document, as a manifest stores JSON
// (jsonb): unchanged when jsonb takes it; otherwise decoded and encoded
// again with every string and object key passed through ManifestText
// (a \u0000 escape and a NUL become U+2400, an unpaired surrogate escape
// or invalid UTF-8 U+FFFD). Text that is not JSON at all is stored as a
// JSON string of its ManifestText, so that recording never fails because
// of what a caller put in a detail.
func ManifestJSON(b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	if utf8.Valid(b) && json.Valid(b) && pgconv.JSONBReason(b) == "" {
		return b
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		out, _ := json.Marshal(ManifestText(string(b)))
		return out
	}
	out, err := json.Marshal(manifestJSONValue(v))
	if err != nil || pgconv.JSONBReason(out) != "" {
		// Not expected: a number beyond numeric's format, say.
		out, _ = json.Marshal(ManifestText(string(b)))
	}
	return out
}

// manifestJSONValue passes every string and key of v, decoded JSON,
// through ManifestText.
func manifestJSONValue(v any) any {
	switch x := v.(type) {
	case string:
		return ManifestText(x)
	case []any:
		for i := range x {
			x[i] = manifestJSONValue(x[i])
		}
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[ManifestText(k)] = manifestJSONValue(e)
		}
		return m
	}
	return v
}

// ManifestException returns e as a manifest stores it: Column, Value and
// Reason through ManifestText, Raw through ManifestJSON.
func ManifestException(e backfilltype.Exception) backfilltype.Exception {
	e.Column, e.Value, e.Reason = ManifestText(e.Column), ManifestText(e.Value), ManifestText(e.Reason)
	if len(e.Raw) > 0 {
		e.Raw = ManifestJSON(e.Raw)
	}
	return e
}

// ManifestCheckResult returns r as a manifest stores it: Check, Expected,
// Actual and each Sample entry through ManifestText, Detail through
// ManifestJSON. r's Sample is not modified.
func ManifestCheckResult(r backfilltype.CheckResult) backfilltype.CheckResult {
	r.Check, r.Expected, r.Actual = ManifestText(r.Check), ManifestText(r.Expected), ManifestText(r.Actual)
	if r.Sample != nil {
		s := make([]string, len(r.Sample))
		for i, x := range r.Sample {
			s[i] = ManifestText(x)
		}
		r.Sample = s
	}
	if len(r.Detail) > 0 {
		r.Detail = ManifestJSON(r.Detail)
	}
	return r
}

// The caps of record_event's arguments (manifest migration 25), in
// characters, as the SQL function counts them; a longer argument is
// refused with SQLSTATE 22023. The library fits its own events within
// them ([EventActor], [EventDetail]).
const (
	// MaxEventKindChars caps an event's kind.
	MaxEventKindChars = 200
	// MaxEventDetailChars caps an event's detail: the characters of its
	// jsonb text (64 KiB).
	MaxEventDetailChars = 65536
)

// FitChars returns s when it has at most n characters; otherwise its head
// and its full length (textcap.Clip) in at most n characters.
func FitChars(s string, n int) string {
	c := textcap.Clip(s, n, "")
	if over := utf8.RuneCountInString(c) - n; over > 0 {
		c = textcap.Clip(s, n-over, "")
	}
	return c
}

// EventActor returns actor as record_event takes it: ManifestText, cut to
// [MaxActorChars] characters.
func EventActor(actor string) string {
	return FitChars(ManifestText(actor), MaxActorChars)
}

// eventDetailHeadChars is how much of a detail over the cap an event
// keeps: as a JSON string, at most twice as many characters.
const eventDetailHeadChars = 16000

// EventDetail returns detail, a JSON document, as record_event takes it:
// ManifestJSON ("{}" for none) when it fits; otherwise an object
// {"detail_truncated": true, "detail_characters": N, "detail_head":
// TEXT}, the first characters of the JSON text and its full length, so
// that a long value from user data (a validation's sample, a reject, a
// signal's reason) never fails the run that records it. The jsonb text
// PostgreSQL counts has at most one space more per ':' and ',' of the
// JSON text, and escapes no more than encoding/json does, so a detail of
// at most MaxEventDetailChars/2 characters fits.
func EventDetail(detail []byte) string {
	d := string(ManifestJSON(detail))
	if d == "" {
		return "{}"
	}
	n := utf8.RuneCountInString(d)
	if n <= MaxEventDetailChars/2 {
		return d
	}
	out, _ := json.Marshal(map[string]any{
		"detail_truncated":  true,
		"detail_characters": n,
		"detail_head":       textcap.Clip(d, eventDetailHeadChars, ""),
	})
	return string(out)
}
