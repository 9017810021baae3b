package backfilltype

import (
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// Normalizer is one named step of a [KeyRule]: a pure function from text
// to text. Its Name is part of the plan fingerprint, so changing the rules
// of a job is a plan change.
type Normalizer struct {
	// Name identifies the step in plans and error messages.
	Name string
	// Fn transforms the text. It must be deterministic.
	Fn func(string) string
}

// Built-in normalizers. Compose them in a [KeyRule]; they apply in order.
var (
	// Trim removes leading and trailing Unicode white space.
	Trim = Normalizer{Name: "trim", Fn: strings.TrimSpace}
	// CollapseSpace replaces every run of Unicode white space with one
	// ASCII space (it does not trim).
	CollapseSpace = Normalizer{Name: "collapse_space", Fn: collapseSpace}
	// CaseFold applies Unicode full case folding (golang.org/x/text/cases,
	// Unicode Standard section 3.13), so that "STRASSE", "straße" and
	// "Strasse" all fold to "strasse".
	CaseFold = Normalizer{Name: "case_fold", Fn: func(s string) string { return cases.Fold().String(s) }}
	// NFC puts text in Unicode Normalization Form C (UAX #15), so that
	// precomposed and decomposed accents compare equal.
	NFC = Normalizer{Name: "nfc", Fn: norm.NFC.String}
	// NFKC puts text in Normalization Form KC: also folds compatibility
	// characters (full-width digits, ligatures).
	NFKC = Normalizer{Name: "nfkc", Fn: norm.NFKC.String}
	// RemovePunctuation deletes Unicode punctuation characters.
	RemovePunctuation = Normalizer{Name: "remove_punctuation", Fn: func(s string) string {
		return strings.Map(func(r rune) rune {
			if unicode.IsPunct(r) {
				return -1
			}
			return r
		}, s)
	}}
)

func collapseSpace(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		b.WriteRune(r)
	}
	return b.String()
}

// Derive applies the rule to v, a source value. It returns the derived key
// and a non-empty reason when the row must be rejected (NULL without
// NullAsEmpty, a value that is not text, or a key that normalises to "").
func (k KeyRule) Derive(v any) (string, string) {
	var s string
	switch x := v.(type) {
	case nil:
		if !k.NullAsEmpty {
			return "", fmt.Sprintf("missing key column: NULL in %q, the source of derived key %q", k.From, k.Column)
		}
	case string:
		s = x
	default:
		return "", fmt.Sprintf("wrong type %T for the text source of derived key %q", v, k.Column)
	}
	for _, n := range k.Rules {
		s = n.Fn(s)
	}
	if s == "" && !k.NullAsEmpty {
		return "", fmt.Sprintf("derived key %q is empty after %s", k.Column, k.describeRules())
	}
	return s, ""
}

func (k KeyRule) describeRules() string {
	names := make([]string, len(k.Rules))
	for i, n := range k.Rules {
		names[i] = n.Name
	}
	if len(names) == 0 {
		return "no rules"
	}
	return strings.Join(names, ", ")
}

// String describes the rule for plans: "key_col <- trim,nfc(source_col)".
func (k KeyRule) String() string {
	null := ""
	if k.NullAsEmpty {
		null = " null_as_empty"
	}
	return fmt.Sprintf("%s <- %s(%s)%s", k.Column, strings.ReplaceAll(k.describeRules(), ", ", ","), k.From, null)
}
