package main

import (
	"fmt"

	"github.com/pgbackfill/backfill"
)

// The library's opt-ins, in one place. Every library load starts from the
// zero Config and a Job with only what a user must give (libJob); a
// variant then sets an opt-in explicitly on or off, or leaves it at the
// library's default. If the library renames one of these fields or turns
// it into a mode, the fix is here.

// optIn is a variant's setting of one opt-in: the library's default, or
// explicitly on or off.
type optIn string

const (
	optDefault optIn = ""
	optOn      optIn = "on"
	optOff     optIn = "off"
)

func parseOptIn(s string) (optIn, error) {
	switch o := optIn(s); o {
	case optDefault, optOn, optOff:
		return o, nil
	}
	return "", fmt.Errorf("bad opt-in %q: want on, off or empty (the library's default)", s)
}

func onOff(on bool) optIn {
	if on {
		return optOn
	}
	return optOff
}

// setExtractAhead applies a variant's extract-ahead setting to cfg:
// extracting ahead is the library's default, Config.SerialExtract its
// opt-out.
func setExtractAhead(cfg *backfill.Config, o optIn) {
	switch o {
	case optOn:
		cfg.SerialExtract = false
	case optOff:
		cfg.SerialExtract = true
	}
}

// setSkipUnchanged applies a variant's SkipUnchanged setting to job.
func setSkipUnchanged(job *backfill.Job, o optIn) {
	switch o {
	case optOn:
		job.SkipUnchanged, job.MergeEveryChunk = true, false
	case optOff:
		job.SkipUnchanged, job.MergeEveryChunk = false, true
	}
}

// libDefaults describes the library's effective defaults of the settings
// the variants depend on: those of the zero Config and of a Job that
// leaves them unset.
func libDefaults() string {
	var c backfill.Config
	var j backfill.Job
	return fmt.Sprintf("Config.Concurrency=0 (1), Config.SerialExtract=%t (extracts ahead unless set), Job.SkipUnchanged=%t, Job.MergeEveryChunk=%t (SkipUnchanged unset and MergeEveryChunk unset: skips unchanged chunks where the job is eligible and has a ChunkColumn)", c.SerialExtract, j.SkipUnchanged, j.MergeEveryChunk)
}

// mainVariantDoc says exactly what the main variant (the library's
// defaults) gives the library.
const mainVariantDoc = "`backfill.New(db, &backfill.Config{})` (the zero Config) and `Run` of " +
	"`Job{Name, Source, CodeVersion, Chunker: IntRange(0, rows, chunk), Extractor, Target{Table, Key, Columns}}`: " +
	"nothing else is set; the target's default lineage columns give the default rollback mechanism, the undo log"
