package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestDatabaseURLRefusesEmpty: an empty DATABASE_URL is refused with a
// message naming the variable, never passed on to libpq's defaults.
func TestDatabaseURLRefusesEmpty(t *testing.T) {
	for _, v := range []string{"", "  "} {
		t.Setenv("DATABASE_URL", v)
		url, err := DatabaseURL("make demo starts a server")
		if err == nil || url != "" {
			t.Fatalf("DATABASE_URL=%q: got %q, %v; want an error", v, url, err)
		}
		if !strings.Contains(err.Error(), "DATABASE_URL") || !strings.Contains(err.Error(), "make demo") {
			t.Errorf("error %q does not name the variable and the hint", err)
		}
	}
	t.Setenv("DATABASE_URL", "postgres://db.example/x")
	if url, err := DatabaseURL(""); err != nil || url != "postgres://db.example/x" {
		t.Errorf("got %q, %v", url, err)
	}
}

// TestDatabaseURLRefusesAMistypedScheme: a URL lib/pq would not read as a
// URL (and connect with libpq's defaults instead) is refused, naming the
// scheme.
func TestDatabaseURLRefusesAMistypedScheme(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgress://u@db.example/x?sslmode=disable")
	url, err := DatabaseURL("")
	if err == nil || url != "" || !strings.Contains(err.Error(), `scheme "postgress"`) {
		t.Errorf("got %q, %v; want an error naming the scheme", url, err)
	}
}

// TestResumeCommandsQuoteTheJob: the resume commands of a paused or
// cancelled run can be pasted whatever the job's name.
func TestResumeCommandsQuoteTheJob(t *testing.T) {
	got := resumeCommands("it's a job")
	for _, want := range []string{
		`resume --job "it's a job" --why '<why>'`,
		`-c "SELECT backfill.resume('it''s a job', '<you>', '<why>')"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("%s\ndoes not contain %s", got, want)
		}
	}
}

// TestExitCodes: a usage error (a bad DATABASE_URL, a bad argument) exits
// 2, as the operator's command does; any other failure exits 1.
func TestExitCodes(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgress://u:pw@h/db")
	_, err := DatabaseURL("hint")
	if ExitCode(err) != ExitUsage {
		t.Errorf("bad URL: exit %d (%v)", ExitCode(err), err)
	}
	t.Setenv("DATABASE_URL", "")
	_, err = DatabaseURL("hint")
	if ExitCode(fmt.Errorf("wrapped: %w", err)) != ExitUsage {
		t.Errorf("empty URL: exit %d (%v)", ExitCode(err), err)
	}
	if ExitCode(errors.New("the load failed")) != ExitError {
		t.Error("a failure is not exit 1")
	}
}
