// Package valuedump describes a Go value as deterministic text: every
// field, exported or not, functions by their symbol name, pointers
// followed (never their address) and map entries sorted. A run records
// its validators this way, so a change of a validator's configuration,
// even in unexported fields or a function swapped for another, shows as a
// change between runs.
package valuedump
