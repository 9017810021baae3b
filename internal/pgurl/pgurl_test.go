package pgurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
)

// TestCheck: URLs of the postgres schemes and key=value pairs pass;
// a mistyped scheme, an empty string and a bare word are refused, the
// scheme named, the password never repeated.
func TestCheck(t *testing.T) {
	for _, ok := range []string{"postgres://u:p@h/db?sslmode=disable", "postgresql://h/db", "host=h dbname=d sslmode=disable", "dbname=x"} {
		if err := Check(ok); err != nil {
			t.Errorf("Check(%q) = %v, want nil", ok, err)
		}
	}
	for dsn, want := range map[string]string{
		"postgress://u:secret@h/db?sslmode=disable": `scheme "postgress" (a typo?)`,
		"POSTGRES://u:secret@h/db":                  `scheme "POSTGRES"`,
		"mysql://u:secret@h/db":                     `scheme "mysql": use postgres://`,
		"":                                          "empty connection string",
		"  ":                                        "empty connection string",
		"secret":                                    "neither a postgres:// URL nor key=value pairs",
		" postgres://u:secret@h/db":                 "leading or trailing spaces",
	} {
		err := Check(dsn)
		if err == nil {
			t.Errorf("Check(%q) = nil, want an error", dsn)
			continue
		}
		if !contains(err.Error(), want) || contains(err.Error(), "secret") {
			t.Errorf("Check(%q) = %v, want it to say %q and not repeat the password", dsn, err, want)
		}
	}
}

// TestHint: a server without SSL is told to be asked with sslmode=disable;
// the cause stays reachable.
func TestHint(t *testing.T) {
	err := Hint(fmt.Errorf("manifest init: %w", pq.ErrSSLNotSupported))
	if !errors.Is(err, pq.ErrSSLNotSupported) || !contains(err.Error(), "sslmode=disable") {
		t.Errorf("Hint = %v", err)
	}
	other := errors.New("other")
	if Hint(other) != other || Hint(nil) != nil {
		t.Error("Hint changed an error without a hint")
	}
}

// TestHintMistypedScheme: lib/pq's error for a string it cannot parse
// names the scheme and says what to use, without repeating the string
// (its password); the cause stays reachable.
func TestHintMistypedScheme(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgress://u:s3cret@h/db":   `scheme "postgress" (a typo?): use postgres:// or postgresql://`,
		"mysql://u:s3cret@h/db":       `scheme "mysql": use postgres:// or postgresql://`,
		" postgres://u:s3cret@h/db":   "leading or trailing spaces",
		"u:s3cret@h/db":               "neither a postgres:// URL nor key=value pairs",
		`postgress://u:s3"c\ret@h/db`: `scheme "postgress"`,
	} {
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			t.Fatal(err)
		}
		cause := db.Ping()
		_ = db.Close()
		if cause == nil {
			t.Fatalf("%q: no error", dsn)
		}
		err = Hint(fmt.Errorf("backfill: manifest init: %w", cause))
		if !contains(err.Error(), want) || contains(err.Error(), "s3") || !errors.Is(err, cause) || !contains(err.Error(), "backfill: manifest init: missing") {
			t.Errorf("%q: Hint = %v", dsn, err)
		}
	}
}

// TestOpenRefusesBeforeConnecting: Open never dials for a refused string.
func TestOpenRefusesBeforeConnecting(t *testing.T) {
	if _, err := Open(context.Background(), "postgress://u@h/db?sslmode=disable"); err == nil || !contains(err.Error(), "postgress") {
		t.Errorf("Open = %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
