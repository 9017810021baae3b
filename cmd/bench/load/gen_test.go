package main

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestGenRowIsAPureFunctionOfTheID(t *testing.T) {
	a, b := make([]any, len(allColumns)), make([]any, len(allColumns))
	var buf []byte
	// Generate 7 first, then 0..1000: row 7 must not depend on what was
	// generated before it.
	buf = genRow(7, a, buf)
	want := append([]any(nil), a...)
	keys := map[[3]any]bool{}
	for id := int64(0); id < 1000; id++ {
		buf = genRow(id, b, buf)
		if id == 7 {
			for i := range want {
				if want[i] != b[i] {
					t.Fatalf("column %s of row 7: %v, then %v", allColumns[i], want[i], b[i])
				}
			}
		}
		k := [3]any{b[0], b[1], b[2]}
		if keys[k] {
			t.Fatalf("row %d repeats key %v", id, k)
		}
		keys[k] = true
		if s := b[3].(string); utf8.RuneCountInString(s) > 20 {
			t.Fatalf("row %d: product_code %q longer than varchar(20)", id, s)
		}
		price := b[6].(string)
		whole, frac, ok := strings.Cut(price, ".")
		if !ok || len(frac) != 2 || len(whole) > 10 {
			t.Fatalf("row %d: unit_price %q does not fit numeric(12,2)", id, price)
		}
		if ts := b[7].(time.Time); ts.Nanosecond()%1000 != 0 || ts.Location() != time.UTC {
			t.Fatalf("row %d: ordered_at %v is not a UTC microsecond", id, ts)
		}
	}
}

func TestWithParams(t *testing.T) {
	u, err := withParams("postgres://u@h:5432/db?sslmode=disable", map[string]string{"application_name": "a b"})
	if err != nil || u != "postgres://u@h:5432/db?application_name=a+b&sslmode=disable" {
		t.Fatalf("url form: %q, %v", u, err)
	}
	u, err = withParams("host=/tmp dbname=x", map[string]string{"options": "-c a=b"})
	if err != nil || u != "host=/tmp dbname=x options='-c a=b'" {
		t.Fatalf("key=value form: %q, %v", u, err)
	}
	d, err := withDatabase("postgres://u@h/postgres?sslmode=disable", "benchload_1")
	if err != nil || d != "postgres://u@h/benchload_1?sslmode=disable" {
		t.Fatalf("withDatabase: %q, %v", d, err)
	}
}
