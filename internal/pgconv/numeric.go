package pgconv

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

func convertNumeric(col *Column, v, _ any) (any, string) {
	return toNumeric(v, col)
}

// toNumeric validates v for a numeric column (precision 0 means
// unconstrained), including the checks that would otherwise fail the COPY
// (see numericReason). NaN is stored in any numeric column, ±Infinity
// (PostgreSQL 14 and later) in an unconstrained one: as float64 values or
// as the text PostgreSQL reads (NaN, Infinity, inf, any case, signed).
func toNumeric(v any, col *Column) (any, string) {
	s, ok := numericText(v)
	if !ok {
		return nil, wrongType(v, "numeric")
	}
	reason := numericReason(s, col.Precision, col.Scale)
	if reason == errNumericSyntax {
		if val, reason, done := numericSpecial(s, col); done {
			return val, reason
		}
	}
	switch reason {
	case "":
	case errNumericFieldOverflow:
		return nil, fmt.Sprintf("numeric field overflow: %s column %q holds at most %s in absolute value", cmp.Or(col.Type, "numeric"), col.Name, numericMax(col.Precision, col.Scale))
	case errNumericFormat:
		return nil, fmt.Sprintf("value overflows numeric format: %s column %q holds at most %d digits before the decimal point and %d after", cmp.Or(col.Type, "numeric"), col.Name, numericMaxExp10+1, numericMaxDscale)
	default:
		return nil, reason
	}
	if _, ok := v.(string); ok {
		return v, "" // the string as it came, without boxing it again
	}
	return s, ""
}

// numericText returns v as numeric input text: text as it is, numbers
// in decimal, a float's NaN and infinities as PostgreSQL's words for
// them. false for a Go type numeric does not take.
func numericText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case float64:
		switch {
		case math.IsNaN(x):
			return "NaN", true
		case math.IsInf(x, 1):
			return "Infinity", true
		case math.IsInf(x, -1):
			return "-Infinity", true
		}
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case float32:
		return numericText(float64(x))
	case int64:
		return strconv.FormatInt(x, 10), true
	case int:
		return strconv.Itoa(x), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case int8, int16, int32, uint8, uint16, uint32, uint:
		return fmt.Sprint(x), true
	}
	return "", false
}

// numericSpecial is the slow path of toNumeric for text s that is not a
// plain decimal: NaN and the infinities (any case, signed), and text
// with surrounding whitespace. done is false for text that is none of
// them.
func numericSpecial(s string, col *Column) (val any, reason string, done bool) {
	t := strings.Trim(s, Space)
	switch strings.ToLower(t) {
	case "nan":
		return "NaN", "", true
	case "infinity", "+infinity", "inf", "+inf":
		val, reason = numericInfinity(col, "Infinity")
		return val, reason, true
	case "-infinity", "-inf":
		val, reason = numericInfinity(col, "-Infinity")
		return val, reason, true
	}
	if t != s && t != "" {
		val, reason = toNumeric(t, col)
		return val, reason, true
	}
	return nil, "", false
}

// numericInfinity returns inf ("Infinity" or "-Infinity") for col, or
// why col cannot hold it: a numeric(p,s) column holds finite values only.
func numericInfinity(col *Column, inf string) (any, string) {
	if col.Precision != 0 {
		return nil, fmt.Sprintf("numeric field overflow: %s column %q cannot hold %s; it holds at most %s in absolute value (only an unconstrained numeric holds infinities)",
			cmp.Or(col.Type, "numeric"), col.Name, inf, numericMax(col.Precision, col.Scale))
	}
	return inf, ""
}

// numericMax is the largest value of numeric(p,s), in decimal: p nines,
// s of them after the point (s may be negative, or greater than p).
func numericMax(p, s int) string {
	nines := strings.Repeat("9", p)
	switch {
	case s <= 0:
		return nines + strings.Repeat("0", -s)
	case s >= p:
		return "0." + strings.Repeat("0", s-p) + nines
	}
	return nines[:p-s] + "." + nines[p-s:]
}

// Limits of PostgreSQL's numeric format (src/backend/utils/adt/numeric.c,
// PostgreSQL 15): at most 16383 digits after the point (dscale), a first
// significant digit at most at 10^131071 (weight 32767 in base 10000
// digits), and an exponent in input below INT_MAX/2 in absolute value.
const (
	numericMaxDscale   = 16383
	numericMaxExp10    = 131071
	numericMaxExponent = math.MaxInt32 / 2
)

const (
	errNumericSyntax        = "invalid input syntax for type numeric"
	errNumericFormat        = "value overflows numeric format"
	errNumericFieldOverflow = "numeric field overflow"
)

// numericReason checks s as PostgreSQL 15's numeric input reads it into
// numeric(p,s) (p 0: unconstrained): the syntax of decimalText; the
// format's limits, checked before the type modifier (1e-20000 overflows
// numeric(10,2) although it would round to 0.00); then, rounded half away
// from zero to the scale, the absolute value must be below 10^(p-s)
// ("numeric field overflow"). Plain decimals short enough are checked by
// the scan alone.
func numericReason(s string, p, sc int) string {
	d, ok := parseDecimal(s)
	if !ok {
		return errNumericSyntax
	}
	if d.plainFits(p, sc) {
		return ""
	}
	if d.exp >= numericMaxExponent || d.exp <= -numericMaxExponent || int64(len(d.frac))-d.exp > numericMaxDscale {
		return errNumericFormat
	}
	sig, e10 := d.significant()
	switch {
	case sig == "":
		return "" // zero
	case e10 > numericMaxExp10:
		return errNumericFormat
	case p == 0:
		return ""
	}
	// Round to scale: keep the significant digits at 10^-sc and above.
	keep := e10 + int64(sc) + 1
	if keep <= 0 {
		// 0, or 10^-sc when rounded up: within any precision.
		return ""
	}
	if keep < int64(len(sig)) && sig[keep] >= '5' && strings.Trim(sig[:keep], "9") == "" {
		e10++ // 99.96 rounds to 100.0
	}
	if e10 >= int64(p-sc) {
		return errNumericFieldOverflow
	}
	return ""
}

// plainFits reports whether d is a plain decimal (no exponent) that the
// scan alone shows numeric(p,s) takes (p 0: unconstrained): short enough
// for the format, and, with its fraction within the scale or its integer
// part a digit short of the limit, within the precision.
func (d decimalText) plainFits(p, sc int) bool {
	if !d.plain || len(d.frac) > numericMaxDscale {
		return false
	}
	intDigits := len(strings.TrimLeft(d.int, "0"))
	if p == 0 {
		return intDigits <= numericMaxExp10+1
	}
	return len(d.frac) <= sc && intDigits <= p-sc || intDigits+1 <= p-sc
}

// decimalText is numeric input text: [+-]digits[.digits] or [+-].digits,
// optionally with an exponent [eE][+-]digits.
type decimalText struct {
	int, frac string // the digits before and after the point
	exp       int64  // the exponent, saturated beyond ±2^40
	plain     bool   // no exponent
}

// parseDecimal splits s as decimalText.
func parseDecimal(s string) (d decimalText, ok bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := func() string {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return s[start:i]
	}
	d.int = digits()
	if i < len(s) && s[i] == '.' {
		i++
		d.frac = digits()
	}
	switch {
	case d.int == "" && d.frac == "":
		return d, false
	case i == len(s):
		d.plain = true
		return d, true
	case s[i] != 'e' && s[i] != 'E':
		return d, false
	}
	d.exp, ok = parseExponent(s[i+1:])
	return d, ok
}

// parseExponent reads an exponent's [+-]digits, saturated beyond ±2^40.
func parseExponent(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" {
		return 0, false
	}
	var exp int64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		if exp < 1<<40 {
			exp = exp*10 + int64(c-'0')
		}
	}
	if neg {
		exp = -exp
	}
	return exp, true
}

// significant returns d's digits from the first non-zero one, and the
// power of ten of that digit; "" for zero.
func (d decimalText) significant() (string, int64) {
	if i := strings.IndexFunc(d.int, func(r rune) bool { return r != '0' }); i >= 0 {
		return d.int[i:] + d.frac, int64(len(d.int)-1-i) + d.exp
	}
	if i := strings.IndexFunc(d.frac, func(r rune) bool { return r != '0' }); i >= 0 {
		return d.frac[i:], int64(-1-i) + d.exp
	}
	return "", 0
}
