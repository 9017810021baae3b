package pgstore

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

// The embedded migration files are numbered 1..N without gaps, and
// pgMigrations has their N migrations, each with SQL.
func TestMigrationFiles(t *testing.T) {
	entries, err := fs.ReadDir(MigrationFiles, "migration")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("no migration files")
	}
	// ReadDir sorts by name, and the numbers are zero-padded.
	for i, e := range entries {
		v, err := MigrationVersion(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if v != i+1 {
			t.Fatalf("file %d is %s: want version %d", i+1, e.Name(), i+1)
		}
		b, err := fs.ReadFile(MigrationFiles, "migration/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "-- ") {
			t.Errorf("%s: no leading comment describing the migration", e.Name())
		}
	}
	if len(PgMigrations) != len(entries) {
		t.Fatalf("%d migrations, %d files", len(PgMigrations), len(entries))
	}
	for i, q := range PgMigrations {
		if strings.TrimSpace(q) == "" {
			t.Errorf("migration %d: no SQL", i+1)
		}
		if strings.HasPrefix(q, "--") {
			t.Errorf("migration %d: begins with its file's comment", i+1)
		}
	}
}

// readMigrations refuses a gap, a duplicate version, a bad name and a
// file without SQL; it strips the leading comment only.
func TestReadMigrations(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	got, err := ReadMigrations(fstest.MapFS{
		"m/001_a.up.sql": file("-- a\n-- b\n\nSELECT 1;\n-- kept\n"),
		"m/002_b.up.sql": file("-- c\nSELECT 2;"),
		"m/010_c.up.sql": file("SELECT 10;"),
		"m/003_d.up.sql": file("SELECT 3;"), "m/004_e.up.sql": file("SELECT 4;"), "m/005_f.up.sql": file("SELECT 5;"),
		"m/006_g.up.sql": file("SELECT 6;"), "m/007_h.up.sql": file("SELECT 7;"), "m/008_i.up.sql": file("SELECT 8;"),
		"m/009_j.up.sql": file("SELECT 9;"),
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 || got[0] != "\nSELECT 1;\n-- kept\n" || got[1] != "SELECT 2;" || got[9] != "SELECT 10;" {
		t.Fatalf("got %q", got)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"gap":       {"m/001_a.up.sql": file("SELECT 1;"), "m/003_c.up.sql": file("SELECT 3;")},
		"duplicate": {"m/001_a.up.sql": file("SELECT 1;"), "m/1_b.up.sql": file("SELECT 1;")},
		"zero":      {"m/000_a.up.sql": file("SELECT 0;")},
		"name":      {"m/001_a.sql": file("SELECT 1;")},
		"empty":     {"m/001_a.up.sql": file("-- only a comment\n\n")},
	} {
		if got, err := ReadMigrations(fsys, "m"); err == nil {
			t.Errorf("%s: no error, got %q", name, got)
		}
	}
}
