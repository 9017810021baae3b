// Package rawvalue renders any Go value a rejected row holds, within
// limits: as JSON that jsonb takes (JSON), for an exception's raw row, and
// as bounded text (Display), for its value. Cycles, deep nesting and huge
// values are cut and marked, never followed.
package rawvalue

import "slices"

// Rejected rows keep what the extractor passed, whatever it is: a value
// that contains itself (a map holding itself, a slice holding itself, a
// pointer cycle), a value nested deeper than jsonb takes, or a huge one.
// Both renderings, jsonSafe for the exception's raw jsonb and boundedText
// for its value text, walk values with limits, so that no value can
// exhaust the stack or the memory of the process.
const (
	// maxRawDepth is how deep jsonSafe and boundedText follow nested maps,
	// slices, arrays, structs and pointers; deeper parts are replaced by
	// the marker "<too deep>".
	maxRawDepth = 32
	// maxRawNodes is how many values jsonSafe keeps for one rejected
	// value; the rest are replaced by the marker "<truncated>".
	maxRawNodes = 20_000
	// maxRawString is the most bytes of one string jsonSafe keeps (the
	// whole row's JSON is capped at MaxJSON afterwards).
	maxRawString = 1 << 20
)

// Markers that replace the parts of a value that are not stored.
const (
	markCycle     = "<cycle>"
	markTooDeep   = "<too deep>"
	markTruncated = "<truncated>"
)

// rawWalk carries the limits of one jsonSafe or boundedText call: the
// values left to visit and the maps and slices on the path from the root
// (for cycles).
type rawWalk struct {
	nodes int
	path  []uintptr
}

// enter reports whether a map or slice whose data starts at p may be
// entered: it is not on the path already. The caller calls leave after.
func (w *rawWalk) enter(p uintptr) bool {
	if p != 0 && slices.Contains(w.path, p) {
		return false
	}
	w.path = append(w.path, p)
	return true
}

func (w *rawWalk) leave() { w.path = w.path[:len(w.path)-1] }
