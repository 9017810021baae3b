// Package spool holds a chunk's extracted rows between its extraction,
// which runs outside any transaction, and its transaction, which stages
// them: the row numbers and converted values of each Add, in memory up to
// its Limit (default [MemLimit]) bytes, and while all spools sharing its
// [Budget] (default: the process's, [MemBudget]) hold less than the
// budget, then in a temporary file, replayed in order as often as the
// chunk's staging needs. A Spool is not safe for concurrent use; a Budget
// is.
package spool
