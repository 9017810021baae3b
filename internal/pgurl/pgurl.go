// Package pgurl checks the PostgreSQL connection strings the library's
// programs (the operator's command, the examples, the benchmarks) are
// given, and opens them, so that a typo never connects somewhere the user
// did not name.
//
// lib/pq reads a string as a URL only when it begins with exactly
// "postgres://" or "postgresql://"; anything else is parsed as key=value
// pairs, so that "postgress://u@db/x?sslmode=disable" is a single unknown
// key and the connection goes to libpq's defaults (localhost, the user's
// name). Check refuses such strings.
package pgurl

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// scheme matches the scheme of a URL (RFC 3986, section 3.1).
var scheme = regexp.MustCompile(`^\s*([A-Za-z][A-Za-z0-9+.-]*)://`)

// Check returns nil for a connection string lib/pq reads as the user
// meant: a postgres:// or postgresql:// URL, or libpq's key=value pairs
// ("host=db dbname=x"). It refuses an empty string (lib/pq would connect
// with its defaults) and a URL of any other scheme, naming the scheme
// seen; the string itself, which may hold a password, is not repeated.
func Check(dsn string) error {
	if strings.TrimSpace(dsn) == "" {
		return errors.New("empty connection string: refusing to fall back to libpq's defaults; give a postgres://user@host/dbname URL")
	}
	if m := scheme.FindStringSubmatch(dsn); m != nil {
		if m[1] == "postgres" || m[1] == "postgresql" {
			if strings.TrimSpace(dsn) != dsn {
				return errors.New("connection URL has leading or trailing spaces: lib/pq would not read it as a URL; remove them")
			}
			return nil
		}
		return errors.New(schemeHint(m[1]))
	}
	if !strings.Contains(dsn, "=") {
		return errors.New("connection string is neither a postgres:// URL nor key=value pairs (host=... dbname=...)")
	}
	return nil
}

// missingEquals matches lib/pq's error for a connection string that is
// neither a URL it reads nor key=value pairs; the group is the string, as
// %q quotes it.
var missingEquals = regexp.MustCompile(`missing "=" after ("(?:[^"\\]|\\.)*") in connection info string`)

// hinted is an error whose text is rewritten (the connection string
// removed, a hint added); the original stays reachable with errors.Is and
// errors.As.
type hinted struct {
	msg string
	err error
}

func (e *hinted) Error() string { return e.msg }
func (e *hinted) Unwrap() error { return e.err }

// schemeHint says that a URL of scheme, not postgres or postgresql, is
// not read as a URL, and what to use.
func schemeHint(scheme string) string {
	typo := ""
	if s := strings.ToLower(scheme); strings.HasPrefix(s, "postg") || strings.HasPrefix(s, "pg") {
		typo = " (a typo?)"
	}
	return fmt.Sprintf("connection URL has scheme %q%s: use postgres:// or postgresql:// (lib/pq reads anything else as key=value pairs and connects with libpq's defaults)", scheme, typo)
}

// Hint adds what to do to a connection error err that has one: a server
// without SSL asks for sslmode=disable (lib/pq's default is
// sslmode=require, where libpq's is prefer); a string lib/pq could not
// parse as key=value pairs (a mistyped URL scheme, "postgress://") is
// named by its scheme, and the string itself, which lib/pq repeats and
// which may hold a password, is removed from the message. Other errors
// are returned as they are.
func Hint(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if m := missingEquals.FindStringSubmatchIndex(msg); m != nil {
		dsn, qerr := strconv.Unquote(msg[m[2]:m[3]])
		if qerr != nil {
			dsn = ""
		}
		var hint string
		switch sm := scheme.FindStringSubmatch(dsn); {
		case sm == nil:
			hint = "the connection string is neither a postgres:// URL nor key=value pairs (host=... dbname=...)"
		case sm[1] == "postgres" || sm[1] == "postgresql":
			hint = "the connection URL has leading or trailing spaces, so lib/pq did not read it as a URL; remove them"
		default:
			hint = schemeHint(sm[1])
		}
		msg = msg[:m[2]] + "the connection string (not repeated: it may hold a password)" + msg[m[3]:]
		return &hinted{msg: msg + " (" + hint + ")", err: err}
	}
	if errors.Is(err, pq.ErrSSLNotSupported) || strings.Contains(err.Error(), pq.ErrSSLNotSupported.Error()) {
		return fmt.Errorf("%w (the server does not accept SSL connections: add sslmode=disable to the URL, postgres://...?sslmode=disable, or to key=value pairs)", err)
	}
	return err
}

// Open checks dsn ([Check]), opens it with lib/pq and pings the server;
// errors are given their hint ([Hint]). The caller closes the DB.
func Open(ctx context.Context, dsn string) (*sqlx.DB, error) {
	if err := Check(dsn); err != nil {
		return nil, err
	}
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		return nil, Hint(err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect: %w", Hint(err))
	}
	return db, nil
}
