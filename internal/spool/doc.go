// Package spool holds a chunk's extracted rows between its extraction,
// which runs outside any transaction, and its transaction, which stages
// them: the row numbers and converted values of each Add, in memory up to
// [MemLimit] bytes (and while all spools of the process hold less than
// [MemBudget]), then in a temporary file, replayed in order as often
// as the chunk's staging needs. It is not safe for concurrent use.
package spool
