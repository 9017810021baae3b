package backfill_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

func TestNormalizers(t *testing.T) {
	t.Parallel()
	rule := backfill.KeyRule{Column: "k", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CollapseSpace, backfill.NFC, backfill.CaseFold}}
	cases := map[string]string{
		"  Zoë   Müller ":          "zoë müller",
		"Zoe\u0308 Mu\u0308ller":   "zoë müller", // decomposed accents compose under NFC
		"STRASSE":                  "strasse",
		"Straße":                   "strasse", // full case folding
		"a\t\n b":                  "a b",
		"ÅNGSTRÖM\u00a0\u2003UNIT": "ångström unit", // no-break and em spaces collapse
	}
	for in, want := range cases {
		got, reason := rule.Derive(in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, "%q", in)
	}
	_, reason := rule.Derive(nil)
	require.Contains(t, reason, "missing key column")
	_, reason = rule.Derive("   ")
	require.Contains(t, reason, "is empty after trim, collapse_space, nfc, case_fold")
	_, reason = rule.Derive(42)
	require.Contains(t, reason, "wrong type int")
	opt := rule
	opt.NullAsEmpty = true
	got, reason := opt.Derive(nil)
	require.Empty(t, reason)
	require.Equal(t, "", got)
	require.Equal(t, "k <- trim,collapse_space,nfc,case_fold(name) null_as_empty", opt.String())

	p := backfill.KeyRule{Column: "k", From: "n", Rules: []backfill.Normalizer{backfill.NFKC, backfill.RemovePunctuation}}
	got, _ = p.Derive("ＡＢＣ-１２３.")
	require.Equal(t, "ABC123", got)
}
