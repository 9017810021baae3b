package backfill

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Replays that skip unchanged chunks (issue 15, [Job.SkipUnchanged]):
// design, and the two fingerprints it rests on. The wiring is in
// replay_skip_run.go (eligibility, the decision, the skipped chunk's
// checkpoint), manifest_skip.go (storage, [ManifestSkips]) and the run
// path (runChunk, loadChunk), which calls it.
//
// A replay (Job.NewRun over a loaded range, or a restatement in which few
// chunks changed) extracts, converts, stages and merges every chunk,
// although most write nothing: the COPY and the merge's comparison are
// about all of its cost. The extraction and conversion cannot be skipped
// (the source is only known by reading it), unless the extractor tells a
// version of the chunk's source (ChunkVersioner, replay_skip_version.go);
// staging and merge can, when two facts hold:
//
//  1. the chunk's converted source rows are the same multiset as at the
//     last successful load of the same chunk (same job, chunk ID and
//     skip key, below): chunkFingerprint, summed by
//     a fingerprintAdder between the row writer and its spool, in Go, no
//     round trip;
//  2. the chunk's target rows are a state a merge of those source rows
//     leaves as it is: targetFingerprint, the multiset hash of the
//     target rows within the chunk's ChunkColumn bounds (one scan of
//     the chunk's rows through the ChunkColumn index, no write): on a
//     heap target of their row versions' identities (table, ctid,
//     xmin: tupleHashSQL, which reads no value, so its cost does not
//     grow with the row's width), otherwise of their values
//     (validate_fingerprint.go's SQL); taken in the chunk's
//     transaction after the merge at load (targetFingerprintMerged, which
//     proves that state in the same statement, below) and again at the
//     replay (no join), after the claim (or the lease's fence), which
//     holds the chunk's row lock. A job without ChunkColumn has no
//     bounds: its chunk's target rows are those of the chunk's
//     identities, from the staging table at load
//     (targetFingerprintMerged), from the spool's keys sent as text
//     arrays at the replay (targetFingerprintKeys: unnest, one index
//     probe per row). A row of another key is left out, rightly: the
//     merge would not touch it.
//
// When both match, the merge would find every row unchanged: the chunk is
// checkpointed with read = unchanged + rejected, inserted = updated =
// deduplicated = 0, so the accounting balances. The rejected rows are the
// replay's own: the row writer converts every row as always, and its
// rejects go to the new batch's exception queue, as a merged chunk's do.
// A changed source row changes (1); a target row changed, deleted or
// added inside the bounds by anyone changes (2); either way the chunk is
// staged (the spool replayed into COPY) and merged as today. The
// comparison is probabilistic like the validation fingerprints (a
// 2^-64-class collision, and the timestamp hash weakness documented in
// validate_fingerprint.go). A skipped chunk writes nothing to the target,
// so a concurrent writer of its rows is ordered after it: the recorded
// fingerprint is the one it read, and the next replay sees the change.
//
// The choices:
//
//   - Recording (recordAfterMerge): a merged chunk records the two
//     fingerprints only when its merge took every staged row (no merge
//     rejects, no deduplication; eligibility rules out other conflict
//     policies and Version), the source fingerprint counts the staged
//     rows (no value was isolated while staging), and the statement
//     that takes the target fingerprint counts as many rows and, in the
//     same snapshot, none that lacks a staged row of its identity or
//     differs from it in a Checked column (a superset of those the merge
//     compares; a LEFT JOIN to the stager's staging table, StagingTabler:
//     without one nothing is recorded). The merge's result alone would
//     not do: it does not lock the target rows it leaves unchanged, and
//     under READ COMMITTED another session may change one and commit
//     between the merge's statement and the fingerprint's, which would
//     then record a state the merge would change (SourceWins restores
//     the source's row), and a replay of the same source would skip and
//     keep it (TestSkipUnchangedRecordsOnlyWhatAMergeLeaves). The
//     recorded state is then proven to be the chunk's rows as merged, so
//     a later merge of the same staged rows against the same target rows
//     is determined: it changes nothing. Otherwise nothing is recorded
//     (NULL) and the next replay merges. A skipped chunk records its
//     base's fingerprints again: it is the next replay's base, and the
//     pair stays proven (the replay's own fingerprint statement found the
//     target in the base's state; a change after it changes the next
//     replay's fingerprint).
//   - Eligibility (skipEligible, at plan time, before any work; a job
//     that asked for it and can never skip is refused with
//     ErrInvalidConfig naming the reason, a Runner without ManifestSkips
//     or PGMerger with ErrUnsupported): Upsert or
//     AppendOnly, SourceWins without Version, PublishPerChunk, every
//     column hashable (hashKind), validators among those proven by the
//     fingerprints (below) and CheckExceptionRate. At run time a chunk
//     read again while open, or open now, is never skipped (ChunkOpen
//     re-reads combine their counts).
//   - Validators (skipValidators): those that compare staging with the
//     target (Completeness, Aggregates, ReplayChangesNothing, Sample,
//     DuplicateKeys without AcrossTarget) pass by construction for a
//     skipped chunk (its target rows are proven the merged ones); they
//     record a passed result whose Detail says so (skipped, the base
//     batch and fingerprints) instead of running. CheckExceptionRate
//     runs on the skipped chunk's counts. ReferentialIntegrity (its
//     parent table may have changed), DuplicateKeys across the target
//     and validators of the caller's are not proven: such jobs are
//     refused.
//   - Jobs without ChunkColumn (benchload's end-to-end job among them):
//     see (2). The identities are rendered as the text COPY would send
//     (spoolKeyText); a value rendered otherwise matches no row, so the
//     count differs and the chunk merges, never a wrong skip. Their
//     delivered summary joins the same arrays.
//   - Spool, then decide: the row writer puts the rows into the spool
//     (backfill_spool.go, bounded memory) behind the fingerprintAdder:
//     runChunk spools every chunk, outside any transaction. In the
//     chunk's transaction, after the publish
//     mode's target, skipUnchanged looks the base up and compares; a
//     mismatch replays the spool into COPY (loadChunk, stage).
//   - The skip key (Plan.skipKey): what a base must share with the
//     replay besides the job and the chunk ID (which names the chunk's
//     bounds), so that its merge of the same rows is determined the same
//     way. It hashes the plan without its scope and chunk list: source,
//     code version, target table, key, written columns, mode, duplicate
//     and conflict policies, version, validity columns, derived keys,
//     hash column, lineage columns, rollback mechanism, publish mode and
//     time declarations (zone, ChunkColumn, date meaning, event,
//     modified and ingestion times), all conservatively, and the
//     declared type and collation of every target column (a widened
//     numeric(10,2) -> (10,3) stores the same source value otherwise,
//     though the rows hash alike). Not the plan fingerprint, which
//     covers the scope and every chunk ID: a replay of part of a loaded
//     range, or of a range extended by new chunks, finds the loaded
//     chunks' bases. The validators are not in it: eligibility admits
//     only those the fingerprints prove.
//   - Storage: migration 19 adds to the manifest's chunk rows the two
//     fingerprints (text: chunkFingerprint.String, and the target's rows
//     and sum), the skip key and the skipped marker, written by the
//     chunk's checkpoint statement in the chunk's transaction: a kill -9
//     loses all or none. The skip key is recorded by every checkpoint of
//     a job with the option, with or without fingerprints, so the newest
//     chunk of the key is the base, never an older one. The lookup
//     (ManifestSkips.BaseFingerprints) is one statement per chunk, in the
//     chunk's transaction, only with the option: the newest done row of
//     the same job, chunk ID and skip key in another batch whose run is
//     not rolled back (a rolled back chunk is not done). With the option
//     off a chunk's round trips are unchanged (the checkpoint statement
//     sets the columns NULL, skipped false).
//   - Visibility: the skipped marker (chunks.skipped, ChunkState.Skipped)
//     is what Report.ChunksSkipped (chunkSummary's aggregate),
//     StatusChunks.Skipped (run_progress.chunks_skipped, the view
//     replaced by migration 19 with one more column), the run report and
//     the command line count: the batch's skipped chunks, across the
//     calls and processes that worked it, a resume after a kill -9
//     included.
//   - Rollback: a skipped chunk writes no target row, no lineage and no
//     undo entry, so a rollback of the replay batch deletes nothing the
//     earlier batch wrote. It delivered every row of its bounds unchanged:
//     it records the delivered summary (rollback_delivered.go) from the
//     target rows in its bounds (owner = lineage UpdatedBy, count, least
//     and greatest identity; recordSkippedDelivered), as its merge would
//     have, so that a rollback of the earlier batch still reports them.
//     Rolling the earlier batch back changes the target rows, so the next
//     replay's (2) no longer matches: nothing skips on a rolled-back base.
//   - Cost (BenchmarkTargetFingerprint, 10,000-row chunks, shared 2-core
//     machine): the target re-check 17-20 ms, a skipped chunk's
//     extraction, conversion, fingerprints and re-check 31-61 ms, today's
//     replay of the chunk 207-228 ms. Where a skipped chunk's time goes
//     (benchload -skip -skip-profile, an unchanged replay of 1,000,000
//     rows): on the client, of its CPU, the extractor's own row
//     generation 29%, Write's conversion and checks 28%, the source
//     fingerprint 15% (encoding and SHA-256 about half each), the spool
//     5%; on the server, the target fingerprint 93% of the statements'
//     time (about 2 ms of its 5-6 ms per 10,000 rows the index scan, the
//     rest hashing), the manifest's statements the rest. BenchmarkSkipRow
//     splits a row's client cost (Write, spool, fingerprint). The row
//     encoding of version 2 (sourceEncodingVersion: varints, uvarint
//     lengths) makes benchload's order line 99 bytes instead of about
//     150, two SHA-256 blocks instead of three. The replay's fingerprint
//     statement runs without a savepoint and pinned settings when its
//     hash reads none (pinnedFingerprint): 15 round trips per skipped
//     chunk instead of 18 (TestSkippedChunkRoundTrips).
//     A merged chunk of a job with the option pays the base look-up and
//     the fingerprint it records, one more scan of its target rows joined
//     to staging (BenchmarkTargetFingerprint/merged-fingerprint: 12-13 ms
//     against the plain fingerprint's 5-7 ms; with the hash and merge
//     joins the merge leaves off, the join was a nested loop of 2.1 s).

// spoolKeys returns the identity of every row of sp (converted rows of
// info), as spoolKeyText forms, one slice per identity column.
func spoolKeys(ctx context.Context, sp *spool, info TableInfo) ([][]string, error) {
	identity := info.Identity()
	idx := make([]int, len(identity))
	for i, n := range identity {
		idx[i] = slices.IndexFunc(info.Columns, func(c Column) bool { return c.Name == n })
		if idx[i] < 0 {
			return nil, fmt.Errorf("backfill: identity column %q is not a column of %s", n, info.Target.Table)
		}
	}
	keys := make([][]string, len(identity))
	for i := range keys {
		keys[i] = make([]string, 0, sp.Len())
	}
	err := sp.replay(ctx, func(_ int64, values []any) error {
		for i, j := range idx {
			keys[i] = append(keys[i], pgstore.SpoolKeyText(info.Columns[j], values[j]))
		}
		return nil
	})
	return keys, err
}
