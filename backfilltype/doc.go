// Package backfilltype holds the data types that cross the layers of
// backfill: chunks, plans, runs, counts, exceptions, targets, validation
// results and the sentinel errors. It is a leaf: it imports no other
// package of this module, so the engine (package backfill), the store
// contracts (package backfilldriver), the PostgreSQL store and the fakes
// (package backfilltest) can all share these types without import
// cycles, in the manner of river's rivertype.
//
// Users rarely import it: package backfill declares an alias for every
// type and constant a pipeline uses (backfill.Chunk is
// backfilltype.Chunk), and the documentation there is the one to read.
// Fields and methods that only a store implementation needs are
// documented as such.
package backfilltype
