package pgconv

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// convertFloat4 converts v for a real column.
func convertFloat4(col *Column, v, _ any) (any, string) {
	if s, ok := v.(string); ok {
		// Rounded once, to the nearest real, as PostgreSQL reads the
		// text.
		v = float4Text(s)
	}
	f, reason := toFloat(v, "real")
	if reason != "" {
		return nil, floatReason(col, reason)
	}
	if !float4InRange(f) {
		return nil, floatReason(col, "out of range for type real")
	}
	return f, ""
}

// convertFloat8 converts v for a double precision column.
func convertFloat8(col *Column, v, _ any) (any, string) {
	f, reason := toFloat(v, "double precision")
	if reason != "" {
		return nil, floatReason(col, reason)
	}
	return f, ""
}

// floatReason names col and its range in an out-of-range reason of
// toFloat.
func floatReason(col *Column, reason string) string {
	if !strings.HasPrefix(reason, "out of range") {
		return reason
	}
	if col.BaseType == "float4" {
		return fmt.Sprintf("out of range: %s column %q holds magnitudes from about 1.4e-45 to 3.4028235e+38, 0, ±Infinity and NaN", cmp.Or(col.Type, "real"), col.Name)
	}
	return fmt.Sprintf("out of range: %s column %q holds magnitudes from about 4.9e-324 to 1.7976931348623157e+308, 0, ±Infinity and NaN", cmp.Or(col.Type, "double precision"), col.Name)
}

// float4Text reads s, text for a real column, as PostgreSQL's float4 input
// does: rounded once to the nearest float32, which the returned float64
// holds exactly. Text it cannot read, or out of range, is returned
// unchanged for toFloat to give the reason.
func float4Text(s string) any {
	t := strings.Trim(s, Space)
	f, err := strconv.ParseFloat(t, 32)
	if err != nil || f == 0 && !zeroMantissa(t) {
		return s
	}
	return f
}

// toFloat converts v to a float64; name is the column type for reasons.
// Text that is not zero but reads as zero (1e-400) is out of range, as
// PostgreSQL says.
func toFloat(v any, name string) (float64, string) {
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
	case uint64:
		return float64(x), ""
	case string:
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			if t := strings.Trim(x, Space); t != x && t != "" {
				return toFloat(t, name) // PostgreSQL skips surrounding whitespace
			}
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return 0, "out of range for type " + name
			}
			return 0, "invalid input syntax for type " + name
		}
		if f == 0 && !zeroMantissa(x) {
			return 0, "out of range for type " + name
		}
		return f, ""
	case json.Number:
		return toFloat(string(x), name)
	}
	return 0, wrongType(v, "floating-point")
}

// zeroMantissa reports whether s, text strconv.ParseFloat read as zero,
// has only zero digits before its exponent (decimal or hexadecimal).
func zeroMantissa(s string) bool {
	s = strings.TrimLeft(s, "+-")
	hexa := len(s) > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
	if hexa {
		s = s[2:]
	}
	for _, c := range []byte(s) {
		switch {
		case !hexa && (c == 'e' || c == 'E'), hexa && (c == 'p' || c == 'P'):
			return true
		case c >= '1' && c <= '9', hexa && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
			return false
		}
	}
	return true
}

// float4InRange reports whether PostgreSQL's real input takes f as lib/pq
// sends it (the shortest decimal text of the float64): its nearest
// float32 must be neither infinite for a finite f nor zero for a non-zero
// f ("out of range for type real"). Denormals are taken.
func float4InRange(f float64) bool {
	if f == 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return true
	}
	if a := math.Abs(f); a > 1e-37 && a < 3e38 {
		return true
	}
	f32, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', -1, 64), 32)
	return f32 != 0 && !math.IsInf(f32, 0)
}
