package pgconv

import (
	"strings"
)

// NumericText returns the text PostgreSQL prints for the value it stores
// when it reads s, numeric input text, into a numeric column of
// precision p and scale sc (p 0: unconstrained): one text per stored
// value, so that two inputs give the same text exactly when they are
// stored alike. The scale is part of the stored value: '1.5' prints 1.5,
// '1.50' 1.50 and '15e-1' 1.5 in an unconstrained column (the scale of
// input is its digits after the point less its exponent, at least 0);
// numeric(p,sc) rounds half away from zero to sc digits and prints them
// all. Zero has no sign; NaN, Infinity and -Infinity in any spelling
// PostgreSQL reads print as those words. ok is false for text that is
// not numeric input (Convert rejects it before).
func NumericText(s string, p, sc int) (text string, ok bool) {
	t := strings.Trim(s, Space)
	switch strings.ToLower(t) {
	case "nan", "+nan", "-nan":
		return "NaN", true
	case "infinity", "+infinity", "inf", "+inf":
		return "Infinity", true
	case "-infinity", "-inf":
		return "-Infinity", true
	}
	d, ok := parseDecimal(t)
	if !ok {
		return "", false
	}
	neg := strings.HasPrefix(t, "-")
	// The digits with the point after the first point digits, at least
	// one digit before it.
	digits := d.int + d.frac
	point := int64(len(d.int)) + d.exp
	if point <= 0 {
		digits = strings.Repeat("0", int(1-point)) + digits
		point = 1
	}
	if point > int64(len(digits)) {
		digits += strings.Repeat("0", int(point)-len(digits))
	}
	scale := int64(len(d.frac)) - d.exp // the input's scale
	if scale < 0 {
		scale = 0
	}
	if p > 0 {
		scale = int64(sc)
	}
	// Keep the digits down to 10^-scale, rounding half away from zero by
	// the next one; a leading 0 takes a carry.
	digits, point = "0"+digits, point+1
	keep := point + scale
	var kept []byte
	switch {
	case keep < 0:
	case keep >= int64(len(digits)):
		kept = []byte(digits + strings.Repeat("0", int(keep)-len(digits)))
	default:
		kept = []byte(digits[:keep])
		if digits[keep] >= '5' {
			for i := len(kept) - 1; i >= 0; i-- {
				if kept[i] < '9' {
					kept[i]++
					break
				}
				kept[i] = '0'
			}
		}
	}
	// kept counts units of 10^-scale.
	frac := ""
	if scale > 0 {
		if int64(len(kept)) <= scale {
			kept = append([]byte(strings.Repeat("0", int(scale)-len(kept)+1)), kept...)
		}
		frac = string(kept[int64(len(kept))-scale:])
		kept = kept[:int64(len(kept))-scale]
	} else if scale < 0 {
		if len(kept) > 0 {
			kept = append(kept, strings.Repeat("0", int(-scale))...)
		}
	}
	whole := strings.TrimLeft(string(kept), "0")
	if whole == "" {
		whole = "0"
	}
	if neg && strings.Trim(whole+frac, "0") != "" {
		whole = "-" + whole
	}
	if frac != "" {
		return whole + "." + frac, true
	}
	return whole, true
}
