package backfill

import "github.com/pgbackfill/backfill/backfilldriver"

// The fingerprints of replays that skip unchanged chunks
// ([Job.SkipUnchanged], replay_skip.go) on the manifest's chunk rows.

// ManifestSkips is implemented by manifests that record, with a chunk's
// checkpoint, the fingerprints a later replay compares to skip the chunk
// ([Job.SkipUnchanged]), and look them up. [PGManifest] and
// backfilltest's Manifest do. A job with SkipUnchanged needs it
// ([ErrUnsupported] otherwise, before any work).
type ManifestSkips = backfilldriver.ManifestSkips

// ChunkFingerprints are the fingerprints a load recorded for one chunk
// ([ManifestSkips]): of the chunk's converted source rows, and of its
// target rows after the merge, as opaque text ("" for none).
type ChunkFingerprints = backfilldriver.ChunkFingerprints
