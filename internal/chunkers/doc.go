// Package chunkers holds the built-in chunkers behind backfill.Hours,
// Days, Months, Every, IntRange and List: deterministic, half-open chunks
// that tile their scope, each with a stable ID derived from its bounds,
// streamed in order ([backfilltype.ChunkStreamer]) so that a plan of a
// million chunks needs no slice of them, and looked up by ID on resume.
// Calendar boundaries are placed in the scope's location, across DST
// changes, by internal/calendar.
package chunkers
