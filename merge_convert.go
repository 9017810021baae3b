package backfill

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// convertValue checks that v can be stored in col and returns it in the
// form staged by COPY. A non-empty reason means the row must be rejected;
// it names what is wrong with the value (the caller adds chunk, row and
// column). Columns of unknown type (BaseType "") pass values through,
// except that NULL keys and text with NUL bytes or invalid UTF-8 are
// always rejected.
func convertValue(col Column, v any) (any, string) {
	if v == nil {
		switch {
		case col.Key:
			return nil, "missing key column: NULL business key value"
		case col.NotNull:
			return nil, "null value in NOT NULL column"
		}
		return nil, ""
	}
	// Dereference common pointer and Valid-wrapper shapes.
	switch x := v.(type) {
	case *string:
		if x == nil {
			return convertValue(col, nil)
		}
		v = *x
	case *int64:
		if x == nil {
			return convertValue(col, nil)
		}
		v = *x
	case *float64:
		if x == nil {
			return convertValue(col, nil)
		}
		v = *x
	case *time.Time:
		if x == nil {
			return convertValue(col, nil)
		}
		v = *x
	case *bool:
		if x == nil {
			return convertValue(col, nil)
		}
		v = *x
	}
	switch col.BaseType {
	case "int2":
		return toInt(v, math.MinInt16, math.MaxInt16, "smallint")
	case "int4":
		return toInt(v, math.MinInt32, math.MaxInt32, "integer")
	case "int8":
		return toInt(v, math.MinInt64, math.MaxInt64, "bigint")
	case "float4", "float8":
		f, reason := toFloat(v)
		if reason != "" {
			return nil, reason
		}
		if col.BaseType == "float4" && !math.IsInf(f, 0) && !math.IsNaN(f) && math.Abs(f) > math.MaxFloat32 {
			return nil, "out of range for type real"
		}
		return f, ""
	case "numeric":
		return toNumeric(v, col)
	case "bool":
		switch x := v.(type) {
		case bool:
			return x, ""
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				return nil, "invalid boolean"
			}
			return b, ""
		}
		return nil, wrongType(v, "boolean")
	case "text", "varchar", "bpchar", "name", "citext":
		s, reason := toText(v)
		if reason != "" {
			return nil, reason
		}
		if col.MaxLen > 0 && utf8.RuneCountInString(strings.TrimRight(s, " ")) > col.MaxLen {
			return nil, fmt.Sprintf("value too long for type %s (%d characters)", col.Type, utf8.RuneCountInString(s))
		}
		return s, ""
	case "date":
		switch x := v.(type) {
		case time.Time:
			if x.Year() < 1 || x.Year() > 9999 {
				return nil, "date out of supported range (years 1-9999)"
			}
			return x.Format("2006-01-02"), ""
		case string:
			if _, err := time.Parse("2006-01-02", x); err != nil {
				return nil, "invalid date, want YYYY-MM-DD"
			}
			return x, ""
		}
		return nil, wrongType(v, "date")
	case "timestamp":
		switch x := v.(type) {
		case time.Time:
			// The wall clock of x, in its own location: a timestamp without
			// time zone never depends on the session's TimeZone.
			if x.Year() < 1 || x.Year() > 9999 {
				return nil, "timestamp out of supported range (years 1-9999)"
			}
			return truncMicro(x).Format("2006-01-02 15:04:05.999999"), ""
		case string:
			for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999", "2006-01-02"} {
				if t, err := time.Parse(layout, x); err == nil {
					return truncMicro(t).Format("2006-01-02 15:04:05.999999"), ""
				}
			}
			return nil, "invalid timestamp, want YYYY-MM-DD HH:MM:SS[.ffffff] without zone"
		}
		return nil, wrongType(v, "timestamp")
	case "timestamptz":
		switch x := v.(type) {
		case time.Time:
			if x.Year() < 1 || x.Year() > 9999 {
				return nil, "timestamp out of supported range (years 1-9999)"
			}
			// In UTC, so that equal instants have equal text.
			return truncMicro(x).UTC().Format(time.RFC3339Nano), ""
		case string:
			t, err := time.Parse(time.RFC3339Nano, x)
			if err != nil {
				return nil, "invalid timestamptz, want RFC 3339 with a zone offset (a value without offset would be read in the session's TimeZone)"
			}
			return truncMicro(t).UTC().Format(time.RFC3339Nano), ""
		}
		return nil, wrongType(v, "timestamp with time zone")
	case "uuid":
		switch x := v.(type) {
		case [16]byte:
			h := hex.EncodeToString(x[:])
			return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], ""
		case string:
			if !uuidRE.MatchString(x) {
				return nil, "invalid uuid"
			}
			// Canonical form, so that equal UUIDs have equal text.
			h := strings.ToLower(strings.ReplaceAll(x, "-", ""))
			return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], ""
		}
		return nil, wrongType(v, "uuid")
	case "json", "jsonb":
		var b []byte
		switch x := v.(type) {
		case json.RawMessage:
			b = x
		case []byte:
			b = x
		case string:
			b = []byte(x)
		default:
			var err error
			if b, err = json.Marshal(x); err != nil {
				return nil, "cannot encode as json: " + err.Error()
			}
		}
		if !json.Valid(b) {
			return nil, "invalid json"
		}
		if col.BaseType == "jsonb" && strings.Contains(string(b), `\u0000`) {
			return nil, `jsonb cannot store \u0000`
		}
		return string(b), ""
	case "bytea":
		switch x := v.(type) {
		case []byte:
			return x, ""
		case string:
			return []byte(x), ""
		}
		return nil, wrongType(v, "bytea")
	}
	// Unknown type: pass through, but never send text PostgreSQL cannot store.
	switch x := v.(type) {
	case string, []byte:
		s, reason := toText(x)
		if reason != "" {
			return nil, reason
		}
		return s, ""
	}
	return v, ""
}

// truncMicro truncates t to whole microseconds, PostgreSQL's precision
// (PostgreSQL docs, 8.5 "Date/Time Types"). The rule is truncation, toward
// the past, never rounding: a value just below a chunk's end stays in that
// chunk, and the chunk check and the stored value agree. Nanosecond
// sources are normalised this way; coarser sources (milliseconds,
// seconds) are exact.
func truncMicro(t time.Time) time.Time {
	return t.Truncate(time.Microsecond)
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

func wrongType(v any, want string) string {
	return fmt.Sprintf("wrong type %T for %s column", v, want)
}

func toText(v any) (string, string) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	case fmt.Stringer:
		s = x.String()
	default:
		return "", wrongType(v, "text")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "", "text contains a NUL byte"
	}
	if !utf8.ValidString(s) {
		return "", "text is not valid UTF-8"
	}
	return s, ""
}

func toInt(v any, lo, hi int64, name string) (any, string) {
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, "out of range for type " + name
		}
		n = int64(x)
	case uint64:
		if x > math.MaxInt64 {
			return nil, "out of range for type " + name
		}
		n = int64(x)
	case float32, float64:
		f, _ := toFloat(x)
		if f != math.Trunc(f) || math.IsInf(f, 0) || math.IsNaN(f) || f < -9.223372036854775e18 || f > 9.223372036854775e18 {
			return nil, "not an integer or out of range for type " + name
		}
		n = int64(f)
	case string:
		p, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return nil, "invalid input syntax for type " + name
		}
		n = p
	case json.Number:
		p, err := x.Int64()
		if err != nil {
			return nil, "invalid input syntax for type " + name
		}
		n = p
	default:
		return nil, wrongType(v, name)
	}
	if n < lo || n > hi {
		return nil, "out of range for type " + name
	}
	return n, ""
}

func toFloat(v any) (float64, string) {
	switch x := v.(type) {
	case float64:
		return x, ""
	case float32:
		return float64(x), ""
	case int:
		return float64(x), ""
	case int32:
		return float64(x), ""
	case int64:
		return float64(x), ""
	case string:
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return 0, "invalid input syntax for type double precision"
		}
		return f, ""
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return 0, "invalid input syntax for type double precision"
		}
		return f, ""
	}
	return 0, wrongType(v, "floating-point")
}

// toNumeric validates v for a numeric column (precision 0 means
// unconstrained), including the check that would otherwise fail the COPY
// ("numeric field overflow"): rounded to scale, the absolute value must be
// below 10^(precision-scale). Plain decimals are checked by one byte scan;
// exponent notation and values whose rounding might carry into another
// integer digit fall back to math/big.
func toNumeric(v any, col Column) (any, string) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = string(x)
	case float64:
		if math.IsNaN(x) {
			return "NaN", ""
		}
		if math.IsInf(x, 0) {
			return nil, "infinity is not accepted for numeric columns"
		}
		s = strconv.FormatFloat(x, 'f', -1, 64)
	case float32:
		return toNumeric(float64(x), col)
	case int64:
		s = strconv.FormatInt(x, 10)
	case int:
		s = strconv.Itoa(x)
	case int8, int16, int32, uint8, uint16, uint32, uint, uint64:
		s = fmt.Sprint(x)
	default:
		return nil, wrongType(v, "numeric")
	}
	if s == "NaN" {
		return s, ""
	}
	intDigits, fracDigits, plain, ok := scanDecimal(s)
	if !ok {
		return nil, "invalid input syntax for type numeric"
	}
	if col.Precision == 0 {
		return s, ""
	}
	p, sc := col.Precision, col.Scale
	if plain && (fracDigits <= sc && intDigits <= p-sc || intDigits+1 <= p-sc) {
		return s, ""
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, "invalid input syntax for type numeric"
	}
	limit := new(big.Rat).SetFrac(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(p-sc, 0))), nil), big.NewInt(1))
	if p-sc < 0 {
		limit.SetFrac(big.NewInt(1), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(sc-p)), nil))
	}
	rounded := new(big.Rat)
	if sc >= 0 {
		rounded.SetString(r.FloatString(sc))
	} else {
		scale := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-sc)), nil))
		q := new(big.Rat).Quo(r, scale)
		rounded.SetString(q.FloatString(0))
		rounded.Mul(rounded, scale)
	}
	if rounded.Abs(rounded).Cmp(limit) >= 0 {
		return nil, fmt.Sprintf("numeric field overflow for %s", col.Type)
	}
	return s, ""
}

// scanDecimal checks s as PostgreSQL numeric input: [+-]digits[.digits]
// or [+-].digits, optionally with an exponent. It returns the number of
// significant integer digits (leading zeros skipped), of fraction digits,
// and whether s had no exponent.
func scanDecimal(s string) (intDigits, fracDigits int, plain, ok bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	leading := true
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		digits++
		if leading && s[i] == '0' {
			continue
		}
		leading = false
		intDigits++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			digits++
			fracDigits++
		}
	}
	if digits == 0 {
		return 0, 0, false, false
	}
	if i == len(s) {
		return intDigits, fracDigits, true, true
	}
	if s[i] != 'e' && s[i] != 'E' {
		return 0, 0, false, false
	}
	i++
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	exp := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		exp++
	}
	return intDigits, fracDigits, false, exp > 0 && i == len(s)
}

// displayValue renders v for an exception's value column: text that
// PostgreSQL can store (NUL bytes and invalid UTF-8 are escaped), at most
// 1000 bytes.
func displayValue(v any) string {
	var s string
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		s = x
	case []byte:
		s = string(x)
	case time.Time:
		s = x.Format(time.RFC3339Nano)
	default:
		s = fmt.Sprint(x)
	}
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		s = strconv.QuoteToASCII(s)
	}
	if len(s) > 1000 {
		s = s[:1000]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}

// rawJSON renders a rejected row for the exception queue as jsonb-safe
// JSON: an object of column to value when names are given, else raw
// itself. Values that JSON or jsonb cannot hold are stored as escaped text.
func rawJSON(names []string, values []any, raw any) json.RawMessage {
	var obj any = raw
	if names != nil {
		m := make(map[string]any, len(values))
		for i, v := range values {
			k := fmt.Sprintf("$%d", i+1)
			if i < len(names) {
				k = names[i]
			}
			m[k] = jsonSafe(v)
		}
		obj = m
	} else {
		obj = jsonSafe(raw)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		b, _ = json.Marshal(displayValue(fmt.Sprint(raw)))
	}
	if strings.Contains(string(b), `\u0000`) {
		b, _ = json.Marshal(strings.ReplaceAll(string(b), `\u0000`, `\\u0000`))
	}
	return b
}

func jsonSafe(v any) any {
	switch x := v.(type) {
	case string:
		if strings.IndexByte(x, 0) >= 0 || !utf8.ValidString(x) {
			return strconv.QuoteToASCII(x)
		}
		return x
	case []byte:
		return jsonSafe(string(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
	case float32:
		return jsonSafe(float64(x))
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = jsonSafe(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = jsonSafe(e)
		}
		return s
	}
	return v
}
