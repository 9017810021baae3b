// Package backfilldriver holds the contracts between the backfill engine
// and a store: the [Manifest] (the durable ledger of runs, chunks,
// exceptions and validations), the [Merger] and [Stager] (staging and
// merging one chunk by business key), the [Validator], and the optional
// capabilities that grow them (undo log, persistent staging, waits,
// gates, rollback). The engine looks the capabilities up once, when a
// Runner is built, and refuses a job that needs one its store lacks
// before any work.
//
// It is for implementers. Pipelines use the aliases in package backfill
// (backfill.Manifest, backfill.Merger, backfill.Validator) and the two
// implementations this module ships: the PostgreSQL store, built by
// backfill.New, and the in-memory fakes of package backfilltest, which
// pass the same conformance suites (backfilltest.TestManifest,
// backfilltest.TestMerger).
//
// The optional capabilities are not stable API: methods may be added to
// them between minor versions, as river does with riverdriver. Implement
// them only together with the conformance suites.
package backfilldriver
