package pgstore

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// MigrationFiles holds the manifest's migrations, one file per version:
// migration/NNN_name.up.sql, NNN its version (from 1, without gaps).
// The file's leading "--" lines describe the migration and are not part
// of it: the migration is the text after them, byte for byte.
//
//go:embed migration/*.sql
var MigrationFiles embed.FS

// PgMigrations are the manifest's versioned migrations, in version order
// (PgMigrations[v-1] is version v); "{s}" stands for the quoted schema,
// "{schema}" for its name as a string literal. Append only: a released
// migration never changes.
var PgMigrations = mustReadMigrations(MigrationFiles, "migration")

// mustReadMigrations is ReadMigrations, panicking on an error: the
// migrations are embedded, so an error is a defect of the build.
func mustReadMigrations(fsys fs.FS, dir string) []string {
	m, err := ReadMigrations(fsys, dir)
	if err != nil {
		panic("backfill: manifest migrations: " + err.Error())
	}
	return m
}

// ReadMigrations reads the migrations of dir in fsys (its NNN_name.up.sql
// files) in version order. The versions must be 1 to the number of files.
func ReadMigrations(fsys fs.FS, dir string) ([]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	byVersion := make(map[int]string, len(entries))
	for _, e := range entries {
		v, err := MigrationVersion(e.Name())
		if err != nil {
			return nil, err
		}
		if prev, ok := byVersion[v]; ok {
			return nil, fmt.Errorf("version %d twice: %s and %s", v, prev, e.Name())
		}
		byVersion[v] = e.Name()
	}
	migrations := make([]string, len(byVersion))
	for v := 1; v <= len(byVersion); v++ {
		name, ok := byVersion[v]
		if !ok {
			return nil, fmt.Errorf("no migration %d of %d (numbering has a gap)", v, len(byVersion))
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		q := migrationText(string(b))
		if strings.TrimSpace(q) == "" {
			return nil, fmt.Errorf("%s: no SQL", name)
		}
		migrations[v-1] = q
	}
	return migrations, nil
}

// MigrationVersion is the version of migration file name
// (NNN_name.up.sql).
func MigrationVersion(name string) (int, error) {
	num, rest, ok := strings.Cut(name, "_")
	v, err := strconv.Atoi(num)
	if !ok || err != nil || v < 1 || rest == ".up.sql" || !strings.HasSuffix(rest, ".up.sql") {
		return 0, fmt.Errorf("%s: not a migration file name (NNN_name.up.sql)", name)
	}
	return v, nil
}

// migrationText is the migration of a file's text: what follows its
// leading "--" lines.
func migrationText(s string) string {
	for strings.HasPrefix(s, "--") {
		_, rest, ok := strings.Cut(s, "\n")
		if !ok {
			return ""
		}
		s = rest
	}
	return s
}
